"""``servelab serve`` driven by real clients: the official ``openai`` package (streaming and not),
raw HTTP for what a client library would never send (malformed bodies, no API key), and a mixed
load of normal, malformed and cancelled requests. One server (model=tiny_code, an API key, two
seats, a short waiting room) serves the whole module; the last test shuts it down and reads the
result files."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

openai = pytest.importorskip("openai", reason="the serve extra (pip install servelab[serve]) is not installed")
pytest.importorskip("fastapi", reason="the serve extra is not installed")

from serve_helpers import start, wait_until  # noqa: E402

KEY = "test-key-123"
MAX_WAITING = 6
PROMPT = "def parse_args(argv):\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "results"
    srv = start(out, "max_num_seqs=2", f"serve.max_waiting_requests={MAX_WAITING}", "serve.max_body_bytes=65536",
                "serve.shutdown_grace_s=5", api_key=KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120)


def _ended(server, reason: str) -> float:
    return server.metrics().get(f'vllm:request_success_total{{finished_reason="{reason}",model_name="tiny_code"}}', 0.0)


# ---- the openai client ----------------------------------------------------------------------------
def test_a_completion_has_the_engines_greedy_tokens(client):
    from servelab.api import LLM

    resp = client.completions.create(model="tiny_code", prompt=PROMPT, max_tokens=12, temperature=0,
                                     extra_body={"return_token_ids": True})
    choice = resp.choices[0]
    assert resp.object == "text_completion" and resp.model == "tiny_code"
    assert resp.usage.completion_tokens == len(choice.token_ids) <= 12
    assert resp.usage.prompt_tokens == len(PROMPT.encode()) + 1  # bytes + BOS
    with LLM(["model=tiny_code"], logger="none", progress=False) as lab:  # the same stack in this process
        lab.add_request(PROMPT, max_tokens=12, id="ref")
        while lab.has_unfinished():
            lab.step()
        ref = lab.results().by_id()["ref"]
    assert choice.token_ids == ref["output_token_ids"]
    assert choice.text == ref["output_text"]
    assert choice.finish_reason == ("length" if len(choice.token_ids) == 12 else "stop")


def test_streaming_gives_the_same_text_and_usage(client):
    whole = client.completions.create(model="tiny_code", prompt=PROMPT, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model="tiny_code", prompt=PROMPT, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_token_id_prompts_and_the_servelab_extensions(client):
    resp = client.completions.create(model="tiny_code", prompt=[256, 105, 109, 112], max_tokens=5, temperature=0.8,
                                     seed=7, extra_body={"priority": 1, "ttft_slo_ms": 5000, "tpot_slo_ms": 1000,
                                                         "ignore_eos": True, "top_k": 20,
                                                         "return_token_ids": True})
    again = client.completions.create(model="tiny_code", prompt=[256, 105, 109, 112], max_tokens=5, temperature=0.8,
                                      seed=7, extra_body={"ignore_eos": True, "top_k": 20, "return_token_ids": True})
    assert resp.choices[0].token_ids == again.choices[0].token_ids and len(again.choices[0].token_ids) == 5
    assert resp.usage.prompt_tokens == 4


def test_chat_completions_streamed_and_whole(client):
    messages = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "a loop"}]
    whole = client.chat.completions.create(model="tiny_code", messages=messages, max_tokens=10, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(model="tiny_code", messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert whole.usage.prompt_tokens > 20  # the template's role tags count


def test_a_stop_string_ends_the_request_before_it(client):
    full = client.completions.create(model="tiny_code", prompt=PROMPT, max_tokens=24, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[6:8]
    cut = full.index(stop)
    for stream in (False, True):
        resp = client.completions.create(model="tiny_code", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop],
                                         stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = list(resp)
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, reason = resp.choices[0].text, resp.choices[0].finish_reason
        assert (text, reason) == (full[:cut], "stop")


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny_code"]
    assert httpx.get(f"{server.base_url}/health").json() == {"status": "ok"}
    m = server.metrics()
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_requests_swapped",
                 "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:num_preemptions_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hit_rate",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"):
        assert f'{name}{{model_name="tiny_code"}}' in m, name
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                 "vllm:time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds",
                 "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        assert m[f'{name}_count{{model_name="tiny_code"}}'] > 0, name
    assert m['vllm:generation_tokens_total{model_name="tiny_code"}'] > 0


# ---- what a client library would not send ---------------------------------------------------------
@pytest.mark.parametrize("body, field", [
    ('{"prompt": "x", "max_tokens": "5"}', "max_tokens"),
    ('{"prompt": "x", "max_tokens": -1}', "max_tokens"),
    ('{"prompt": "x", "max_tokens": 100000}', "max_tokens"),
    ('{"prompt": [1, 2, 259]}', "prompt"),
    ('{"prompt": [-1]}', "prompt"),
    ('{"prompt": []}', "prompt"),
    ('{"prompt": ""}', "prompt"),  # an empty text is no prompt (not a BOS alone)
    ('{"prompt": "x", "temprature": 0}', "temprature"),
    ('{"prompt": "x", "temperature": "hot"}', "temperature"),
    ('{"prompt": "x", "top_p": 0}', "top_p"),
    ('{"prompt": "x", "n": 3}', "n"),
    ('{"prompt": "x", "stream_options": {"include_usage": true}}', "stream_options"),
    ('{"max_tokens": 3}', "prompt"),
    ('{"prompt": "' + "x" * 600 + '"}', "prompt"),
    ('{"prompt": "x", "priority": 1.5}', "priority"),
    ('{"prompt": "x", "ttft_slo_ms": -5}', "ttft_slo_ms"),
])
def test_bad_input_gets_400_naming_the_field(server, body, field):
    with server.client() as http:
        r = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == field and error["message"].startswith(f"{field}:"), error
        assert http.get("/health").status_code == 200


@pytest.mark.parametrize("body, what", [('{"prompt": "x",', "malformed JSON"), ("[1, 2]", "body:")])
def test_malformed_bodies_get_400(server, body, what):
    with server.client() as http:
        r = http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and what in r.json()["error"]["message"], r.text


def test_chat_messages_are_checked(server):
    with server.client() as http:
        r = http.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "hi"}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages.role", r.text
        r = http.post("/v1/chat/completions", json={"messages": []})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_the_api_key_is_required(server):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=60)
    assert r.status_code == 401 and "API key" in r.json()["error"]["message"]
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "x"}, timeout=60,
                   headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    assert httpx.get(f"{server.base_url}/health", timeout=60).status_code == 200  # health and metrics stay open


def test_a_body_over_the_limit_gets_413(server):
    with server.client() as http:
        r = http.post("/v1/completions", json={"prompt": "x" * 70_000})
    assert r.status_code == 413 and "max_body_bytes=65536" in r.json()["error"]["message"]


# ---- cancellation and load --------------------------------------------------------------------------
def test_a_client_that_disconnects_aborts_its_request(server):
    aborted = _ended(server, "abort")
    with server.client() as http:
        with http.stream("POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 480, "stream": True,
                                                          "ignore_eos": True}) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))  # it is generating
    # closing the stream dropped the connection: the engine aborts the request and frees its blocks
    wait_until(lambda: _ended(server, "abort") == aborted + 1, "the disconnected request is recorded as aborted")
    wait_until(lambda: server.metrics()['vllm:kv_cache_usage_perc{model_name="tiny_code"}'] == 0.0,
               "its KV blocks go back to the pool")


def test_mixed_load_every_accepted_request_completes_or_is_aborted(server):
    before = {r: _ended(server, r) for r in ("length", "stop", "abort")}

    async def normal(http, i):
        r = await http.post("/v1/completions", json={"prompt": f"# {i}\n", "max_tokens": 8, "temperature": 0.5,
                                                     "seed": i})
        return r.status_code

    async def malformed(http, i):
        r = await http.post("/v1/completions", content='{"prompt": [1, 2, 3], "max_tokens": -3' if i % 2 else
                            '{"prompt": "x", "seed": "abc"}', headers={"content-type": "application/json"})
        return r.status_code

    async def cancelled(http, i):
        async with http.stream("POST", "/v1/completions", json={"prompt": "import ", "max_tokens": 480,
                                                                "stream": True, "ignore_eos": True}) as r:
            if r.status_code != 200:
                return r.status_code
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    return "cancelled"  # leaving the block closes the connection mid-stream
        return "ended"

    async def run():
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers(), timeout=120) as http:
            kinds = [normal, malformed, cancelled] * 6
            return await asyncio.gather(*(kind(http, i) for i, kind in enumerate(kinds)))

    results = asyncio.run(run())
    normal_codes, malformed_codes, cancels = results[0::3], results[1::3], results[2::3]
    assert set(malformed_codes) == {400}
    assert set(normal_codes) <= {200, 503} and 200 in normal_codes, normal_codes
    assert set(cancels) <= {"cancelled", 503}, cancels
    accepted = normal_codes.count(200) + cancels.count("cancelled")

    def settled():
        ended = sum(_ended(server, r) - before[r] for r in before)
        return ended == accepted and server.metrics()['vllm:num_requests_running{model_name="tiny_code"}'] == 0

    wait_until(settled, f"all {accepted} accepted requests end (finished or aborted)")
    assert _ended(server, "abort") - before["abort"] == cancels.count("cancelled")
    assert httpx.get(f"{server.base_url}/health", timeout=60).status_code == 200


def test_a_full_waiting_room_gets_503_with_a_reason(server):
    total = 2 + MAX_WAITING + 6  # two seats, the waiting room, and more

    async def long_request(http, answered, release):
        async with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 480, "stream": True,
                                                                "ignore_eos": True}) as r:
            answered.append(r.status_code)  # a stream's status comes as soon as the engine accepted it
            if r.status_code != 200:
                return r.status_code, json.loads(await r.aread())["error"]["message"]
            await release.wait()  # hold on until every request has its answer, then leave (abort)
            return 200, ""

    async def run():
        answered, release = [], asyncio.Event()
        async with httpx.AsyncClient(base_url=server.base_url, headers=server.headers(), timeout=120) as http:
            tasks = [asyncio.create_task(long_request(http, answered, release)) for _ in range(total)]
            for _ in range(2400):
                if len(answered) == total or all(t.done() for t in tasks):
                    break
                await asyncio.sleep(0.05)
            release.set()
            return await asyncio.gather(*tasks)

    results = asyncio.run(run())
    busy = [message for code, message in results if code == 503]
    assert len(busy) >= total - 2 - MAX_WAITING and all("serve.max_waiting_requests=6" in m for m in busy), results
    wait_until(lambda: server.metrics()['vllm:num_requests_running{model_name="tiny_code"}'] == 0,
               "the held requests are aborted")


def test_shutdown_writes_results_with_nothing_leaked(server):
    m = server.metrics()
    assert server.stop() == 0, server.output()
    summary = server.summary()
    # /metrics and summary.json come from the same request records
    ttft_count = m['vllm:time_to_first_token_seconds_count{model_name="tiny_code"}']
    assert ttft_count == summary["num_finished"]
    assert m['vllm:time_to_first_token_seconds_sum{model_name="tiny_code"}'] * 1e3 / ttft_count == \
        pytest.approx(summary["ttft_ms"]["mean"], rel=1e-9)
    assert m['vllm:request_success_total{finished_reason="abort",model_name="tiny_code"}'] == summary["num_aborted"]
    assert summary["status"] == "completed" and summary["leaked_blocks"] == 0
    assert summary["num_aborted"] >= 1 and summary["num_unfinished"] == 0
    assert summary["num_finished"] + summary["num_aborted"] == summary["num_requests"]
    records = server.records()
    assert len(records) == summary["num_requests"]
    assert {r["finish_reason"] for r in records} <= {"length", "stop", "abort"}
    assert all(r["output_text"] is not None for r in records)
    assert (server.output_dir / "config.yaml").is_file()
    assert "leaked blocks 0" in server.output()
