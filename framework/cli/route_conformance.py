"""``check-plugin router=<name>``'s last stage: the router behind ``servelab route`` over two real
``model=tiny_code`` replicas (contract ``behind servelab route``).

The replicas (small: 64 KV blocks, 8 sequences) start once per process, on the first router checked,
and are reused for every later one (starting them is most of the cost); they stop when the process
exits. Per router: a router process in a thread of this one (``route.backends`` = the two replicas,
the plugin taken from the kit's registry, the kit's overrides applied), :data:`NUM_REQUESTS` requests
sent one after another (completions and chat, streamed and not, prompts sharing a prefix, two
clients), each of which must be answered, and each replica must have ended exactly the requests the
plugin placed there (its ``vllm:request_success`` count). Skipped with ``--no-real-model``
(``real_model=False``), and while an earlier stage has failed.

It lives in ``cli`` because it needs both the kit (its report) and ``serve`` (the router), which
are sibling layers that may not import each other.
"""

from __future__ import annotations

import atexit
import tempfile
import time
from pathlib import Path

import httpx

from servelab.api import compose
from servelab.kit.conformance import Failure, KitRun
from servelab.serve.route.command import start_in_thread
from servelab.serve.route.launch import ReplicaProcess, start_replicas, stop_replicas

REPLICA_OVERRIDES = ("model=tiny_code", "logger=none", "backend.num_threads=1", "num_kv_blocks=64", "max_num_seqs=8")
NUM_REQUESTS = 6
CONTRACT = "behind servelab route"
_replicas: list[ReplicaProcess] = []


def shared_replicas() -> list[ReplicaProcess]:
    """The two replicas, started on first use (and again if one has died)."""
    if len(_replicas) == 2 and all(r.proc.poll() is None for r in _replicas):
        return _replicas
    stop_replicas(_replicas, grace_s=5.0)
    _replicas.clear()
    folder = Path(tempfile.mkdtemp(prefix="servelab-check-route-"))
    _replicas.extend(start_replicas(2, list(REPLICA_OVERRIDES), folder, timeout_s=180))
    return _replicas


@atexit.register
def _stop_shared() -> None:
    stop_replicas(_replicas, grace_s=10.0)


def stage_behind_route(run: KitRun):
    """The stage (``KindSpec.checks`` names it): None, or the :class:`Failure`."""
    if not run.real_model:
        run.report.notes.append("the run behind servelab route skipped (--no-real-model)")
        return None
    if run.report.failures:
        return None
    run.report.notes.append(f"ran behind servelab route: 2 tiny_code replicas, {NUM_REQUESTS} requests")
    try:
        replicas = shared_replicas()
    except Exception as exc:  # noqa: BLE001 - the machine's fault, not the plugin's: say so
        return Failure(CONTRACT, f"could not start the two tiny_code replicas: {type(exc).__name__}: {exc}")
    urls = [r.url for r in replicas]
    cfg = compose([*REPLICA_OVERRIDES, f"router={run.name}", "route.port=0", f"route.backends=[{','.join(urls)}]",
                   *run.extra])
    try:
        routed = start_in_thread(cfg, registry=run.registry)
    except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing the backends' views
        return Failure("plugin raised", f"building router {run.name!r} behind servelab route: "
                       f"{type(exc).__name__}: {exc}")
    try:
        return _exercise(run.name, routed, urls)
    finally:
        routed.stop()


def _exercise(name: str, routed, urls: list[str]) -> Failure | None:
    state = routed.state
    placed: list[int] = []
    route = state.router.route

    def recording(request, views, now):
        choice = route(request, views, now)
        placed.append(choice)
        return choice

    state.router.route = recording
    before = [_ended(u) for u in urls]
    with httpx.Client(base_url=routed.url, timeout=120) as client:
        for i in range(NUM_REQUESTS):
            chat, stream = i % 3 == 2, i % 2 == 1
            body: dict = {"max_tokens": 4, "user": f"client{i % 2}", "stream": stream, "ignore_eos": True}
            if chat:
                body["messages"] = [{"role": "user", "content": f"def shared_prefix(x):\n    return x + {i}"}]
            else:
                body["prompt"] = f"def shared_prefix(x):\n    return x + {i}"
            path = "/v1/chat/completions" if chat else "/v1/completions"
            answer = client.post(path, json=body)
            text = answer.text
            ok = answer.status_code == 200 and (("[DONE]" in text and '"error"' not in text) if stream
                                                else bool(answer.json().get("choices")))
            if not ok:
                return Failure(CONTRACT, f"request {i} ({'chat' if chat else 'completion'}, stream={stream}) "
                               f"answered {answer.status_code}: {text[:300]}")
    chosen = [placed.count(i) for i in range(len(urls))]
    deadline = time.monotonic() + 10  # a replica counts a request when its engine ends it, maybe after the answer
    while True:
        ran = [round(_ended(u) - b) for u, b in zip(urls, before)]
        if ran == chosen or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if ran != chosen or len(placed) != NUM_REQUESTS:
        return Failure(CONTRACT, f"router {name!r} placed {chosen} requests on the two replicas, but they ran {ran}")
    return None


def _ended(url: str) -> float:
    """Requests the replica has ended (``vllm:request_success``, every finish reason)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))
