"""``servelab route``: the issue's command (``replicas=2 model=tiny_code router=prefix_affinity``) in
front of two real ``servelab serve`` processes, driven with the ``openai`` client; a client that leaves
mid-stream, a router plugin that fails, a backend killed with SIGKILL (last: it breaks the fixture),
bad backend URLs and a port in use at start-up, and the command itself started and stopped."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest

from servelab.core.errors import ConfigError
from servelab.core.interfaces import Router
from servelab.serve.route.command import compose_route_config, main as route_main, prepare, start_in_thread

from serve_helpers import TEST_DEFAULTS, wait_until

ISSUE_COMMAND = ("replicas=2", "model=tiny_code", "router=prefix_affinity")


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=60).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def total(url: str, prefix: str) -> float:
    return sum(v for k, v in metrics(url).items() if k.startswith(prefix))


@pytest.fixture(scope="module")
def routed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("route")
    cfg, replica_overrides = compose_route_config(["--port", "0", *ISSUE_COMMAND, *TEST_DEFAULTS,
                                                   "allocator.prefix_caching=true", "route.health_interval_s=0.2",
                                                   f"route.output_dir={folder}"])
    process = start_in_thread(cfg, replica_overrides)
    yield process
    process.stop()


@pytest.fixture
def client(routed):
    return openai.OpenAI(base_url=f"{routed.url}/v1", api_key="unused", max_retries=0)


def test_the_issue_command_serves_the_openai_client_whole_and_streamed(routed, client):
    backends = [b.url for b in routed.state.pool.backends]
    assert len(backends) == 2 and all(p.proc.poll() is None for p in routed.replicas)
    assert routed.state.codec.exact  # the replicas it started: the checkpoint's own tokenizer
    whole = client.completions.create(model="tiny_code", prompt="def add(a, b):", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].text and whole.usage.completion_tokens == 6
    streamed = client.completions.create(model="tiny_code", prompt="def add(a, b):", max_tokens=6, stream=True,
                                         temperature=0, extra_body={"ignore_eos": True})
    pieces = [c.choices[0].text for c in streamed]
    assert len(pieces) >= 2 and "".join(pieces) == whole.choices[0].text  # greedy: the same tokens, in pieces
    chat = client.chat.completions.create(model="tiny_code", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=4, stream=True)
    assert [c for c in chat if c.choices and c.choices[0].finish_reason == "length"]
    assert client.models.list().data[0].id == "tiny_code"
    seen = metrics(routed.url)
    assert sum(v for k, v in seen.items() if k.startswith("servelab:route_decisions_total")) >= 3
    assert sum(v for k, v in seen.items() if k.startswith("servelab:route_requests_total")
               and 'outcome="ok"' in k) >= 3


def test_prefix_affinity_keeps_a_shared_prompt_on_one_replica(routed, client):
    prompt = "import os\nimport sys\n\ndef main(argv):\n    for name in argv:\n        print(name)\n" * 2
    hits = [total(b.url, "vllm:prefix_cache_hits_total") for b in routed.state.pool.backends]
    before = [total(routed.url, f'servelab:route_decisions_total{{backend="{b.url}"')
              for b in routed.state.pool.backends]
    for _ in range(4):
        client.completions.create(model="tiny_code", prompt=prompt, max_tokens=2)
    after = [total(routed.url, f'servelab:route_decisions_total{{backend="{b.url}"')
             for b in routed.state.pool.backends]
    assert sorted(a - b for a, b in zip(after, before)) == [0, 4]
    chosen = max(range(2), key=lambda i: after[i] - before[i])
    url = routed.state.pool.backends[chosen].url
    assert wait_until(lambda: total(url, "vllm:prefix_cache_hits_total") > hits[chosen], "prefix hits on the replica")


def test_a_client_that_leaves_mid_stream_aborts_the_request_on_its_backend(routed):
    aborted = [total(b.url, 'vllm:request_success_total{finished_reason="abort"') for b in routed.state.pool.backends]
    body = {"prompt": "def long(x):", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=routed.url, timeout=60) as http, http.stream("POST", "/v1/completions",
                                                                            json=body) as answer:
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))  # one token came through; then leave
    wait_until(lambda: sum(b.outstanding for b in routed.state.pool.backends) == 0, "the router's in-flight count")
    wait_until(lambda: sum(total(b.url, 'vllm:request_success_total{finished_reason="abort"')
                           for b in routed.state.pool.backends) == sum(aborted) + 1, "the abort on the backend")
    assert total(routed.url, 'servelab:route_requests_total{') and any(
        'outcome="cancelled"' in k for k in metrics(routed.url))


class _Raising(Router):
    name = "raising"

    def route(self, request, replicas, now):
        raise RuntimeError("no idea where to go")


class _Pinned(Router):
    """Always the replica ``context.seed`` when it can hold the request, else the first that can."""

    name = "pinned"

    def route(self, request, replicas, now):
        return next((v.index for v in replicas if v.index == self.context.seed and v.can_hold),
                    next(v.index for v in replicas if v.can_hold))


def _swap_router(routed, router: Router, name: str):
    state = routed.state
    old = state.router, state.router_name
    state.protocol.router, state.router_name = router, name
    return old


def test_a_router_plugin_that_raises_or_misplaces_gets_a_500_naming_it_and_the_router_keeps_serving(routed, client):
    from servelab.core.contexts import RouterContext

    old = _swap_router(routed, _Raising(None, RouterContext((), 0)), "raising")
    try:
        with pytest.raises(openai.InternalServerError, match="router plugin 'raising' failed.*no idea where to go"):
            client.completions.create(model="tiny_code", prompt="x = 1", max_tokens=2)
        _swap_router(routed, _Pinned(None, RouterContext((), 7)), "pinned")  # 7: not a replica; then 0 (valid)
        assert client.completions.create(model="tiny_code", prompt="x = 1", max_tokens=2).choices
        routed.state.router.route = lambda request, replicas, now: 5
        with pytest.raises(openai.InternalServerError, match="router plugin 'pinned' returned 5"):
            client.completions.create(model="tiny_code", prompt="x = 1", max_tokens=2)
    finally:
        _swap_router(routed, *old)
    assert client.completions.create(model="tiny_code", prompt="x = 1", max_tokens=2).choices
    assert metrics(routed.url)['servelab:route_router_errors_total{router="raising"}'] == 1


def test_bad_backend_urls_and_a_port_in_use_are_one_line_each(routed, tmp_path):
    for url, why in (("http://127.0.0.1:9", "is unreachable"),
                     (f"{routed.state.pool.backends[0].url}/nothing", "is not an OpenAI-compatible server")):
        cfg, _ = compose_route_config([f"route.backends=[{url}]", "model=tiny_code"])
        with pytest.raises(ConfigError, match=re.escape(url) + ".*" + why):
            prepare(cfg, [])
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port={port}: cannot listen"):
            route_main(["--port", str(port), "replicas=2", "model=tiny_code", f"route.output_dir={tmp_path}"])


def test_a_drained_backend_takes_nothing_new_finishes_its_stream_and_is_reported_drained(routed, client):
    from servelab.core.contexts import RouterContext

    backends = routed.state.pool.backends
    victim = backends[1]
    admin = httpx.Client(base_url=routed.url, timeout=60)
    assert [b["state"] for b in admin.get("/admin/backends").json()["backends"]] == ["active", "active"]
    old = _swap_router(routed, _Pinned(None, RouterContext((), 1)), "pinned")  # backend 1 whenever it can hold
    try:
        body = {"prompt": "def long(x):", "max_tokens": 200, "ignore_eos": True, "stream": True}
        with admin.stream("POST", "/v1/completions", json=body) as answer:
            lines = answer.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))  # under way on backend 1
            drained = admin.post("/admin/drain", params={"backend": victim.url + "/"})
            assert drained.status_code == 202 and drained.json()["state"] == "draining"
            assert drained.json()["in_flight"] == 1
            before = [total(routed.url, f'servelab:route_decisions_total{{backend="{b.url}",router="pinned"')
                      for b in backends]
            for i in range(3):  # the plugin sees backend 1 unable to hold anything: all go to backend 0
                assert client.completions.create(model="tiny_code", prompt=f"z = {i}", max_tokens=2).choices
            after = [total(routed.url, f'servelab:route_decisions_total{{backend="{b.url}",router="pinned"')
                     for b in backends]
            assert [a - b for a, b in zip(after, before)] == [3, 0]
            rest = "\n".join(lines)
        assert rest.rstrip().endswith("data: [DONE]") and "failed" not in rest  # it finished where it was
        done = admin.post("/admin/drain", params={"backend": "1", "wait_s": 30})
        assert done.status_code == 200 and done.json() == {**drained.json(), "state": "drained", "in_flight": 0}
        assert metrics(routed.url)[f'servelab:route_backend_draining{{backend="{victim.url}"}}'] == 1
        unknown = admin.post("/admin/drain", params={"backend": "http://nowhere:1"})
        assert unknown.status_code == 404 and "unknown backend 'http://nowhere:1'" in unknown.json()["error"]["message"]
        assert admin.post("/admin/undrain").status_code == 400
        bad = admin.post("/admin/drain", params={"backend": "1", "wait_s": "soon"})
        assert bad.status_code == 400 and bad.json()["error"]["message"].startswith("wait_s=soon: must be 0")
        assert admin.post("/admin/undrain", params={"backend": victim.url}).json()["state"] == "active"
        on_victim = f'servelab:route_decisions_total{{backend="{victim.url}",router="pinned"'
        placed = total(routed.url, on_victim)
        client.completions.create(model="tiny_code", prompt="w = 1", max_tokens=2)
        assert total(routed.url, on_victim) == placed + 1  # undrained: pinned there again
        assert metrics(routed.url)[f'servelab:route_backend_draining{{backend="{victim.url}"}}'] == 0
    finally:
        _swap_router(routed, *old)
        admin.close()


def test_a_killed_backend_fails_its_stream_clearly_and_the_rest_go_to_the_other(routed, client):
    """Last in the module: it kills a replica of the shared fixture."""
    from servelab.core.contexts import RouterContext

    victim = routed.state.pool.backends[1]
    _swap_router(routed, _Pinned(None, RouterContext((), 1)), "pinned")
    body = {"prompt": "def long(x):", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.Client(base_url=routed.url, timeout=60) as http, http.stream("POST", "/v1/completions",
                                                                            json=body) as answer:
        lines = answer.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        routed.replicas[1].kill()  # SIGKILL: no goodbye
        rest = "\n".join(lines)
    assert f"backend {victim.url} failed mid-stream" in rest and rest.rstrip().endswith("data: [DONE]")
    # pinned to the dead one: each request is retried on the other (or sent there once it is marked down)
    answers = [client.completions.create(model="tiny_code", prompt=f"y = {i}", max_tokens=2) for i in range(3)]
    assert all(a.choices[0].text is not None for a in answers)
    wait_until(lambda: metrics(routed.url)[f'servelab:route_backend_up{{backend="{victim.url}"}}'] == 0,
               "the dead backend marked down")
    assert httpx.get(f"{routed.url}/health").json()["backends_up"] == 1
    seen = metrics(routed.url)
    assert seen[f'servelab:route_backend_errors_total{{backend="{victim.url}",kind="stream"}}'] == 1
    assert seen[f'servelab:route_requests_total{{backend="{victim.url}",outcome="error"}}'] >= 1


def test_the_command_starts_its_replicas_and_stops_them_on_sigint(tmp_path):
    cmd = [sys.executable, "-c", "from servelab.cli.main import main; main()", "route", "--port", "0",
           *ISSUE_COMMAND, *TEST_DEFAULTS, f"route.output_dir={tmp_path}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = ""
    deadline = time.monotonic() + 180
    while "listening on" not in line and time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line or proc.poll() is None, "servelab route exited at start-up"
    url = re.search(r"listening on (http://[\d.]+:\d+)", line).group(1)
    backends = re.findall(r"http://127\.0\.0\.1:\d+", line.split(" - ", 1)[1])
    assert len(backends) == 2 and "router=prefix_affinity" in line
    answer = openai.OpenAI(base_url=f"{url}/v1", api_key="x").completions.create(model="tiny_code", prompt="a",
                                                                                  max_tokens=2)
    assert answer.choices
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    for b in backends:  # the replicas are gone, and wrote their results
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{b}/health", timeout=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replica0", "replica1"]
    assert all((tmp_path / f"replica{i}" / "summary.json").is_file() for i in range(2))


# ---- no servers -----------------------------------------------------------------------------------
def test_without_the_backends_tokenizer_a_router_sees_utf8_bytes_and_the_requests_fields():
    from servelab.serve.route.app import PromptCodec, request_of

    codec = PromptCodec(None)
    assert not codec.exact
    req = request_of({"prompt": "hé", "max_completion_tokens": 7, "max_tokens": 3, "user": "ann", "cache_salt": "t1"},
                     False, codec, 1.5, 16)
    assert req.prompt_token_ids == (104, 195, 169) and req.max_tokens == 7 and req.arrival_time == 1.5
    assert (req.client_id, req.cache_salt) == ("ann", "t1")
    assert request_of({"prompt": [5, 6]}, False, codec, 0.0, 16).prompt_token_ids == (5, 6)
    assert request_of({"messages": [{"role": "user", "content": "a"}]}, True, codec, 0.0, 16).max_tokens == 16


def test_draining_books_are_the_protocols_and_every_mistake_is_one_line():
    from servelab.core.contexts import RouterContext
    from servelab.core.request import Request
    from servelab.serve.route.app import PromptCodec, RouteFailure, RouteState
    from servelab.serve.route.backends import Backend, BackendPool
    from servelab.serve.route.drain import find_backend, start_draining, state_of
    from servelab.serve.route.metrics import RouteMetrics

    backends = [Backend(i, f"http://b{i}:1", "m") for i in range(2)]
    state = RouteState(BackendPool(backends, 1.0, 1.0, 1.0), _Pinned(None, RouterContext((), 0)), "pinned",
                       PromptCodec(None), RouteMetrics("pinned", [b.url for b in backends]))
    start_draining(state, ["http://b0:1/"])
    assert state.protocol.draining == {0} and state_of(state, backends[0]) == "drained"
    placed = state.choose(Request("a", (1, 2), 4), set())
    assert placed is backends[1] and state_of(state, backends[1]) == "active"  # pinned to 0, which cannot hold
    start_draining(state, ["1"])
    assert state_of(state, backends[1]) == "draining"  # one request in flight there
    with pytest.raises(RouteFailure, match="every backend that is up is draining.*http://b0:1, http://b1:1"):
        state.choose(Request("b", (1, 2), 4), set())
    state.finish(Request("a", (1, 2), 4), backends[1], "ok", 0.0)
    assert state_of(state, backends[1]) == "drained"
    with pytest.raises(ConfigError, match=r"route.draining: unknown backend 'http://b9:1': not one of "
                                          r"http://b0:1, http://b1:1 \(or their indices 0-1\)"):
        start_draining(state, ["http://b9:1"])
    assert find_backend(backends, " 0 ") is backends[0]
    assert compose_route_config(["route.draining=[0,http://x:1]"])[0].route.draining == ["0", "http://x:1"]


def test_a_backends_view_takes_vllms_gauges_and_its_own_counts():
    from servelab.core.request import Request
    from servelab.serve.route.backends import Backend

    b = Backend(1, "http://x:1", "m", max_model_len=100)
    b.read_metrics('vllm:num_requests_running{model_name="m"} 3.0\nvllm:num_requests_waiting{model_name="m"} 2.0\n'
                   'vllm:num_requests_swapped{model_name="m"} 1.0\nvllm:kv_cache_usage_perc{model_name="m"} 0.25\n'
                   'vllm:cache_config_info{block_size="32",model_name="m",num_gpu_blocks="900"} 1.0\n')
    b.place(Request("a", (1,) * 10, 20))
    long = Request("b", (1,) * 60, 50)
    b.checks_length = True  # the router counts prompts in the backends' own tokens
    view = b.view(b.can_hold(long))
    assert (view.index, view.num_running, view.num_waiting, view.kv_utilization) == (1, 3, 3, 0.25)
    assert (view.block_size, view.num_kv_blocks, view.num_outstanding, view.outstanding_tokens) == (32, 900, 1, 30)
    assert not view.can_hold  # 60 + 50 > max_model_len 100
    b.checks_length = False
    assert b.can_hold(long)  # byte counts: no length check
    b.up = False
    assert not b.can_hold(Request("c", (1,), 1))
