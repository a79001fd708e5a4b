"""The built-in output-length predictors (``oracle``, ``noisy_oracle``, ``learned``): the plugin
contract, where the truth comes from, determinism, one-line start-up errors through the stack,
the shipped learned predictor's held-out figures (recomputed from the cached lengths, never
regenerated), and a predictor failing at run time (named with the request; partial results)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
import time

import numpy as np
import pytest

from conftest import REPO, compose
from servelab.testing import servelab_plugin_manager
from servelab.core.errors import ConfigError
from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import (LengthPredictor, LengthPredictorError, NoConfig, PredictorContext,
                                      predict_checked)
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.core.registry import build_registry, default_registry
from servelab.core.request import Request, SamplingParams
from servelab.engine.engine import PluginFailure
from servelab.kit.testing import FakeExecutor, VirtualClock
from servelab.plugins.length_predictors.bundle import PACKAGED_PREDICTORS, META
from servelab.plugins.length_predictors.learned import LearnedConfig, LearnedPredictor
from servelab.plugins.length_predictors.noisy_oracle import NoisyOracleConfig, NoisyOraclePredictor
from servelab.plugins.length_predictors.oracle import OracleConfig, OraclePredictor
from servelab.config import register_configs
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

BUILTINS = {"none", "oracle", "noisy_oracle", "learned"}
TINY_CODE = str(PACKAGED_CHECKPOINTS / "tiny_code")
CONTEXT = PredictorContext(model_name="tiny", model_path=None, vocab_size=4096, max_model_len=512, seed=0)
CODE_CONTEXT = PredictorContext(model_name="tiny_code", model_path=TINY_CODE, vocab_size=259, max_model_len=512)
EXPERIMENT = REPO / "experiments" / "length_predictor"


def req(rid: str, prompt_len: int = 8, max_tokens: int = 32, ignore_eos: bool = True, temperature: float = 0.0):
    return Request(rid, tuple(range(1, prompt_len + 1)), max_tokens, 0.0, SamplingParams(temperature, 1.0, 0, None),
                   ignore_eos)


def write_requests_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def record(rid, output_len, finish_reason="stop", prompt_len=8, max_tokens=32):
    return {"id": rid, "prompt_len": prompt_len, "max_tokens": max_tokens, "output_len": output_len,
            "finish_reason": finish_reason, "rejected_reason": None}


# ---- the plugin contract ----------------------------------------------------------------------

def test_the_registry_finds_every_builtin_with_a_typed_config():
    registry = default_registry()
    assert BUILTINS <= set(registry.names("length_predictor"))
    fields = {name: {f.name: f.type for f in dataclasses.fields(registry.get("length_predictor", name).Config)}
              for name in BUILTINS - {"none"}}
    assert fields == {"oracle": {"lengths_from": "Optional[str]"},
                      "noisy_oracle": {"sigma": "float", "lengths_from": "Optional[str]"},
                      "learned": {"path": "Optional[str]"}}
    for name in BUILTINS:
        cls = registry.get("length_predictor", name)
        assert issubclass(cls, LengthPredictor) and cls.name == name and cls.predicts == (name != "none")


@pytest.mark.parametrize("make", [lambda: OraclePredictor(OracleConfig(), CONTEXT),
                                  lambda: NoisyOraclePredictor(NoisyOracleConfig(), CONTEXT),
                                  lambda: LearnedPredictor(LearnedConfig(), CODE_CONTEXT)],
                         ids=["oracle", "noisy_oracle", "learned"])
def test_predict_returns_a_float_at_least_zero_the_same_every_time(make):
    requests = [req(f"r{i}", 1 + 13 * i % 200, 1 + 37 * i % 300) for i in range(50)]
    first, second = make(), make()
    answers = [predict_checked(first, r) for r in requests]
    assert all(isinstance(a, float) and a >= 0 for a in answers)
    assert answers == [predict_checked(second, r) for r in reversed(requests)][::-1]


def test_the_stack_builds_each_predictor_from_overrides(fake_stack):
    stack, _ = fake_stack("scheduler=sjf", "length_predictor=noisy_oracle", "length_predictor.sigma=0.25", "seed=7")
    predictor = stack.engine.scheduler.length_predictor
    assert isinstance(predictor, NoisyOraclePredictor) and predictor.config.sigma == 0.25
    assert predictor.context.seed == 7 and predictor.context.model_name == "tiny"
    stack, _ = fake_stack("length_predictor=none")
    assert stack.engine.scheduler.length_predictor is None


# ---- oracle -----------------------------------------------------------------------------------

def test_oracle_of_a_request_that_ignores_eos_is_max_tokens_within_max_model_len():
    oracle = OraclePredictor(OracleConfig(), CONTEXT)
    assert oracle.predict(req("a", prompt_len=10, max_tokens=40)) == 40.0
    assert oracle.predict(req("b", prompt_len=500, max_tokens=40)) == 12.0  # max_model_len 512 stops it


def test_oracle_reads_lengths_from_a_requests_jsonl_or_its_run_folder(tmp_path):
    write_requests_jsonl(tmp_path / "requests.jsonl", [
        record("stops", 7), record("capped", 32, "length"), record("long", 20, "length", max_tokens=20),
        {**record("rejected", 0, None), "rejected_reason": "prompt too long"}, record("left", 3, "abort")])
    for where in (tmp_path / "requests.jsonl", tmp_path):
        oracle = OraclePredictor(OracleConfig(lengths_from=str(where)), CONTEXT)
        assert oracle.predict(req("stops", ignore_eos=False)) == 7.0
        assert oracle.predict(req("stops", max_tokens=5, ignore_eos=False)) == 5.0  # this run's cap comes first
        assert oracle.predict(req("capped", ignore_eos=False)) == 32.0
        assert oracle.predict(req("other", max_tokens=9)) == 9.0  # ignores EOS: no file needed
    with pytest.raises(LengthPredictorError, match=r"'oracle' on request 'left' raised LookupError: .* has no "
                                                   r"finished request 'left'"):
        predict_checked(oracle, req("left", ignore_eos=False))
    with pytest.raises(LengthPredictorError, match="request 'long' was cut at 20 tokens there .* allows 32"):
        predict_checked(oracle, req("long", ignore_eos=False))


def test_oracle_without_lengths_from_names_the_key_for_a_request_that_stops_at_eos():
    oracle = OraclePredictor(OracleConfig(), CONTEXT)
    with pytest.raises(LengthPredictorError, match=r"^length_predictor plugin 'oracle' on request 'q' raised "
                                                   r"LookupError: .*set length_predictor.lengths_from="):
        predict_checked(oracle, req("q", ignore_eos=False))


@pytest.mark.parametrize("content, message", [
    (None, r"^length_predictor=oracle: length_predictor.lengths_from='.*nope.jsonl': no such file \(give the "
           r"requests.jsonl of an earlier run of this workload\)$"),
    ("{not json\n", r"^length_predictor=oracle: length_predictor.lengths_from=.*bad.jsonl:1 is not a requests.jsonl "
                    r"record"),
    ('{"id": "a", "finish_reason": null}\n', r"^length_predictor=oracle: .* records no finished request$")])
def test_a_missing_or_bad_lengths_from_is_one_line_at_start_up(fake_stack, tmp_path, content, message):
    path = tmp_path / ("nope.jsonl" if content is None else "bad.jsonl")
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message) as err:
        fake_stack("scheduler=sjf", "length_predictor=oracle", f"length_predictor.lengths_from={path}")
    assert "\n" not in str(err.value)


REAL = ["model=tiny_code", "workload=corpus", "workload.num_requests=5", "workload.arrival=all_at_once",
        "workload.max_tokens=40", "backend.num_threads=1"]


@pytest.fixture(scope="module")
def fcfs_run(tmp_path_factory):
    """A run of the trained model on corpus prompts (they stop at EOS): its folder and records."""
    folder = tmp_path_factory.mktemp("fcfs")
    return folder, {r["id"]: r for r in run_job(compose(*REAL), folder).requests}


def test_oracle_reads_the_lengths_of_a_real_run_of_the_trained_model(fcfs_run, tmp_path):
    """The file a run writes is the file the oracle reads: every prediction is that run's output_len."""
    from servelab.workloads.build import build_requests
    from servelab.workloads.text import checkpoint_text

    folder, truth = fcfs_run
    cfg = compose(*REAL, "scheduler=sjf", "length_predictor=oracle", f"length_predictor.lengths_from={folder}")
    stack = build_stack(cfg)
    predictor = stack.engine.scheduler.length_predictor
    requests = build_requests(cfg.workload, 259, stack.limits.max_model_len, checkpoint_text(cfg))
    assert {r.id: predictor.predict(r) for r in requests} == {k: float(r["output_len"]) for k, r in truth.items()}
    result = run_job(cfg, tmp_path, stack=stack)
    assert {r["id"]: r["output_token_ids"] for r in result.requests} == \
        {k: r["output_token_ids"] for k, r in truth.items()}


