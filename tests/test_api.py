"""The Python API: build from overrides, add requests, step, get the CLI's result objects."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from servelab.api import LLM
from servelab.core.errors import ConfigError

SMALL = dict(model="tiny", model__hidden_size=64, model__num_hidden_layers=2, model__intermediate_size=128, logger="none",
             progress=False)


def test_step_by_hand_and_results():
    lab = LLM(["block_size=8"], **SMALL)
    a = lab.add_request([1, 2, 3, 4], max_tokens=5)
    lab.add_request(list(range(20)), max_tokens=3, id="mine")
    steps = 0
    while lab.has_unfinished():
        assert lab.step() is not None
        steps += 1
    result = lab.results()
    by_id = result.by_id()
    assert set(by_id) == {a, "mine"} and by_id[a]["output_len"] == 5 and by_id["mine"]["output_len"] == 3
    assert result.summary["num_finished"] == 2 and result.summary["leaked_blocks"] == 0 and steps >= 5


def test_run_writes_the_same_files_as_the_cli(tmp_path, capsys):
    lab = LLM(compose("workload.num_requests=4", "workload.output_len.max=8", "workload.prompt_len.max=32",
                      "model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=128"))
    result = lab.run(tmp_path)
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 4
    assert json.loads((tmp_path / "summary.json").read_text())["num_finished"] == result.summary["num_finished"] == 4
    assert capsys.readouterr().out.splitlines()[-1] == f"results: {tmp_path}/requests.jsonl, summary.json"  # as the CLI


def test_a_cluster_config_runs_as_a_cluster_and_refuses_stepping_by_hand(tmp_path):
    lab = LLM(compose("backend=sim", "model=llama3_8b", "workload.num_requests=8", "cluster.replicas=2",
                      "router=least_outstanding"))
    with pytest.raises(ConfigError) as err:
        lab.add_request([1, 2, 3], max_tokens=2)
    assert str(err.value) == ("cluster.replicas=2: LLM.add_request/step/results/generate drive one engine and a "
                              "cluster runs only as a whole: use LLM.run() (or run.py), or leave cluster.* at its "
                              "default")
    for refused in (lab.step, lab.has_unfinished, lab.results):
        with pytest.raises(ConfigError, match="^cluster.replicas=2: "):
            refused()
    summary = lab.run(tmp_path).summary
    assert summary["num_replicas"] == 2 and summary["router"] == "least_outstanding"
    assert summary["num_finished"] == 8 and all(r["num_requests"] > 0 for r in summary["per_replica"])
    lab.close()


def test_a_bad_cluster_key_fails_when_the_llm_is_built():
    with pytest.raises(ConfigError, match=r"^cluster.prefill_replicas=1 needs cluster.decode_replicas=<n>"):
        LLM(compose("backend=sim", "model=llama3_8b", "cluster.prefill_replicas=1"))


def test_seeded_sampling_does_not_depend_on_the_batch():
    outs = []
    for batch_mates in (0, 5):
        lab = LLM([], **SMALL)
        for i in range(batch_mates):
            lab.add_request([9, 8, 7, i], max_tokens=6)
        rid = lab.add_request([1, 2, 3], max_tokens=12, id="sampled", temperature=0.8, top_p=0.9, top_k=50, seed=7)
        while lab.has_unfinished():
            lab.step()
        outs.append(lab.results().by_id()[rid]["output_token_ids"])
    assert outs[0] == outs[1] and len(set(outs[0])) > 1


# ---- arrival times in step mode (issue 35 item 6) --------------------------------------------

SIM_8B = ["backend=sim", "model=llama3_8b", "hardware=h100"]


def test_step_mode_honours_arrival_times_on_the_virtual_clock():
    """Five requests 10 s apart, stepped until done: each waits for its arrival (the clock jumps
    there), so every TTFT is one short prefill step, not minus the time still to come."""
    lab = LLM(SIM_8B, logger="none", progress=False)
    for i in range(5):
        lab.add_request(list(range(1, 200)), max_tokens=32, arrival_time=10.0 * i, id=f"r{i}")
    assert lab.has_unfinished() and lab.engine.scheduler.num_unfinished() == 1  # r0 arrived; r1-r4 are held
    while lab.has_unfinished():
        lab.step()
    result = lab.results()
    assert result.summary["num_finished"] == 5
    for rec in result.requests:
        assert 0 < rec["ttft_ms"] < 100 and rec["queue_ms"] >= 0 and rec["e2e_ms"] >= rec["ttft_ms"]
    first_token = {r.id: r.token_times[0] for r in lab.engine.sequences.values()}
    assert all(first_token[f"r{i}"] >= 10.0 * i for i in range(5))


def test_step_mode_refuses_a_duplicate_id_still_to_arrive():
    lab = LLM(SIM_8B, logger="none", progress=False)
    lab.add_request([1, 2, 3], max_tokens=2, arrival_time=5.0, id="x")
    with pytest.raises(ValueError, match="duplicate request id 'x'"):
        lab.add_request([1, 2, 3], max_tokens=2, arrival_time=6.0, id="x")


def test_a_negative_latency_is_an_error_naming_the_request():
    from servelab.core.request import Request, Sequence
    from servelab.results.metrics import NegativeLatencyError, request_record

    seq = Sequence(Request("early", (1, 2, 3), 2, 10.0), arrival_s=10.0)
    seq.append_token(5, 0.2)  # a token 9.8 s before the request arrived
    with pytest.raises(NegativeLatencyError, match="'early': ttft_ms=-9800"):
        request_record(seq, 1.0, None, None)


def test_a_stack_runs_again_after_a_run_without_the_first_runs_writer(tmp_path):
    """run_job(stack=...) leaves no listener behind: the first run's writer (its file closed) is not
    told of the second run's ends."""
    from servelab.core.request import Request
    from servelab.run.session import run_job
    from servelab.assemble.stack import build_stack

    cfg = compose("backend=sim", "model=llama3_8b", "hardware=h100", logger="none", progress=False)
    stack = build_stack(cfg)
    listeners = (list(stack.engine.end_listeners), list(stack.engine.step_listeners))
    for run in ("first", "second"):
        requests = [Request(f"{run}-{i}", tuple(range(1, 30)), 4) for i in range(3)]
        assert run_job(cfg, tmp_path / run, requests, stack).summary["num_finished"] == 3
        assert (list(stack.engine.end_listeners), list(stack.engine.step_listeners)) == listeners
    assert len((tmp_path / "second" / "requests.jsonl").read_text().splitlines()) == 3
