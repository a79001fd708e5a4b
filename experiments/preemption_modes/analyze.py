"""swap vs recompute vs adaptive across prompt lengths and pool sizes: where is the crossover,
and does adaptive track the better of the two?"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import load_runs, open_sweep, plt, save_figure  # noqa: E402
from memory_common import markdown_table, write_readme  # noqa: E402

POLICIES = ["recompute", "swap", "adaptive"]


def break_even_gb_s(summary: dict, tokens: int) -> float:
    """Host-link bandwidth at which swapping ``tokens`` tokens out and in costs as much as
    recomputing them, by the run's fitted cost model (swap wins above it)."""
    c = summary["cost_model"]
    recompute_s = c["per_prefill_token_s"] * tokens + c["per_1k_attended_s"] * tokens * (tokens + 1) / 2 / 1e3
    kv_bytes = 2 * tokens / summary["block_size"] * summary["bytes_per_block"]
    return kv_bytes / recompute_s / 1e9 if recompute_s > 0 else float("inf")


def fastest_of_repeats(rows: list[dict]) -> list[dict]:
    """Keep each (pool, prompt length, policy)'s fastest repeat: on the wall clock other jobs only
    ever slow a run down, so the minimum is the least disturbed measurement; on the virtual clock
    the repeats differ only in their seeds (token ids)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["kv_blocks"], r["prompt_len"], r["policy"])
        r["repeats"] = best.get(key, {}).get("repeats", 0) + 1
        if key not in best or r["duration_s"] < best[key]["duration_s"]:
            best[key] = r
        else:
            best[key]["repeats"] = r["repeats"]
    return list(best.values())


def conclusion(rows: list[dict], verdicts: list[dict]) -> str:
    """The crossover in words, from the numbers above."""
    link = min(r["link_GB_s"] for r in rows)
    even = max(r["break_even_GB_s"] for r in rows if np.isfinite(r["break_even_GB_s"]))
    ratios = [v["swap/recompute"] for v in verdicts]
    same_work = [v for v in verdicts if v["adaptive recomputes"] == 0]
    text = (f"By the cost model, swapping is cheaper than recomputing whenever the host link is faster than "
            f"{even:.3g} GB/s for every prompt length here; the measured link is >= {link:.3g} GB/s, so there is no "
            f"crossover on this machine (it would take a link ~{link / even:.0f}x slower). Measured end to end, "
            f"swap/recompute throughput ranges {min(ratios):.2f}-{max(ratios):.2f}: the cost of either kind of "
            f"preemption is small next to the rest of these runs.")
    if same_work:
        gaps = [v["adaptive/best"] for v in same_work]
        text += (f" `adaptive` chose swap for every victim in {len(same_work)} of {len(verdicts)} configurations, "
                 f"i.e. it did exactly the work of `swap` there; its throughput relative to the better fixed policy "
                 f"({min(gaps):.2f}-{max(gaps):.2f}) is what the same work costs on another seed (on the wall clock it "
                 f"also shows the machine's noise).")
    return text


def main(sweep: Path | None = None) -> None:
    sweep, out = open_sweep(HERE, "preemption_modes", sweep)
    rows = []
    for run in load_runs(sweep, strict=False):
        s, c = run.summary, run.config
        kinds = s["num_preemptions_by_kind"]
        rows.append({"prompt_len": int(c["workload"]["prompt_len"]["mean"]), "kv_blocks": c["num_kv_blocks"],
                     "policy": c["preemption"]["name"], "duration_s": s["duration_s"], "steps": s["num_steps"],
                     "out_tok_s": s["output_throughput_tok_s"], "swaps": kinds.get("swap", 0),
                     "recomputes": kinds.get("recompute", 0), "swap_out_MB": s["swap_out_bytes"] / 2**20,
                     "recomputed_tokens": s["recomputed_tokens"], "e2e_p50_ms": s["e2e_ms"]["p50"],
                     "link_GB_s": s["swap_bandwidth_gb_s"],
                     "break_even_GB_s": break_even_gb_s(s, int(c["workload"]["prompt_len"]["mean"]) + 64)})
    rows = fastest_of_repeats(rows)
    rows.sort(key=lambda r: (r["kv_blocks"], r["prompt_len"], POLICIES.index(r["policy"])))
    verdicts = []
    for (pool, plen) in sorted({(r["kv_blocks"], r["prompt_len"]) for r in rows}):
        sel = {r["policy"]: r for r in rows if r["kv_blocks"] == pool and r["prompt_len"] == plen}
        if not all(p in sel for p in POLICIES):
            continue
        best = max(("recompute", "swap"), key=lambda p: sel[p]["out_tok_s"])
        verdicts.append({"kv_blocks": pool, "prompt_len": plen, "faster": best,
                         "swap/recompute": sel["swap"]["out_tok_s"] / sel["recompute"]["out_tok_s"],
                         "adaptive/best": sel["adaptive"]["out_tok_s"] / sel[best]["out_tok_s"],
                         "adaptive swaps": sel["adaptive"]["swaps"], "adaptive recomputes": sel["adaptive"]["recomputes"]})
    pools = sorted({r["kv_blocks"] for r in rows})
    fig, axes = plt.subplots(1, len(pools), figsize=(6 * len(pools), 4), squeeze=False)
    for ax, pool in zip(axes[0], pools):
        lens = sorted({r["prompt_len"] for r in rows if r["kv_blocks"] == pool})
        width = 0.27
        for k, policy in enumerate(POLICIES):
            vals = [next((r["out_tok_s"] for r in rows if r["kv_blocks"] == pool and r["prompt_len"] == n
                          and r["policy"] == policy), np.nan) for n in lens]
            ax.bar(np.arange(len(lens)) + (k - 1) * width, vals, width, label=policy)
        ax.set_xticks(np.arange(len(lens)), [str(n) for n in lens])
        ax.set_xlabel("prompt length (tokens; + 128 output)")
        ax.set_ylabel("output tokens / s")
        ax.set_title(f"KV pool {pool} blocks of 16")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend()
    save_figure(fig, out / "preemption_modes.png")
    cols = ["prompt_len", "kv_blocks", "policy", "out_tok_s", "duration_s", "swaps", "recomputes", "swap_out_MB",
            "recomputed_tokens", "e2e_p50_ms", "steps", "repeats", "link_GB_s", "break_even_GB_s"]
    vcols = ["kv_blocks", "prompt_len", "faster", "swap/recompute", "adaptive/best", "adaptive swaps",
             "adaptive recomputes"]
    body = ("32 requests at once, fixed prompt length x 128 output tokens, small tiny model, block 16, host pool 4096 "
            "blocks; pools of 72 and 144 blocks force preemption. Each configuration ran `repeats` times (seeds 0-2, "
            "interleaved); the row is its fastest run. `link_GB_s` is the device->host copy bandwidth "
            "measured at start-up (a real tensor copy); `break_even_GB_s` is the link speed below which recomputing "
            "a victim of prompt+64 tokens would be cheaper than swapping it out and in, by the run's fitted step-time "
            "cost model.\n\n" + markdown_table(rows, cols)
            + "\n\nWhich is faster, and how close adaptive gets to the better one (throughput ratios):\n\n"
            + markdown_table(verdicts, vcols) + "\n\n" + conclusion(rows, verdicts)
            + "\n\n![preemption modes](preemption_modes.png)\n")
    write_readme(out, "swap vs recompute vs adaptive preemption", "python run.py -m experiment=preemption_modes",
                 sweep, body)
    print(markdown_table(rows, cols))
    print(markdown_table(verdicts, vcols))


if __name__ == "__main__":
    main()