def test_learned_runs_sjf_on_the_trained_model_without_changing_its_tokens(fcfs_run, tmp_path):
    _, truth = fcfs_run
    result = run_job(compose(*REAL, "scheduler=sjf", "length_predictor=learned"), tmp_path)
    assert result.summary["status"] == "completed"
    assert {r["id"]: r["output_token_ids"] for r in result.requests} == \
        {k: r["output_token_ids"] for k, r in truth.items()}


# ---- noisy_oracle -----------------------------------------------------------------------------

def test_noisy_oracle_with_sigma_zero_is_the_oracle():
    requests = [req(f"r{i}", 1 + i, 1 + 7 * i % 90) for i in range(30)]
    noisy = NoisyOraclePredictor(NoisyOracleConfig(sigma=0.0), CONTEXT)
    oracle = OraclePredictor(OracleConfig(), CONTEXT)
    assert [noisy.predict(r) for r in requests] == [oracle.predict(r) for r in requests]


def test_noisy_oracle_is_seeded_per_request_not_per_call():
    requests = [req(f"r{i}", max_tokens=100) for i in range(2000)]
    noisy = NoisyOraclePredictor(NoisyOracleConfig(sigma=0.5), CONTEXT)
    forward = [noisy.predict(r) for r in requests]
    again = NoisyOraclePredictor(NoisyOracleConfig(sigma=0.5), CONTEXT)
    assert [again.predict(r) for r in reversed(requests)][::-1] == forward
    other_seed = NoisyOraclePredictor(NoisyOracleConfig(sigma=0.5), dataclasses.replace(CONTEXT, seed=1))
    assert [other_seed.predict(r) for r in requests] != forward
    log_error = np.log(np.array(forward) / 100.0)
    assert abs(np.median(log_error)) < 0.05 and abs(np.std(log_error) - 0.5) < 0.03  # median-unbiased, sigma


