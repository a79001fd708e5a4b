"""Train the shipped byte-level Llama models from scratch on CPU, on the Python stdlib's sources.

    python experiments/train_tiny/train.py --preset target   # -> framework/checkpoints/tiny_code
    python experiments/train_tiny/train.py --preset draft    # -> framework/checkpoints/tiny_code_draft

The model is transformers' own ``LlamaForCausalLM``; the corpus, the held-out split and the
evaluation windows are ``servelab.workloads.corpus`` (the same ones ``workload=corpus`` and
``servelab eval-ppl`` use). Everything random comes from ``--seed``: the same command on the
same machine (same Python stdlib, same torch, same thread count) gives the same weights.
The output folder is a complete HF checkpoint: ``config.json``, ``generation_config.json``,
``model.safetensors`` (float16), ``tokenizer.json`` (+ config) and a model card ``README.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from servelab.workloads import corpus
from servelab.workloads.text import BYTE_VOCAB_SIZE, build_byte_tokenizer

BOS_ID, EOS_ID, PAD_ID = 256, 257, 258
PACKAGE_CHECKPOINTS = Path(__file__).resolve().parents[2] / "framework" / "checkpoints"


@dataclass(frozen=True)
class Preset:
    name: str  # the checkpoint folder name
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    seq_len: int
    batch_size: int
    steps: int
    lr: float
    warmup: int = 100
    weight_decay: float = 0.1
    eval_every: int = 250
    eval_windows: int = 48  # held-out windows in the periodic (partial) evaluation


PRESETS = {
    # Sizes fit ~35 min each on one shared CPU core: a 3M-parameter target saw too few tokens in that time
    # (held-out 2.05 bits/byte after 600 steps of 16 x 512, worse than this draft), so the target is 1.6M.
    "target": Preset("tiny_code", 192, 512, 4, 6, 2, seq_len=512, batch_size=8, steps=2000, lr=2.5e-3,
                     eval_every=400),
    "draft": Preset("tiny_code_draft", 128, 344, 2, 4, 2, seq_len=512, batch_size=16, steps=1500, lr=3e-3,
                    eval_every=300),
    # a seconds-long run for the test that keeps this script from rotting
    "smoke": Preset("smoke", 32, 64, 2, 2, 1, seq_len=128, batch_size=8, steps=40, lr=1e-2, warmup=5,
                    eval_every=20, eval_windows=8),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="target")
    p.add_argument("--out", type=Path, help="output folder (default: framework/checkpoints/<preset's name>)")
    p.add_argument("--corpus-root", type=Path, help="folder of *.py files (default: this interpreter's stdlib)")
    p.add_argument("--heldout-fraction", type=float, default=corpus.HELDOUT_FRACTION)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, help="override the preset's number of optimizer steps")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-bf16-autocast", action="store_true", help="train in plain float32")
    return p.parse_args(argv)


def load_streams(root: Path | None, fraction: float) -> tuple[np.ndarray, np.ndarray, dict]:
    """(train stream, held-out stream, corpus facts); raises CorpusError on an empty corpus."""
    root = Path(root) if root is not None else corpus.stdlib_root()
    train_files, heldout_files = corpus.split_files(root, fraction)
    if not train_files:
        raise corpus.CorpusError(f"corpus {str(root)!r} has no *.py files to train on")
    if not heldout_files:
        raise corpus.CorpusError(f"corpus {str(root)!r}: the held-out split ({fraction:.0%} of files) is empty; "
                                 "raise --heldout-fraction or add files")
    train_docs, heldout_docs = corpus.read_documents(train_files), corpus.read_documents(heldout_files)
    if not train_docs or not heldout_docs:
        raise corpus.CorpusError(f"corpus {str(root)!r} has no text (every file is empty)")

    def stream(docs):
        return np.asarray(corpus.token_stream(docs, lambda t: t.encode("utf-8"), BOS_ID, EOS_ID), dtype=np.int64)

    train, heldout = stream(train_docs), stream(heldout_docs)
    facts = {
        "root": str(root), "python": platform.python_version(),
        "train_files": len(train_files), "heldout_files": len(heldout_files),
        "train_documents": len(train_docs), "heldout_documents": len(heldout_docs),
        "train_bytes": sum(len(d.encode()) for d in train_docs),
        "heldout_bytes": sum(len(d.encode()) for d in heldout_docs),
        "train_tokens": int(train.size), "heldout_tokens": int(heldout.size),
        "heldout_fraction": fraction,
        "checksum": corpus.checksum(train_files + heldout_files, root),
        "heldout_file_names": [p.relative_to(root).as_posix() for p in heldout_files],
    }
    return train, heldout, facts


@torch.inference_mode()
def heldout_nll(model, stream: np.ndarray, window: int, max_windows: int | None = None,
                batch: int = 8) -> tuple[float, int]:
    """(total NLL in nats, predicted tokens) over the held-out windows of ``corpus.eval_windows``."""
    spans = corpus.eval_windows(len(stream), window)
    if max_windows is not None:
        spans = spans[:: max(1, len(spans) // max_windows)][:max_windows]
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    for i in range(0, len(spans), batch):
        group = spans[i:i + batch]
        for s, e in group:  # windows differ in length only at the end: run them one by one then
            if e - s != window:
                break
        else:
            x = torch.from_numpy(np.stack([stream[s:e] for s, e in group]))
            logits = model(input_ids=x).logits.float()
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                    x[:, 1:].reshape(-1), reduction="sum")
            total += float(nll)
            count += x.shape[0] * (x.shape[1] - 1)
            continue
        for s, e in group:
            x = torch.from_numpy(stream[s:e])[None]
            logits = model(input_ids=x).logits.float()
            total += float(torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:], reduction="sum"))
            count += e - s - 1
    model.train(was_training)
    return total, count


def lr_at(step: int, preset: Preset) -> float:
    if step < preset.warmup:
        return preset.lr * (step + 1) / preset.warmup
    progress = (step - preset.warmup) / max(1, preset.steps - preset.warmup)
    return preset.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _log(*args) -> None:
    print(*args, flush=True)


def train(args: argparse.Namespace, log=_log) -> dict:
    """Train, save the checkpoint (float16) and its model card; returns the run's figures."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    preset = PRESETS[args.preset]
    if args.steps is not None:
        preset = replace(preset, steps=args.steps)
    out = args.out or PACKAGE_CHECKPOINTS / preset.name
    if args.threads:
        torch.set_num_threads(args.threads)
    train_stream, heldout_stream, facts = load_streams(args.corpus_root, args.heldout_fraction)
    if train_stream.size <= preset.seq_len:
        raise corpus.CorpusError(f"corpus {facts['root']!r}: {train_stream.size} training tokens, fewer than "
                                 f"one sequence of {preset.seq_len}")
    log(f"corpus: {facts['train_files']} train files ({facts['train_bytes'] / 1e6:.1f} MB), "
        f"{facts['heldout_files']} held-out files ({facts['heldout_bytes'] / 1e6:.2f} MB)")

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    config = LlamaConfig(
        vocab_size=BYTE_VOCAB_SIZE, hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_hidden_layers, num_attention_heads=preset.num_attention_heads,
        num_key_value_heads=preset.num_key_value_heads, max_position_embeddings=preset.seq_len,
        tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        architectures=["LlamaForCausalLM"])
    model = LlamaForCausalLM(config)
    num_params = sum(p.numel() for p in model.parameters())
    log(f"model: {num_params / 1e6:.2f}M parameters, {asdict(preset)}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": preset.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=preset.lr, betas=(0.9, 0.95))
    autocast = not args.no_bf16_autocast
    history, losses = [], []
    start = time.perf_counter()
    model.train()
    for step in range(preset.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, preset)
        offsets = rng.integers(0, train_stream.size - preset.seq_len, size=preset.batch_size)
        x = torch.from_numpy(np.stack([train_stream[o:o + preset.seq_len] for o in offsets]))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        done = step + 1
        if done % preset.eval_every == 0 or done == preset.steps:
            nll, n = heldout_nll(model, heldout_stream, preset.seq_len, preset.eval_windows)
            elapsed = time.perf_counter() - start
            entry = {"step": done, "train_loss": float(np.mean(losses[-preset.eval_every:])),
                     "heldout_bpb_partial": nll / n / math.log(2), "elapsed_s": round(elapsed, 1)}
            history.append(entry)
            log(f"step {done}/{preset.steps} loss {entry['train_loss']:.3f} held-out bpb (partial) "
                f"{entry['heldout_bpb_partial']:.3f} [{elapsed:.0f}s, "
                f"ETA {elapsed / done * (preset.steps - done):.0f}s]")
    train_time = time.perf_counter() - start

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.half().save_pretrained(out, safe_serialization=True)
    tokenizer = build_byte_tokenizer()
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out)
    # The figures of the shipped weights: the float16 file read back in float32.
    shipped = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    nll, count = heldout_nll(shipped, heldout_stream, preset.seq_len)
    bpb = nll / math.log(2) / facts["heldout_bytes"]
    sample = greedy_sample(shipped, tokenizer)
    figures = {
        "preset": args.preset, "name": preset.name, "parameters": num_params, "seed": args.seed,
        "steps": preset.steps, "tokens_seen": preset.steps * preset.batch_size * preset.seq_len,
        "train_time_s": round(train_time, 1), "torch_threads": torch.get_num_threads(),
        "bf16_autocast": autocast, "first_train_loss": losses[0], "final_train_loss": float(np.mean(losses[-50:])),
        "heldout_bits_per_byte": bpb, "heldout_perplexity": math.exp(nll / count),
        "heldout_num_tokens": count, "history": history, "corpus": facts, "preset_config": asdict(preset),
        "sample_prompt": SAMPLE_PROMPT, "sample_completion": sample,
        "command": "python experiments/train_tiny/train.py " + " ".join(shlex.quote(a) for a in _argv(args)),
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
    }
    (out / "training.json").write_text(json.dumps(figures, indent=2) + "\n")
    (out / "README.md").write_text(model_card(figures, config))
    log(f"saved {out}: held-out {bpb:.4f} bits/byte, trained in {train_time:.0f}s")
    return figures


