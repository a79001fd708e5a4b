"""Speculative decoding: speed-up over plain decoding by drafter, k, sampling and load.

    python run.py -m experiment=speculative_decoding
    python experiments/speculative_decoding/analyze.py [MULTIRUN_DIR] [--update-readme]

Writes results.md and speedup.png into ``<sweep>/analysis``; ``--update-readme`` also regenerates
this experiment's committed README.md and speedup.png. Every configuration ran twice
(``+repeat``): the tables show the mean and the spread (max - min) of the throughput ratio.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import latest_sweep, load_runs, machine_note, plt, save_figure, table  # noqa: E402

SPECS = ["none"] + [f"{d}_k{k}" for d in ("ngram", "draft") for k in (1, 2, 4, 8)]
LOADS = {"low": "low load (<= 2 running)", "high": "high load (64 running)"}


def _tokens(run) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in run.requests}


def _step_ms(runs) -> tuple[float | None, float | None]:
    """Median forward pass and drafting time (ms) of the decode steps (no prefill) of ``runs``."""
    model, draft = [], []
    for run in runs:
        steps = run.steps()
        if steps is None:
            return None, None
        for step in steps:
            if step["prefill_tokens"] == 0:
                model.append(step["model_s"] * 1e3)
                draft.append(step.get("draft_s", 0.0) * 1e3)
    return (float(np.median(model)), float(np.median(draft))) if model else (None, None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep", nargs="?", type=Path)
    parser.add_argument("--update-readme", action="store_true", help="regenerate the committed README.md and plot")
    args = parser.parse_args()
    sweep = args.sweep or latest_sweep("speculative_decoding")
    groups = defaultdict(list)  # (load, temperature, spec) -> runs
    for run in load_runs(sweep):
        o = run.overrides
        groups[(o["experiment/spec_load"], float(o["workload.temperature"]), o["experiment/spec"])].append(run)

    sections, plot_data = [], {}
    for load in LOADS:
        rows = []
        for temp in (0.0, 1.0):
            base = groups.get((load, temp, "none"))
            if not base:
                continue
            base_tput = np.mean([r.summary["output_throughput_tok_s"] for r in base])
            base_tokens = _tokens(base[0])
            for spec in SPECS:
                runs = groups.get((load, temp, spec))
                if not runs:
                    continue
                ratios = [r.summary["output_throughput_tok_s"] / base_tput for r in runs]
                s = runs[0].summary
                model_ms, draft_ms = _step_ms(runs)
                same = all(_tokens(r) == base_tokens for r in runs) if temp == 0.0 else None
                rows.append([
                    "greedy" if temp == 0.0 else "T=1.0", spec,
                    float(np.mean([r.summary["output_throughput_tok_s"] for r in runs])),
                    float(np.mean(ratios)), float(max(ratios) - min(ratios)),
                    float(np.mean([r.summary["tpot_ms"]["p50"] for r in runs])),
                    s["spec_acceptance_rate"], s["spec_mean_tokens_per_verify"],
                    float(np.mean([r.summary["num_steps"] for r in runs])), model_ms, draft_ms,
                    {True: "yes", False: "NO", None: "n/a"}[same],
                ])
                if spec != "none":
                    drafter, k = spec.split("_k")
                    plot_data.setdefault((load, temp, drafter), []).append((int(k), float(np.mean(ratios))))
        sections.append(f"### {LOADS[load]}\n\n" + table(
            ["sampling", "drafter", "output tok/s", "speed-up vs none", "spread", "TPOT p50 (ms)",
             "acceptance", "tokens / verify", "steps", "forward ms", "drafting ms", "tokens = none"], rows))

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, load in zip(axes, LOADS):
        for (ld, temp, drafter), points in sorted(plot_data.items()):
            if ld != load:
                continue
            ks, ys = zip(*sorted(points))
            ax.plot(ks, ys, marker="o", linestyle="-" if drafter == "draft" else "--",
                    label=f"{'draft_model' if drafter == 'draft' else 'ngram'}, {'greedy' if temp == 0 else 'T=1.0'}")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks([1, 2, 4, 8], ["1", "2", "4", "8"])
        ax.set_xlabel("drafts per step (drafter.k)")
        ax.set_title(LOADS[load])
    axes[0].set_ylabel("output tokens/s vs drafter=none")
    axes[0].legend(fontsize=8)

    body = "\n\n".join(sections)
    text = README.format(machine=machine_note(sweep), tables=body, sweep=sweep.name, reading=_reading(plot_data))
    out = sweep / "analysis"
    out.mkdir(exist_ok=True)
    save_figure(fig, out / "speedup.png", *([HERE / "speedup.png"] if args.update_readme else []))
    (out / "results.md").write_text(text)
    print(f"wrote {out / 'results.md'} and {out / 'speedup.png'}")
    if args.update_readme:
        (HERE / "README.md").write_text(text)
        print(f"wrote {HERE / 'README.md'} and {HERE / 'speedup.png'}")


def _reading(plot_data) -> str:
    """One line per load and sampling mode: the best configuration, and where speculation loses."""
    lines = []
    for load in LOADS:
        for temp in (0.0, 1.0):
            points = [(ratio, drafter, k) for (ld, t, drafter), pts in plot_data.items() if ld == load and t == temp
                      for k, ratio in pts]
            if not points:
                continue
            best = max(points)
            losing = sorted((d, k) for r, d, k in points if r < 1.0)
            name = {"draft": "draft_model", "ngram": "ngram"}
            line = (f"- {LOADS[load]}, {'greedy' if temp == 0 else 'T=1.0'}: best {name[best[1]]} k={best[2]} at "
                    f"{best[0]:.2f}x")
            line += (f"; slower than plain decoding: {', '.join(f'{name[d]} k={k}' for d, k in losing)}."
                     if losing else "; every drafter and k pays.")
            lines.append(line)
    return "\n".join(lines)


README = """# Speculative decoding: when drafting pays