@pytest.mark.parametrize("sigma", ["-0.1", "nan", "inf"])
def test_a_bad_sigma_is_one_line_at_start_up(fake_stack, sigma):
    with pytest.raises(ConfigError, match=rf"^length_predictor=noisy_oracle: length_predictor.sigma={sigma} must "
                                          r"be a finite number >= 0 \(0 = the oracle\)$"):
        fake_stack("scheduler=sjf", "length_predictor=noisy_oracle", f"length_predictor.sigma={sigma}")


# ---- learned ----------------------------------------------------------------------------------

def test_learned_refuses_another_model_at_start_up_in_one_line(fake_stack):
    with pytest.raises(ConfigError) as err:
        fake_stack("scheduler=sjf", "length_predictor=learned")  # model=tiny: random weights
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"length_predictor=learned: {PACKAGED_PREDICTORS / 'tiny_code' / META} was trained "
                              "for model=tiny_code (fingerprint ")
    assert "this run serves model=tiny;" in message


def test_learned_refuses_a_checkpoint_with_other_weights(tmp_path):
    import shutil

    copy = tmp_path / "tiny_code"
    shutil.copytree(TINY_CODE, copy)
    LearnedPredictor(LearnedConfig(), dataclasses.replace(CODE_CONTEXT, model_name="hf", model_path=str(copy)))
    weights = bytearray((copy / "model.safetensors").read_bytes())
    weights[-1] ^= 1  # a retrained tiny_code: same shape, same tokenizer, other weights
    (copy / "model.safetensors").write_bytes(bytes(weights))
    with pytest.raises(ValueError, match=rf"this run serves model=hf \({copy}, fingerprint [0-9a-f]{{16}}\)"):
        LearnedPredictor(LearnedConfig(), dataclasses.replace(CODE_CONTEXT, model_name="hf", model_path=str(copy)))


def test_learned_with_a_missing_bundle_names_the_file(tmp_path):
    with pytest.raises(ValueError, match=rf"^length_predictor.path: cannot read {tmp_path / META} \("):
        LearnedPredictor(LearnedConfig(path=str(tmp_path)), CODE_CONTEXT)


def test_learned_with_a_broken_bundle_names_the_file(tmp_path):
    import shutil

    bundle = tmp_path / "bundle"
    shutil.copytree(PACKAGED_PREDICTORS / "tiny_code", bundle)
    meta = json.loads((bundle / META).read_text())
    (bundle / META).write_text(json.dumps({**meta, "features": {**meta["features"], "hash_bins": 7}}))
    with pytest.raises(ValueError, match=rf"^length_predictor.path: {bundle / 'weights.safetensors'} holds "):
        LearnedPredictor(LearnedConfig(path=str(bundle / META)), CODE_CONTEXT)
    (bundle / META).write_text(json.dumps({**meta, "model": {}}))
    with pytest.raises(ValueError, match=rf"^length_predictor.path: {bundle / META} is not a predictor's meta.json"):
        LearnedPredictor(LearnedConfig(path=str(bundle)), CODE_CONTEXT)