SAMPLE_PROMPT = 'def median(values):\n    """Return the median of a list of numbers."""\n'


@torch.inference_mode()
def greedy_sample(model, tokenizer, prompt: str = SAMPLE_PROMPT, max_new_tokens: int = 160) -> str:
    ids = torch.tensor([tokenizer(prompt)["input_ids"]])
    max_new_tokens = min(max_new_tokens, model.config.max_position_embeddings - ids.shape[1])
    if max_new_tokens < 1:
        return ""
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         do_sample=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    return tokenizer.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)


def _portable_tokenizer_config(out: Path) -> None:
    """Name the tokenizer class transformers 4.x and 5.x both know."""
    path = out / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2) + "\n")


def _argv(args) -> list[str]:
    argv = ["--preset", args.preset]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    if args.seed:
        argv += ["--seed", str(args.seed)]
    if args.threads:
        argv += ["--threads", str(args.threads)]
    if args.no_bf16_autocast:
        argv.append("--no-bf16-autocast")
    if args.corpus_root:
        argv += ["--corpus-root", str(args.corpus_root)]
    if args.heldout_fraction != corpus.HELDOUT_FRACTION:
        argv += ["--heldout-fraction", str(args.heldout_fraction)]
    return argv


def model_card(f: dict, config) -> str:
    c, p = f["corpus"], f["preset_config"]
    rows = "\n".join(f"| {h['step']} | {h['train_loss']:.3f} | {h['heldout_bpb_partial']:.3f} | {h['elapsed_s']:.0f} |"
                     for h in f["history"])
    return f"""# {f['name']}

A byte-level Llama (transformers `LlamaForCausalLM`) trained from scratch on CPU on the Python
{c['python']} standard library's sources, shipped with servelab (`model={f['name']}`).

| | |
|---|---|
| parameters | {f['parameters']:,} ({f['parameters'] / 1e6:.2f}M; float16 weights, tied embeddings) |
| shape | hidden {config.hidden_size}, intermediate {config.intermediate_size}, {config.num_hidden_layers} layers, {config.num_attention_heads} heads / {config.num_key_value_heads} KV heads (head dim {config.hidden_size // config.num_attention_heads}), RoPE theta {config.rope_parameters.get('rope_theta', 10000.0) if getattr(config, 'rope_parameters', None) else getattr(config, 'rope_theta', 10000.0)} |
| context | {config.max_position_embeddings} tokens (trained on windows of that length) |
| tokenizer | bytes 0-255 are their own ids; `<s>` 256 (BOS, prepended by the tokenizer), `</s>` 257 (EOS), `<pad>` 258 |
| corpus | {c['train_files']} stdlib files, {c['train_documents']:,} documents, {c['train_bytes'] / 1e6:.2f} MB (checksum `{c['checksum']}`); test folders excluded |
| held-out split | {c['heldout_files']} files ({c['heldout_fraction']:.0%} by hash of path), {c['heldout_documents']} documents, {c['heldout_bytes'] / 1e6:.3f} MB |
| training | {f['steps']} AdamW steps of {p['batch_size']} x {p['seq_len']} tokens ({f['tokens_seen'] / 1e6:.1f}M tokens), lr {p['lr']} cosine to 10% after {p['warmup']} warm-up steps, weight decay {p['weight_decay']}, bf16 autocast: {f['bf16_autocast']}, seed {f['seed']} |
| training time | {f['train_time_s']:.0f} s on {f['torch_threads']} CPU threads (torch {f['torch']}) |
| final train loss | {f['final_train_loss']:.3f} nats/token (mean of the last 50 steps) |
| **held-out bits per byte** | **{f['heldout_bits_per_byte']:.4f}** (perplexity {f['heldout_perplexity']:.3f} per token over {f['heldout_num_tokens']:,} tokens; the float16 weights read in float32) |

Documents are the module header or one top-level definition of a file, each `<s> text </s>`
back to back, so the model ends a function with EOS. The held-out figure uses windows of
{config.max_position_embeddings} tokens overlapping by one (every token after the first predicted once); it is what

```bash
servelab eval-ppl model={f['name']}
```

prints on the same Python version. Made by:

```bash
{f['command']}
```

Training curve (held-out bits per byte on {p['eval_windows']} windows, not the full split):

| step | train loss | held-out bpb (partial) | elapsed s |
|---|---|---|---|
{rows}

Greedy completion of a function header that is not in the corpus:

```python
{f['sample_prompt']}{f['sample_completion']}
```
"""


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        train(args)
    except corpus.CorpusError as exc:
        print(f"train.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
