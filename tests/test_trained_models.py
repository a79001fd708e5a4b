"""The shipped trained checkpoints (model=tiny_code, model=tiny_code_draft) on held-out prompts:
greedy tokens equal HF transformers' generate in float32 (stopping at EOS) under every scheduler,
chunked prefill on/off and preemption; seeded sampling is reproducible; the default run shows text."""

from __future__ import annotations

import json
import random

import pytest
import torch

from conftest import compose
from servelab.workloads import corpus
from servelab.api import LLM
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.workloads.text import load_tokenizer

MODELS = ["tiny_code", "tiny_code_draft"]


def heldout_prompts(n: int = 32, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``n`` held-out code prefixes (16..200 bytes from the start of a document) and output lengths."""
    rng = random.Random(seed)
    docs = [d for d in corpus.heldout_documents() if len(d.encode()) > 220]
    tok = load_tokenizer(PACKAGED_CHECKPOINTS / "tiny_code_draft")  # the same tokenizer as tiny_code
    prompts, max_tokens = [], []
    for doc in rng.sample(docs, n):
        prefix = doc.encode()[:rng.randint(16, 200)].decode("utf-8", errors="ignore")
        prompts.append(tok(prefix)["input_ids"])
        max_tokens.append(rng.randint(4, 48))
    return prompts, max_tokens


def hf_generate(model_dir, prompts, max_tokens) -> list[list[int]]:
    """HF greedy generate of each prompt alone in float32, stopping at EOS (the EOS token kept)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    outputs = []
    with torch.inference_mode():
        for prompt, n in zip(prompts, max_tokens):
            ids = torch.tensor([prompt])
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                 eos_token_id=eos, pad_token_id=model.generation_config.pad_token_id)
            outputs.append(out[0, len(prompt):].tolist())
    return outputs


@pytest.fixture(scope="module")
def reference():
    cache = {}

    def get(model):
        if model not in cache:
            prompts, max_tokens = heldout_prompts()
            cache[model] = (prompts, max_tokens, hf_generate(PACKAGED_CHECKPOINTS / model, prompts, max_tokens))
        return cache[model]

    return get


def serve(model, prompts, max_tokens, *overrides, **sampling):
    lab = LLM(compose(f"model={model}", "max_num_seqs=8", "max_num_batched_tokens=128", "backend.num_threads=1",
                      *overrides))
    for p, m in zip(prompts, max_tokens):
        lab.add_request(p, m, ignore_eos=False, **sampling)
    while lab.has_unfinished():
        lab.step()
    return lab.results()


def _check(result, expected):
    got = [r["output_token_ids"] for r in result.requests]
    assert got == expected
    assert result.summary["leaked_blocks"] == 0 and result.summary["num_finished"] == len(expected)
    return got


@pytest.mark.parametrize("model", MODELS)
def test_greedy_tokens_equal_hf_on_heldout_prompts(reference, model):
    prompts, max_tokens, expected = reference(model)
    result = serve(model, prompts, max_tokens)
    _check(result, expected)
    # a trained model ends functions by itself: some requests stop at EOS before max_tokens
    assert {r["finish_reason"] for r in result.requests} <= {"stop", "length"}


def test_greedy_tokens_equal_hf_under_preemption(reference):
    prompts, max_tokens, expected = reference("tiny_code")
    result = serve("tiny_code", prompts, max_tokens, "block_size=16", "num_kv_blocks=24")
    assert result.summary["num_preemptions"] > 0
    _check(result, expected)


def test_greedy_tokens_equal_hf_without_chunked_prefill(reference):
    prompts, max_tokens, expected = reference("tiny_code_draft")
    _check(serve("tiny_code_draft", prompts, max_tokens, "chunked_prefill=false", "max_num_batched_tokens=512",
                 "max_model_len=512"), expected)


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("scheduler", ["fcfs", "static", "priority", "slo_aware"])
@pytest.mark.parametrize("variant", ["chunked", "whole", "preempt_recompute", "preempt_swap"])
def test_greedy_tokens_equal_hf_every_scheduler(reference, model, scheduler, variant):
    prompts, max_tokens, expected = reference(model)
    overrides = {
        "chunked": ["max_num_batched_tokens=64"],
        "whole": ["chunked_prefill=false", "max_num_batched_tokens=512", "max_model_len=512"],
        "preempt_recompute": ["block_size=8", "num_kv_blocks=40"],
        "preempt_swap": ["block_size=8", "num_kv_blocks=40", "preemption=swap", "backend.num_swap_blocks=256"],
    }[variant]
    result = serve(model, prompts, max_tokens, f"scheduler={scheduler}", "slo.ttft_ms=500", "slo.tpot_ms=100",
                   *overrides)
    if variant.startswith("preempt") and scheduler != "static":
        assert result.summary["num_preemptions"] > 0
    _check(result, expected)


def test_seeded_sampling_is_reproducible_and_independent_of_batching():
    prompts, max_tokens = heldout_prompts(12, seed=1)
    params = dict(temperature=0.8, top_p=0.9, top_k=40)

    def outputs(*overrides, seed=7):
        result = serve("tiny_code_draft", prompts, max_tokens, *overrides, seed=seed, **params)
        return [r["output_token_ids"] for r in result.requests]

    first = outputs()
    assert outputs() == first  # run to run
    assert outputs("max_num_seqs=1") == first  # one at a time: the same tokens
    assert outputs(seed=8) != first


def test_default_run_shows_readable_completions(tmp_path):
    from test_cli import run_cli

    proc = run_cli("logger=none", "progress=false", "workload.num_requests=3", "workload.rate=50",
                   "workload.max_tokens=48", f"hydra.run.dir={tmp_path}", pin=False)
    assert proc.returncode == 0, proc.stderr
    assert "sample completions" in proc.stdout and "output_throughput_tok_s" in proc.stdout
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and all(isinstance(r["output_text"], str) and r["output_text"] for r in lines)
    config = (tmp_path / "config.yaml").read_text()
    assert "name: tiny_code" in config and "name: corpus" in config


def test_checkpoints_are_small_complete_and_carded():
    total = 0
    for model in MODELS:
        path = PACKAGED_CHECKPOINTS / model
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "README.md"):
            assert (path / name).is_file(), (model, name)
        total += sum(p.stat().st_size for p in path.iterdir())
        assert json.loads((path / "config.json").read_text())["dtype"] in ("float16", "bfloat16")
        card = (path / "README.md").read_text()
        figures = json.loads((path / "training.json").read_text())
        assert f"{figures['heldout_bits_per_byte']:.4f}" in card and "train_tiny/train.py" in card
    assert total <= 12 * 2**20
    target = json.loads((PACKAGED_CHECKPOINTS / "tiny_code" / "training.json").read_text())["parameters"]
    draft = json.loads((PACKAGED_CHECKPOINTS / "tiny_code_draft" / "training.json").read_text())["parameters"]
    assert draft < target / 3


@pytest.mark.slow
def test_wheel_carries_the_checkpoints(tmp_path):
    import shutil
    import subprocess
    import sys
    import zipfile

    from conftest import REPO

    src = tmp_path / "src"  # build from a copy: no build/ or egg-info left in the checkout
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".venv", ".git", "outputs", "multirun", "wandb",
                                                              "__pycache__", "*.egg-info", "build", ".pytest_cache"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    names = set(zipfile.ZipFile(next((tmp_path / "dist").glob("servelab-*.whl"))).namelist())
    for model in MODELS:
        for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                     "tokenizer_config.json", "README.md"):
            assert f"servelab/checkpoints/{model}/{name}" in names, (model, name)
