"""``servelab eval-ppl``: held-out perplexity through servelab's model equals HF transformers' loss."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile

import pytest
import torch

from conftest import compose
from servelab.workloads import corpus
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.cli.eval_ppl import evaluate
from servelab.workloads.text import load_tokenizer


def hf_heldout_nll(model_dir, docs, window: int) -> tuple[float, int]:
    """Total NLL (nats) and predicted tokens of HF transformers (float32) over the same windows."""
    import transformers

    tok = load_tokenizer(model_dir)
    stream = corpus.token_stream(docs, lambda t: tok(t, add_special_tokens=False)["input_ids"],
                                 tok.bos_token_id, tok.eos_token_id)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    total, count = 0.0, 0
    with torch.inference_mode():
        for s, e in corpus.eval_windows(len(stream), window):
            x = torch.tensor([stream[s:e]])
            total += model(input_ids=x, labels=x).loss.item() * (e - s - 1)
            count += e - s - 1
    return total, count


@pytest.mark.parametrize("model, overrides", [
    ("tiny_code", ["block_size=16"]),
    ("tiny_code_draft", ["block_size=8", "eval_ppl.batch_windows=3"]),
])
def test_eval_ppl_equals_hf_loss(model, overrides):
    docs = corpus.heldout_documents()[:6]
    result = evaluate(compose(f"model={model}", *overrides), documents=docs)
    nll, count = hf_heldout_nll(PACKAGED_CHECKPOINTS / model, docs, result["window"])
    assert result["num_tokens"] == count > 2 * result["window"]  # several windows
    assert result["nll_nats"] == pytest.approx(nll, rel=1e-4)
    assert result["perplexity"] == pytest.approx(math.exp(nll / count), rel=1e-4)
    assert result["bits_per_byte"] == pytest.approx(nll / math.log(2) / sum(len(d.encode()) for d in docs), rel=1e-4)



def test_cli_writes_ppl_json(tmp_path):
    # hydra.run.dir, as for every command, wins over the older eval_ppl.output_dir
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "servelab"), "eval-ppl",
                           "model=tiny_code_draft", "eval_ppl.max_tokens=3000", f"hydra.run.dir={tmp_path}/run",
                           f"eval_ppl.output_dir={tmp_path}/alias"],
                          cwd=tempfile.mkdtemp(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"results: {tmp_path}/run/ppl.json"
    assert not (tmp_path / "alias").exists()
    result = json.loads((tmp_path / "run" / "ppl.json").read_text())
    assert {"bits_per_byte", "perplexity", "num_tokens"} <= set(result)
    assert 0 < result["bits_per_byte"] < 8 and result["num_tokens"] >= 3000
    assert f"{result['bits_per_byte']:.4f}" in proc.stdout


def test_cli_without_a_tokenizer_names_the_checkpoint(tmp_path):
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "servelab"), "eval-ppl", "model=tiny",
                           "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "servelab eval-ppl: error: eval-ppl: perplexity on the held-out text needs a tokenizer, but the " \
        "checkpoint model=tiny (random weights) has none" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "servelab"), "eval-ppl", "eval_ppl.nope=1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "eval_ppl.nope" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_code", "tiny_code_draft"])
def test_model_card_figure_is_reproduced(model):
    figures = json.loads((PACKAGED_CHECKPOINTS / model / "training.json").read_text())
    if figures["corpus"]["python"] != __import__("platform").python_version():
        pytest.skip(f"the card was measured on Python {figures['corpus']['python']}'s stdlib")
    result = evaluate(compose(f"model={model}"))
    assert result["bits_per_byte"] == pytest.approx(figures["heldout_bits_per_byte"], rel=1e-4)
    assert result["num_tokens"] == figures["heldout_num_tokens"]
    assert f"{result['bits_per_byte']:.4f}" in (PACKAGED_CHECKPOINTS / model / "README.md").read_text()
