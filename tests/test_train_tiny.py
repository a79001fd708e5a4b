"""The training script of the shipped models retrains a tiny variant in seconds, so it cannot rot."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

from conftest import REPO, compose
from servelab.workloads import corpus

# Small stdlib modules: a corpus of ~100 KB whose held-out split (by hash of path) is not empty.
FILES = ["abc.py", "bisect.py", "colorsys.py", "copyreg.py", "fnmatch.py", "genericpath.py", "glob.py",
         "heapq.py", "keyword.py", "linecache.py", "opcode.py", "operator.py", "queue.py", "sched.py",
         "shlex.py", "stat.py", "string.py", "textwrap.py", "timeit.py", "this.py"]


def _train_module():
    spec = importlib.util.spec_from_file_location("train_tiny", REPO / "experiments" / "train_tiny" / "train.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for name in FILES:
        shutil.copy(corpus.stdlib_root() / name, root / name)
    return root


def test_smoke_training_lowers_the_loss_and_saves_a_loadable_checkpoint(tmp_path, small_corpus):
    train = _train_module()
    out = tmp_path / "smoke"
    figures = train.train(train.parse_args(["--preset", "smoke", "--out", str(out), "--corpus-root",
                                            str(small_corpus), "--heldout-fraction", "0.2"]), log=lambda *a: None)
    assert figures["corpus"]["heldout_files"] > 0
    assert figures["final_train_loss"] < figures["first_train_loss"] - 0.5
    first, last = figures["history"][0], figures["history"][-1]
    assert last["train_loss"] < first["train_loss"]
    assert 0 < figures["heldout_bits_per_byte"] < 8.5
    for name in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "README.md"):
        assert (out / name).is_file(), name
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (256, 257, 258)
    assert json.loads((out / "config.json").read_text())["dtype"] == "float16"
    card = (out / "README.md").read_text()
    assert f"{figures['heldout_bits_per_byte']:.4f}" in card and "--preset smoke" in card

    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(str(out))("ab")["input_ids"] == [256, 97, 98]
    # the card's held-out figure is what servelab's own evaluation gives on the same text (float32)
    from servelab.cli.eval_ppl import evaluate

    docs = corpus.read_documents(corpus.split_files(small_corpus, 0.2)[1])
    result = evaluate(compose("model=hf", f"model.path={out}"), documents=docs)
    assert result["bits_per_byte"] == pytest.approx(figures["heldout_bits_per_byte"], rel=1e-4)
    assert result["num_tokens"] == figures["heldout_num_tokens"]


def test_same_seed_same_weights(tmp_path, small_corpus):
    from safetensors.torch import load_file

    train = _train_module()
    outs = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        train.train(train.parse_args(["--preset", "smoke", "--steps", "6", "--out", str(out), "--corpus-root",
                                      str(small_corpus), "--heldout-fraction", "0.2"]), log=lambda *a: None)
        outs.append(load_file(str(out / "model.safetensors")))
    assert outs[0].keys() == outs[1].keys()
    assert all((outs[0][k] == outs[1][k]).all() for k in outs[0])


def test_empty_corpus_is_an_error(tmp_path, capsys):
    train = _train_module()
    (tmp_path / "empty").mkdir()
    assert train.main(["--preset", "smoke", "--out", str(tmp_path / "o"), "--corpus-root", str(tmp_path / "empty")]) == 2
    assert "has no *.py files to train on" in capsys.readouterr().err
    (tmp_path / "blank").mkdir()
    for name in ("a.py", "b.py", "c.py", "d.py", "e.py", "f.py"):
        (tmp_path / "blank" / name).write_text("\n")
    assert train.main(["--preset", "smoke", "--out", str(tmp_path / "o"), "--corpus-root", str(tmp_path / "blank"),
                       "--heldout-fraction", "0.5"]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