Claim under test (seed 004): speculative decoding gives 1.5-2x on code and 1.1-1.3x on creative
text at low load, and stops paying at high load (vLLM measured 1.4-1.8x *slowdowns* at high QPS).

Setup: the shipped trained target `model=tiny_code` (1.6M parameters) on held-out code prefixes
(`workload=corpus`, 96 output tokens each, EOS ignored so every configuration does the same work),
all requests at t=0; `drafter=none` vs `ngram` (prompt lookup, min_n=2, max_n=4) vs `draft_model`
(the shipped `tiny_code_draft`, 0.4M parameters, same tokenizer), `drafter.k` in {{1, 2, 4, 8}},
greedy and temperature 1.0; low load = `max_num_seqs=2`, 8 requests; high load = 64 requests
decoding together. `backend.num_threads=1`; every configuration ran twice; the speed-up is the
mean ratio of output tokens/s to `drafter=none` in the same sweep.

{machine}

Which clock: **wall**. Drafting is real compute (the draft model's k forward steps, or the
n-gram search) that no time model prices yet, so these figures are measured, not modelled:
they move between repeats on a shared machine (the *spread* column is max - min of the two
ratios).

```bash
python run.py -m experiment=speculative_decoding
python experiments/speculative_decoding/analyze.py            # tables + plot into <sweep>/analysis
python experiments/speculative_decoding/analyze.py --update-readme   # and regenerate this page
```

Sweep `{sweep}`.

{tables}

"forward ms" and "drafting ms": medians over decode steps (no prefill in the step) of the
forward pass (with `draft_model`, the target's verify plus the draft's mirror pass over the same
tokens) and of drafting the next step (the draft model's k one-token steps, or the n-gram search).

"tokens = none": greedy outputs equal `drafter=none` token for token (the tests pin this against
HF transformers for every scheduler x preemption x chunked prefill x prefix caching, and TP=2).
Sampled runs are not token-equal (rejection sampling preserves the distribution, not the draws).

![speed-up](speedup.png)

## Reading

{reading}

Where the time goes (the last two columns). Speculation trades steps for work per step. On this
CPU a tiny model's step is mostly fixed per-layer overhead, so the trade is poor: a verify of 1 +
k tokens costs well over a one-token decode (the torch reference attention takes its
multi-token path), and a draft token from `tiny_code_draft` (2 layers) costs a large fraction of
a target step (4 layers), where a 1B draft beside a 70B target reads ~1/70 of the weight bytes per step on a GPU
where a decode step is bound by reading the weights and verifying k extra tokens is nearly free.
So `draft_model` cuts the steps 3-5x at 54-87% acceptance and still barely breaks even at low
load; prompt lookup, whose drafting costs well under a millisecond, is the drafter that pays
here, on greedy code. At high load the batch is already busy, verification competes with
everyone's decode, and every configuration loses, as vLLM saw at high QPS; at temperature 1.0
acceptance falls (prompt lookup 0.1-0.4: sampled text repeats itself less) and speculation
loses too. What these runs do show on any machine: acceptance, tokens per verify and steps
(deterministic for greedy), and that outputs never change.
"""

if __name__ == "__main__":
    main()
