"""``servelab eval-ppl [overrides]``: held-out perplexity of the configured checkpoint.

The held-out split of the stdlib corpus (``servelab.workloads.corpus``) is tokenized with the checkpoint's
tokenizer into ``<bos> document <eos>`` back to back and cut into windows of the model's context
that overlap by one token, so every token after the first is predicted once. Each batch of
windows is one prefill through servelab's own model over the paged KV cache (the path serving
takes), and the logits of every position are scored. Writes ``ppl.json``:

- ``bits_per_byte``: total negative log-likelihood in bits / UTF-8 bytes of the documents,
- ``perplexity``: exp(mean negative log-likelihood per predicted token),
- ``num_tokens``: predicted tokens.

It goes to ``hydra.run.dir`` (alias ``eval_ppl.output_dir``; default ``outputs/eval-ppl/<date>/<time>``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time

import torch
import torch.nn.functional as F

from servelab.api import command_output_dir, compose_with_run_dir
from servelab.cli.args import refuse_flags
from servelab.cli.help import plain_doc
from servelab.core.errors import ConfigError, ServelabError
from servelab.core.model_spec import load_spec
from servelab.exec.executor import ModelWorker
from servelab.exec.model.llama import AttentionMetadata
from servelab.config import check_known_keys
from servelab.assemble.preflight import check_device
from servelab.assemble.executor import worker_config
from servelab.assemble.validate import explicit_block_size
from servelab.results.writable import writable_folder
from servelab.workloads import corpus
from servelab.workloads.text import checkpoint_text


USAGE = "usage: servelab eval-ppl [hydra overrides...]  (eval_ppl.<key>=...; hydra.run.dir=DIR: DIR/ppl.json)"


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + plain_doc(__doc__))
        return 0
    refuse_flags(argv, "eval-ppl")
    cfg, run_dir = compose_with_run_dir(argv)
    check_known_keys(cfg)
    check_has_weights(cfg)  # bad input before the folder is made
    out = command_output_dir("eval-ppl", run_dir, cfg.eval_ppl.output_dir)
    writable_folder(out, f"hydra.run.dir={run_dir}" if run_dir else f"eval_ppl.output_dir={cfg.eval_ppl.output_dir}"
                    if cfg.eval_ppl.output_dir else "the eval-ppl folder")
    result = evaluate(cfg)
    (out / "ppl.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"held-out bits per byte {result['bits_per_byte']:.4f}, perplexity {result['perplexity']:.4f} per token "
          f"over {result['num_tokens']:,} tokens ({result['model']}, {result['dtype']}, window {result['window']}, "
          f"{result['duration_s']:.0f} s)")
    print(f"results: {out / 'ppl.json'}")
    return 0


def evaluate(cfg, documents: list[str] | None = None) -> dict:
    """The held-out figures of ``cfg``'s model (``documents`` instead of the held-out split if given)."""
    check_has_weights(cfg)
    check_device(cfg)
    if cfg.tensor_parallel_size != 1:
        raise ConfigError("eval-ppl runs with tensor_parallel_size=1")
    if cfg.get("pipeline_parallel_size", 1) != 1:
        raise ConfigError(f"eval-ppl runs in one process: pipeline_parallel_size={cfg.pipeline_parallel_size} "
                          "must be 1")
    e = cfg.eval_ppl
    if e.batch_windows < 1:
        raise ConfigError(f"eval_ppl.batch_windows={e.batch_windows} must be >= 1")
    text = checkpoint_text(cfg)
    tokenizer = text.require("eval-ppl", what="perplexity on the held-out text",
                             hint="use a checkpoint with a tokenizer, e.g. model=tiny_code")
    start = time.perf_counter()
    wcfg = worker_config(cfg)
    spec_window = _window(cfg, wcfg.model_path)
    block_size = explicit_block_size(cfg, "servelab eval-ppl")
    blocks_per_window = -(-spec_window // block_size)
    num_blocks = e.batch_windows * blocks_per_window
    wcfg = dataclasses.replace(wcfg, max_model_len=spec_window, num_kv_blocks=num_blocks,
                               num_swap_blocks=0, swap_space_gb=None)
    worker = ModelWorker(wcfg)
    worker.allocate_kv_cache(num_blocks)

    docs = documents if documents is not None else corpus.heldout_documents()
    stream, num_docs = _stream(docs, text, tokenizer, e.max_tokens)
    num_bytes = sum(len(d.encode("utf-8")) for d in docs[:num_docs])
    windows = corpus.eval_windows(len(stream), spec_window)
    if not windows:
        raise ServelabError("eval-ppl: the held-out text is shorter than two tokens")
    nll, count = 0.0, 0
    for i in range(0, len(windows), e.batch_windows):
        group = windows[i:i + e.batch_windows]
        total, n = _score(worker, [stream[s:t] for s, t in group], block_size, blocks_per_window)
        nll += total
        count += n
    return {
        "bits_per_byte": nll / math.log(2) / num_bytes,
        "perplexity": math.exp(nll / count),
        "num_tokens": count,
        "num_bytes": num_bytes,
        "nll_nats": nll,
        "num_documents": num_docs,
        "num_windows": len(windows),
        "window": spec_window,
        "model": f"model={cfg.model.name}",
        "model_path": wcfg.model_path,
        "dtype": wcfg.dtype,
        "attention_backend": worker.ops.name,
        "python": platform.python_version(),
        "duration_s": time.perf_counter() - start,
    }


def check_has_weights(cfg) -> None:
    """A catalogue model (``model=llama3_70b``: a public shape without weights, for ``backend=sim``)
    has no checkpoint to score: say so naming the configured model."""
    if cfg.model.get("shape_only") and not cfg.model.get("path"):
        raise ConfigError(f"eval-ppl: model={cfg.model.name} is a shape without weights (for backend=sim); "
                          "perplexity needs a checkpoint with a tokenizer, e.g. model=tiny_code or "
                          "model=hf model.path=<checkpoint dir>")


def _window(cfg, model_path: str) -> int:
    context = min(load_spec(model_path).max_position_embeddings, cfg.max_model_len)
    window = context if cfg.eval_ppl.window is None else cfg.eval_ppl.window  # 0 is an error, not the default
    if not 2 <= window <= context:
        raise ConfigError(f"eval_ppl.window={window} must be between 2 and the model's context ({context} = "
                          "min(max_position_embeddings, max_model_len))")
    return window


def _stream(docs: list[str], text, tokenizer, max_tokens: int | None) -> tuple[list[int], int]:
    """The token stream of the first documents (all, or until ``max_tokens``) and how many were used."""
    stream: list[int] = []
    used = 0
    for doc in docs:
        if max_tokens is not None and len(stream) >= max_tokens:
            break
        stream.extend(corpus.token_stream([doc], text.encode_plain, tokenizer.bos_token_id, tokenizer.eos_token_id))
        used += 1
    return stream, used


@torch.inference_mode()
def _score(worker, windows: list[list[int]], block_size: int, blocks_per_window: int) -> tuple[float, int]:
    """One prefill of ``windows`` (each a fresh sequence in its own blocks); summed NLL and predictions."""
    dev = worker.device
    lengths = [len(w) for w in windows]
    ids = torch.tensor([t for w in windows for t in w], dtype=torch.long, device=dev)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(dev)
    tables = torch.arange(len(windows) * blocks_per_window, dtype=torch.int32).view(len(windows), blocks_per_window)
    slots = torch.cat([tables[i, torch.arange(n) // block_size].long() * block_size + torch.arange(n) % block_size
                       for i, n in enumerate(lengths)])
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    meta = AttentionMetadata(slot_mapping=slots.to(dev), block_tables=tables.to(dev), cu_seqlens_q=cu.to(dev),
                             context_lens=torch.tensor(lengths, dtype=torch.int32, device=dev),
                             max_query_len=max(lengths), max_context_len=max(lengths))
    hidden = worker.model(ids, positions, worker.kv_cache, meta, worker.ops)
    total, count = 0.0, 0
    for i, n in enumerate(lengths):
        s = int(cu[i])
        logits = worker.model.compute_logits(hidden[s:s + n - 1])  # float32, full vocabulary
        total += float(F.cross_entropy(logits.double(), ids[s + 1:s + n], reduction="sum"))
        count += n - 1
    return total, count
