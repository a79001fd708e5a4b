"""Text in, text out: the byte tokenizer, text prompts in every workload, output_text, bad input."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from servelab.workloads import corpus
from servelab.workloads.text import BYTE_VOCAB_SIZE, CheckpointText, TextError, build_byte_tokenizer
from servelab.workloads.text_prompts import unescape
from servelab.workloads.build import WorkloadError, build_requests


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    """A random-weight byte-level Llama with the byte tokenizer saved beside it (any HF checkpoint
    with a tokenizer must work, not only the shipped ones)."""
    from servelab.exec.model.random_checkpoint import write_random_checkpoint

    path = tmp_path_factory.mktemp("text_ckpt")
    write_random_checkpoint(path, "LlamaForCausalLM", seed=2, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            vocab_size=BYTE_VOCAB_SIZE, max_position_embeddings=256, bos_token_id=256,
                            eos_token_id=257, pad_token_id=258)
    build_byte_tokenizer().save_pretrained(path)
    return path


def test_byte_tokenizer_is_the_bytes_with_a_leading_bos(tmp_path):
    from transformers import AutoTokenizer

    build_byte_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    text = "def f(x):\n\treturn x  # é ☃ \x00\r\n"
    ids = tok(text)["input_ids"]
    assert ids == [256] + list(text.encode("utf-8"))
    assert tok(text, add_special_tokens=False)["input_ids"] == list(text.encode("utf-8"))
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, len(tok)) == (256, 257, 258, BYTE_VOCAB_SIZE)


def test_corpus_split_is_by_file_and_documents_cut_at_top_level_definitions():
    train, heldout = corpus.split_files()
    assert heldout and train and not set(train) & set(heldout)
    assert 0.01 < len(heldout) / (len(train) + len(heldout)) < 0.06
    root = corpus.stdlib_root()
    names = [p.relative_to(root).as_posix() for p in train]
    assert names == sorted(names) and not any("/test/" in f"/{n}" for n in names)
    docs = corpus.split_documents("import os\n\n\n# about f\n@dec\ndef f():\n    pass\n\nclass C:\n    x = 1\n")
    assert docs == ["import os\n", "# about f\n@dec\ndef f():\n    pass\n", "class C:\n    x = 1\n"]
    assert corpus.eval_windows(10, 4) == [(0, 4), (3, 7), (6, 10)]


def test_jsonl_prompt_is_tokenized_with_the_checkpoints_tokenizer(tmp_path, text_checkpoint):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "def add(a, b):\\n", "max_tokens": 8}\n'
                    '{"prompt_token_ids": [256, 100], "max_tokens": 4}\n')
    cfg = compose("workload=jsonl", f"workload.path={path}")
    text = CheckpointText(text_checkpoint)
    reqs = build_requests(cfg.workload, BYTE_VOCAB_SIZE, 256, text)
    assert reqs[0].prompt_token_ids == (256, *b"def add(a, b):\n")
    assert reqs[0].ignore_eos is False and reqs[1].ignore_eos is True  # text stops at EOS, token ids do not


def test_text_prompt_without_a_tokenizer_names_the_checkpoint(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "hello", "max_tokens": 8}\n')
    cfg = compose("workload=jsonl", f"workload.path={path}")
    with pytest.raises(TextError, match=r"w.jsonl:1: .*checkpoint model=tiny \(random weights\) has none; "
                                        r"give 'prompt_token_ids' instead"):
        build_requests(cfg.workload, 4096, 2048)
    with pytest.raises(TextError, match=r"checkpoint model.path='/some/ckpt' has none"):
        CheckpointText("/some/ckpt").encode("x", "here")


def test_prompt_and_prompt_token_ids_on_one_line_names_the_line(tmp_path, text_checkpoint):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "a", "max_tokens": 1}\n{"prompt": "a", "prompt_token_ids": [1], "max_tokens": 1}\n')
    cfg = compose("workload=jsonl", f"workload.path={path}")
    with pytest.raises(WorkloadError, match=rf"{path}:2: has both 'prompt' and 'prompt_token_ids'"):
        build_requests(cfg.workload, BYTE_VOCAB_SIZE, 256, CheckpointText(text_checkpoint))


def test_prompts_file_one_per_line_with_escapes(tmp_path, text_checkpoint):
    assert unescape(r"a\nb\tc\\n\d") == "a\nb\tc\\n\\d"
    path = tmp_path / "p.txt"
    path.write_text("def f(x):\\n    return\n\nclass A:\n")
    cfg = compose("workload=prompts", f"workload.path={path}", "workload.max_tokens=5")
    reqs = build_requests(cfg.workload, BYTE_VOCAB_SIZE, 256, CheckpointText(text_checkpoint))
    assert [r.id for r in reqs] == ["prompt-1", "prompt-3"]
    assert reqs[0].prompt_token_ids == (256, *b"def f(x):\n    return")
    assert all(r.max_tokens == 5 and not r.ignore_eos and r.arrival_time == 0 for r in reqs)
    with pytest.raises(TextError, match=r"workload=prompts: .*has none; run token ids instead: workload=synthetic"):
        build_requests(cfg.workload, 4096, 2048)


def test_corpus_workload_draws_heldout_prefixes_reproducibly(text_checkpoint):
    cfg = compose("workload=corpus", "workload.num_requests=12", "workload.prefix_bytes=40", "workload.rate=4")
    text = CheckpointText(text_checkpoint)
    a = build_requests(cfg.workload, BYTE_VOCAB_SIZE, 256, text)
    b = build_requests(cfg.workload, BYTE_VOCAB_SIZE, 256, text)
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b] and len(a) == 12
    starts = {d.encode()[:40] for d in corpus.heldout_documents()}
    assert all(bytes(r.prompt_token_ids[1:]) in starts for r in a)  # BOS + the first 40 bytes of a held-out doc
    assert all(r.max_tokens == cfg.workload.max_tokens and not r.ignore_eos for r in a)
    assert a[0].arrival_time == 0 and a[-1].arrival_time > 0
    with pytest.raises(TextError, match="model=tiny"):
        build_requests(cfg.workload, 4096, 2048)


def test_requests_jsonl_carries_output_text(tmp_path, text_checkpoint):
    from servelab.results.report import print_samples
    from servelab.run.session import run_job
    from rich.console import Console

    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt": "import os\\n", "max_tokens": 6, "ignore_eos": true}\n'
                    '{"prompt_token_ids": [256, 35], "max_tokens": 3}\n')
    cfg = compose("model=hf", f"model.path={text_checkpoint}", "workload=jsonl", f"workload.path={path}")
    result = run_job(cfg, tmp_path / "out")
    lines = [json.loads(x) for x in (tmp_path / "out" / "requests.jsonl").read_text().splitlines()]
    tok = build_byte_tokenizer()
    for line in lines:
        assert line["output_text"] == tok.decode(line["output_token_ids"], skip_special_tokens=True)
    by_id = {line["id"]: line for line in lines}  # written as requests end
    assert by_id["req-0"]["prompt_text"] == "import os\n" and by_id["req-1"]["prompt_text"] == "#"
    console = Console(record=True, width=100)
    print_samples(result.requests, console)
    out = console.export_text()
    assert "sample completions" in out and "import os" in out


def test_no_output_text_without_a_tokenizer(tmp_path):
    from servelab.run.session import run_job

    cfg = compose("workload.num_requests=2", "workload.prompt_len.max=20", "workload.output_len.max=9",
                  "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1")
    result = run_job(cfg, tmp_path)
    assert all("output_text" not in r for r in result.requests)


def test_api_add_request_takes_text(text_checkpoint):
    from servelab.api import LLM

    lab = LLM(compose("model=hf", f"model.path={text_checkpoint}"))
    lab.add_request("x = ", max_tokens=4, ignore_eos=True)
    while lab.has_unfinished():
        lab.step()
    rec = lab.results().requests[0]
    assert rec["prompt_len"] == 5 and rec["prompt_text"] == "x = " and isinstance(rec["output_text"], str)


def test_any_hf_tokenizer_works(tmp_path):
    """A BPE tokenizer without BOS/EOS (not the byte tokenizer): text prompts, output_text, eval-ppl."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from servelab.cli.eval_ppl import evaluate
    from servelab.exec.model.random_checkpoint import write_random_checkpoint
    from servelab.run.session import run_job
    from test_eval_ppl import hf_heldout_nll

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus.heldout_documents()[:30],
                            trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    ckpt = tmp_path / "bpe"
    write_random_checkpoint(ckpt, "LlamaForCausalLM", seed=4, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                            vocab_size=tok.get_vocab_size(), max_position_embeddings=128)
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(ckpt)
    prompts = tmp_path / "p.txt"
    prompts.write_text("def main():\\n    return\n")
    cfg = compose("model=hf", f"model.path={ckpt}", "workload=prompts", f"workload.path={prompts}",
                  "workload.max_tokens=5", "workload.ignore_eos=true")
    rec = run_job(cfg, tmp_path / "out").requests[0]
    assert rec["prompt_text"] == "def main():\n    return" and rec["output_len"] == 5
    assert rec["output_text"] == PreTrainedTokenizerFast(tokenizer_object=tok).decode(rec["output_token_ids"])
    docs = corpus.heldout_documents()[:2]
    result = evaluate(compose("model=hf", f"model.path={ckpt}"), documents=docs)
    nll, count = hf_heldout_nll(ckpt, docs, result["window"])
    assert result["num_tokens"] == count and result["nll_nats"] == pytest.approx(nll, rel=1e-4)
