"""End to end against published measurements (experiments/sim_fidelity_gpu/e2e.py):
published.yaml is well formed, presets.py and features.py map every entry, one small entry reproduces
in the simulator in seconds (the default and preset columns, and the per-feature ones), and the README
section matches e2e_results.json."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "experiments" / "sim_fidelity_gpu"
HARDWARE = {p.stem for p in (REPO / "conf" / "hardware").glob("*.yaml")}
MODELS = {p.stem for p in (REPO / "conf" / "model").glob("*.yaml")}
FIGURES = {"median_ttft_ms", "mean_ttft_ms", "median_tpot_ms", "median_itl_ms", "median_e2e_ms",
           "request_throughput_req_s", "output_throughput_tok_s"}


def _e2e():
    spec = importlib.util.spec_from_file_location("sim_fidelity_e2e", FOLDER / "e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def e2e():
    return _e2e()


@pytest.fixture(scope="module")
def entries(e2e):
    return e2e.load_published()["entries"]


def test_published_yaml_is_well_formed(entries):
    assert len(entries) >= 30
    ids = [e["id"] for e in entries]
    assert len(ids) == len(set(ids))
    for e in entries:
        where = e.get("id")
        for key in ("source", "engine", "hardware", "model", "tp", "dataset", "conditions", "figures", "quote"):
            assert e.get(key) not in (None, "", {}), f"{where}: {key}"
        assert str(e["source"]["url"]).startswith("https://"), where
        assert e["source"].get("title") and e["source"].get("date"), where
        assert e["engine"].get("name") and e["engine"].get("version"), where
        assert e["hardware"] in HARDWARE, where
        assert e["model"] in MODELS or (e["model"] == "hf" and (REPO / e["model_path"]).is_file()), where
        assert isinstance(e["tp"], int) and e["tp"] >= 1, where
        figures = e["figures"]
        assert figures and set(figures) <= FIGURES, where
        assert all(isinstance(v, (int, float)) and v > 0 for v in figures.values()), where
        assert set(e.get("per_gpu") or ()) <= set(figures), where
        c = e["conditions"]
        for key in ("arrival", "num_prompts", "lengths", "max_model_len", "max_num_seqs",
                    "max_num_batched_tokens", "chunked_prefill", "gpu_memory_utilization", "block_size"):
            assert key in c, f"{where}: conditions.{key}"
        assert c["arrival"] in ("poisson", "offline", "closed_loop"), where
        if c["arrival"] == "poisson":
            assert float(c["rate"]) > 0, where
        if c["arrival"] == "closed_loop":
            assert isinstance(c["concurrency"], int) and 1 <= c["concurrency"] <= c["num_prompts"], where
        assert 0 < c["gpu_memory_utilization"] <= 1, where
        lengths = c["lengths"]
        if lengths["kind"] == "per_request":
            assert len(lengths["input_lens"]) == len(lengths["output_lens"]) == c["num_prompts"], where
        elif lengths["kind"] == "fixed":
            assert lengths["input"] >= 1 and lengths["output"] >= 1, where
            assert lengths["input"] + lengths["output"] <= c["max_model_len"], where
        else:
            assert lengths["kind"] == "sharegpt_first_turn", where
    # the two setups are covered: 70B on 4 x H100 and 8B on one A100, online and offline
    # more than one engine, fixed-length and closed-loop runs, and a TTFT figure wherever a source has one
    assert len({e["engine"]["name"] for e in entries}) >= 4
    assert any(e["conditions"]["lengths"]["kind"] == "fixed" for e in entries)
    assert any(e["conditions"]["arrival"] == "closed_loop" for e in entries)
    assert not any("ttft" in k for e in entries for k in (e.get("also_reported") or {}))
    setups = {(e["model"], e["hardware"], e["tp"], e["conditions"]["arrival"]) for e in entries}
    for setup in (("llama3_70b", "h100", 4, "poisson"), ("llama3_8b", "a100_80gb", 1, "poisson"),
                  ("llama3_70b", "h100", 4, "offline"), ("llama3_8b", "a100_80gb", 1, "offline")):
        assert setup in setups, setup


def test_workloads_follow_the_published_conditions(e2e, entries):
    by_id = {e["id"]: e for e in entries}
    online = by_id["sglangpage_vllm_llama31_8b_a100_rps4"]
    reqs = e2e.workload(online, seed=1)
    assert len(reqs) == online["conditions"]["num_prompts"]
    lens = online["conditions"]["lengths"]
    assert all(lens["min_prompt"] <= p <= lens["max_prompt"] and o >= lens["min_output"]
               and p + o <= lens["max_total"] for _, p, o in reqs)
    span = reqs[-1][0] - reqs[0][0]
    assert reqs[0][0] == 0 and span == pytest.approx(len(reqs) / online["conditions"]["rate"], rel=0.15)
    assert e2e.workload(online, seed=1) == reqs  # seeded
    burst = by_id["lambda_vllm054_llama3_8b_a100_burst320"]
    reqs = e2e.workload(burst, seed=1)
    assert [p for _, p, _ in reqs] == burst["conditions"]["lengths"]["input_lens"]
    assert all(a == 0 for a, _, _ in reqs) and min(o for _, _, o in reqs) == 1


def test_one_small_entry_reproduces_under_the_default_and_its_engines_preset(e2e, entries):
    entry = next(e for e in entries if e["id"] == "sglangpage_vllm_llama31_8b_a100_rps4")
    results = e2e.run_entries([entry], seeds=(1,), max_requests=150, log=lambda *_: None)
    (r,) = results["entries"]
    assert set(r["columns"]) == {"default", "preset"} and r["preset"]["name"] == "vllm_v0"
    assert r["columns"]["default"]["engine"] == "servelab" and r["columns"]["preset"]["engine"] == "vllm_v0"
    assert {"engine=vllm_v0", "num_scheduler_steps=10"} <= set(r["columns"]["preset"]["overrides"])
    for col in ("default", "preset"):
        for name in entry["figures"]:
            m = r["columns"][col]["metrics"][name]
            assert m["simulated"] > 0 and m["error"] == pytest.approx(m["simulated"] / m["published"] - 1)
    # vLLM 0.6.0's 10-step windows hold a new prompt until the running window ends: TTFT grows
    ttft = {c: r["columns"][c]["metrics"]["median_ttft_ms"]["simulated"] for c in ("default", "preset")}
    assert ttft["preset"] > ttft["default"]
    first = r["columns"]["preset"]["first_token"]
    assert first["prompt_tokens"] > 0 and first["step_ms"] == pytest.approx(
        sum(first[f"{k}_ms"] for k in ("layers", "attention", "communication", "lm_head", "host", "swap", "copy")))
    assert {h["family"] for h in results["headline"]} == {"TTFT", "TPOT"}
    section = e2e.render_section(results)
    assert "### Headline" in section and "### The first token with one request at a time" in section


def test_an_engine_without_a_preset_is_scored_under_the_default(e2e, entries):
    entry = next(e for e in entries if e["id"] == "trtllm05_llama2_7b_a100_ttft_128")
    results = e2e.run_entries([entry], seeds=(1,), log=lambda *_: None)
    (r,) = results["entries"]
    assert r["preset"] is None and r["columns"]["preset"] is None
    head = {h["column"]: h for h in results["headline"]}
    assert head["preset"]["median_abs_error"] == head["default"]["median_abs_error"]


def test_presets_map_every_entry(entries):
    presets = _module("presets")
    for e in entries:
        got = presets.preset(e)
        name, version = e["engine"]["name"], str(e["engine"]["version"])
        if name == "vllm":
            assert got[0] == ("vllm_v1" if int(version.split(".")[1]) >= 8 else "vllm_v0"), e["id"]
        elif name == "sglang":
            assert got[0] == "sglang" and (("engine.overlap=false" in got[1]) == version.startswith("0.3")), e["id"]
        else:
            assert got is None, e["id"]
        if got and "--disable-radix-cache" in str(e["engine"]["flags"]):
            assert "allocator.prefix_caching=false" in got[1], e["id"]


def test_one_small_entry_reproduces_end_to_end(e2e, entries):
    entry = next(e for e in entries if e["id"] == "sglangpage_vllm_llama31_8b_a100_rps4")
    results = e2e.run_entries([entry], seeds=(1,), max_requests=150, log=lambda *_: None, columns=("base", "all"))
    (r,) = results["entries"]
    assert r["num_requests_simulated"] == 150 and r["run"]["num_finished"] == 150
    assert r["time_model"]["chosen"] == "op_profile"  # time_model=auto found the A100 Llama-3-8B tables
    assert set(r["columns"]) == {"base", "all"}
    assert "num_scheduler_steps=10" in r["columns"]["all"]["overrides"]  # vLLM 0.6.0 ran 10-step windows
    assert r["columns"]["base"]["overrides"] == []
    for col in ("base", "all"):
        for name in entry["figures"]:
            m = r["columns"][col]["metrics"][name]
            assert m["published"] == entry["figures"][name]
            assert m["simulated"] > 0 and math.isfinite(m["error"])
            assert m["error"] == pytest.approx(m["simulated"] / m["published"] - 1)
            assert abs(m["error"]) < 1.0  # a sanity bound, not the target
    # multi-step windows hold a new prompt until the running window ends: TTFT grows
    base, every = (r["columns"][c]["metrics"]["median_ttft_ms"]["simulated"] for c in ("base", "all"))
    assert every > base
    assert r["metrics"] is r["columns"]["base"]["metrics"]
    assert sum(r["time_share"].values()) == pytest.approx(1.0)
    assert {t["column"] for t in results["targets"]} == {"base", "all"}
    section = e2e.render_section(results)
    assert section.startswith(e2e.BEGIN) and section.rstrip().endswith(e2e.END)
    assert "Rule:" in section and "median TPOT (ms)" in section and "median TTFT (ms)" in section


def test_features_map_every_entry(entries):
    features = _module("features")
    for e in entries:
        cols = features.columns(e)
        assert list(cols) == list(features.COLUMNS), e["id"]
        assert cols["base"] == features.BASE, e["id"]
        on = [f for f in features.FEATURES if cols[f] is not None]
        assert (cols["all"] is None) == (not on), e["id"]
        for f in on:  # base plus that one feature; all carries every applicable one
            assert set(cols[f]) - set(features.BASE), (e["id"], f)
            assert set(cols[f]) - {"non_chunked_schedule=decode_first"} <= set(cols["all"]), (e["id"], f)
        flags = str(e["engine"].get("flags"))
        if e["engine"]["name"] == "vllm" and "--num-scheduler-steps 10" in flags:
            assert cols["multi_step"] == features.BASE + ["num_scheduler_steps=10"], e["id"]
        else:
            assert cols["multi_step"] is None, e["id"]
        if e["tp"] == 1 or e["engine"]["name"] not in ("vllm", "sglang"):
            assert cols["custom_all_reduce"] is None, e["id"]
        if e["engine"]["name"] in ("lmdeploy_turbomind", "tensorrt_llm"):
            assert cols["cuda_graphs"] is None and cols["frontend"] is None, e["id"]


def test_closed_loop_fixed_length_entry_runs(e2e, entries):
    entry = next(e for e in entries if e["id"] == "lmdeploy010_llama2_7b_a100_c16_128_128")
    reqs = e2e.workload(entry, seed=1)
    assert len(reqs) == entry["conditions"]["num_prompts"] and {(p, o) for _, p, o in reqs} == {(128, 128)}
    assert e2e.load_class(entry) == "moderate"
    assert "workload.concurrency=16" in e2e.overrides(entry, 1)
    results = e2e.run_entries([entry], seeds=(1,), max_requests=32, log=lambda *_: None, columns=("default",))
    (r,) = results["entries"]
    assert r["run"]["num_finished"] == 32 and r["run"]["max_concurrent_requests"] <= 16
    assert r["metrics"]["mean_ttft_ms"]["simulated"] > 0 and r["metrics"]["median_itl_ms"]["simulated"] > 0


def test_readme_section_matches_results_json(e2e):
    results = json.loads(e2e.RESULTS.read_text())
    assert len(results["entries"]) == len(e2e.load_published()["entries"])
    assert results["columns"] == ["default", "preset"]
    assert e2e.render_section(results).strip() in e2e.README.read_text()


def _module(name):
    spec = importlib.util.spec_from_file_location(f"sim_fidelity_{name}", FOLDER / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_section_is_replaced_in_place(e2e, tmp_path):
    page = tmp_path / "README.md"
    page.write_text("# t\n\n## Not yet\n\n- x\n")
    e2e.update_readme(e2e.render_section(None), page)
    once = page.read_text()
    assert once.index(e2e.BEGIN) < once.index("## Not yet")
    e2e.update_readme(e2e.render_section(None), page)
    assert page.read_text() == once