def test_learned_predictions_stay_within_the_requests_cap_and_are_cheap():
    predictor = LearnedPredictor(LearnedConfig(), CODE_CONTEXT)
    requests = [Request(f"r{i}", tuple((7 * i + 3 * j) % 256 for j in range(1 + i % 120)), 1 + i % 300)
                for i in range(2000)]
    start = time.perf_counter()
    answers = [predictor.predict(r) for r in requests]
    elapsed = time.perf_counter() - start
    assert all(0 <= a <= min(r.max_tokens, 512 - r.prompt_len) for a, r in zip(answers, requests))
    assert elapsed < 2.0, f"{elapsed / len(requests) * 1e6:.0f} us per prediction"


def test_learned_warns_once_about_sampled_requests(caplog):
    predictor = LearnedPredictor(LearnedConfig(), CODE_CONTEXT)
    for i in range(3):
        predictor.predict(req(f"s{i}", temperature=1.0))
    warnings = [r for r in caplog.records if "trained on generations at temperature 0" in r.getMessage()]
    assert len(warnings) == 1 and "'s0'" in warnings[0].getMessage()


def _experiment_module(name):
    sys.path.insert(0, str(EXPERIMENT))
    try:
        spec = importlib.util.spec_from_file_location(f"lp_{name}_under_test", EXPERIMENT / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXPERIMENT))


def test_the_shipped_held_out_metrics_reproduce_from_the_shipped_weights():
    """The model card's figures, recomputed through the plugin from the cached held-out lengths."""
    train = _experiment_module("train")
    meta = json.loads((PACKAGED_PREDICTORS / "tiny_code" / META).read_text())
    records = train.read_jsonl(EXPERIMENT / "heldout_lengths.jsonl")
    assert len(records) == meta["data"]["num_heldout"]
    figures, _ = train.evaluate_bundle(PACKAGED_PREDICTORS / "tiny_code", records, train.encoded(records))
    assert figures == meta["heldout_metrics"]
    card = (PACKAGED_PREDICTORS / "tiny_code" / "MODEL_CARD.md").read_text()
    assert f"{figures['kendall_tau_b']:.3f}" in card and f"{figures['bucket_accuracy']:.3f}" in card


def test_kendall_tau_b_matches_its_definition():
    tau = _experiment_module("lp_metrics").kendall_tau_b
    assert tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0 and tau([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # 6 pairs: 4 concordant, none discordant, one tied in x only, one in y only: 4 / sqrt(5 * 5)
    assert math.isclose(tau([1, 2, 2, 3], [1, 3, 2, 3]), 0.8)
    assert math.isnan(tau([1, 1, 1], [1, 2, 3]))


# ---- a predictor that fails at run time --------------------------------------------------------

class RaisingPredictor(LengthPredictor):
    name = "test_raising"
    Config = NoConfig

    def predict(self, request):
        if request.id == "late":
            raise KeyError("no idea")
        return float(request.max_tokens)


class NegativePredictor(LengthPredictor):
    name = "test_negative"
    Config = NoConfig

    def predict(self, request):
        return -1.0 if request.id == "late" else float(request.max_tokens)


class _TestPredictors:
    @hookimpl
    def servelab_register_length_predictors(self):
        return [RaisingPredictor, NegativePredictor]


@pytest.mark.parametrize("name, why", [("test_raising", "raised KeyError: 'no idea'"),
                                       ("test_negative", "returned -1.0: a predicted length must be a finite number")])
def test_a_predictor_failing_at_run_time_stops_the_run_naming_itself_and_the_request(tmp_path, name, why):
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(_TestPredictors())
    registry = build_registry(pm)
    register_configs(registry)
    cfg = compose("scheduler=sjf", f"length_predictor={name}", "num_kv_blocks=64")
    clock = VirtualClock()
    stack = build_stack(cfg, registry, executor=FakeExecutor(clock, 64), clock=clock)
    requests = [Request(f"r{i}", tuple(range(1, 9)), 4) for i in range(3)] + [Request("late", (1, 2, 3), 4, 5.0)]
    expected = f"length_predictor plugin '{name}' on request 'late' {why}"
    with pytest.raises(PluginFailure, match=expected.replace("(", r"\(").replace(")", r"\)")):
        run_job(cfg, tmp_path, requests, stack)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith(f"failed: PluginFailure: {expected}")
    written = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in written if r["finish_reason"] == "length") == ["r0", "r1", "r2"]
