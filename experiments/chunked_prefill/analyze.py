"""Chunked prefill on/off: decode stalls (ITL/TPOT) of running chat requests vs TTFT.

    python run.py -m experiment=chunked_prefill
    python experiments/chunked_prefill/analyze.py [MULTIRUN_DIR]

Writes README.md, latency.png and itl_cdf.png next to this script.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import load_runs, machine_note, open_sweep, plt, save_figure, table, write_page  # noqa: E402

ORDER = ["whole", "whole_decode_first", "chunk512", "chunk256", "chunk128"]
LABELS = {"whole": "off, prefill_first (default)", "whole_decode_first": "off, decode_first"}


def pct(values, q):
    values = [v for v in values if v is not None]
    return float(np.percentile(values, q)) if values else None


def main() -> None:
    sweep, out = open_sweep(HERE, "chunked_prefill")
    runs = {r.overrides["experiment/prefill"]: r for r in load_runs(sweep)}
    modes = [m for m in ORDER if m in runs]
    label = {m: LABELS.get(m, f"on, {m[5:]}-token budget") for m in modes}
    ref_tokens = {r["id"]: r["output_token_ids"] for r in runs[modes[0]].requests}
    same = all({r["id"]: r["output_token_ids"] for r in runs[m].requests} == ref_tokens for m in modes)

    rows, stats = [], {}
    for m in modes:
        reqs = runs[m].requests
        chat = [r for r in reqs if r["id"].startswith("chat")]
        docs = [r for r in reqs if r["id"].startswith("doc")]
        itl = [x for r in chat for x in r["itl_ms"]]
        s = stats[m] = {
            "itl_p50": pct(itl, 50), "itl_p99": pct(itl, 99), "itl_max": max(itl),
            "tpot_p99": pct([r["tpot_ms"] for r in chat], 99),
            "ttft_chat_p50": pct([r["ttft_ms"] for r in chat], 50), "ttft_chat_p99": pct([r["ttft_ms"] for r in chat], 99),
            "ttft_doc_p50": pct([r["ttft_ms"] for r in docs], 50), "ttft_doc_p99": pct([r["ttft_ms"] for r in docs], 99),
            "itl": itl,
        }
        sm = runs[m].summary
        rows.append([label[m], s["itl_p50"], s["itl_p99"], s["itl_max"], s["tpot_p99"], s["ttft_chat_p50"],
                     s["ttft_chat_p99"], s["ttft_doc_p50"], s["ttft_doc_p99"], sm["output_throughput_tok_s"],
                     sm["num_steps"]])

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    x = np.arange(len(modes))
    axes[0].bar(x - 0.2, [stats[m]["itl_p99"] for m in modes], 0.4, label="chat ITL p99")
    axes[0].bar(x + 0.2, [stats[m]["tpot_p99"] for m in modes], 0.4, label="chat TPOT p99")
    axes[0].set(ylabel="ms", title="Decode stalls of running requests")
    axes[1].bar(x - 0.2, [stats[m]["ttft_chat_p99"] for m in modes], 0.4, label="chat TTFT p99")
    axes[1].bar(x + 0.2, [stats[m]["ttft_doc_p99"] for m in modes], 0.4, label="long-doc TTFT p99")
    axes[1].set(ylabel="ms", title="Time to first token")
    for ax in axes:
        ax.set_xticks(x, [{"whole": "off", "whole_decode_first": "off, d-first"}.get(m, m) for m in modes], fontsize=8)
        ax.legend(fontsize=8)
    save_figure(fig, out / "latency.png")

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for m in modes:
        v = np.sort(stats[m]["itl"])
        ax.plot(v, 1 - np.arange(len(v)) / len(v), label=label[m])
    ax.set(xscale="log", yscale="log", xlabel="inter-token latency of chat requests (ms)",
           ylabel="fraction of gaps >= x", title="ITL tail")
    ax.legend(fontsize=8)
    save_figure(fig, out / "itl_cdf.png")

    off, on = stats["whole"], stats.get("chunk256", stats[modes[-1]])
    if on["ttft_doc_p99"] < off["ttft_doc_p99"]:
        doc_note = ("In this run the long documents' TTFT is even lower with chunking: the torch reference "
                    "attention pads every prompt of a step to the longest one, so whole-prompt steps that mix a "
                    "document with chat prompts cost more, and whole-prompt mode fell behind the arrivals.")
    else:
        doc_note = ("The long documents pay for it: their p99 TTFT rises from "
                    f"{off['ttft_doc_p99']:.0f} ms to {on['ttft_doc_p99']:.0f} ms at a 256-token budget.")
    schedule_note = ""
    if "whole_decode_first" in stats:
        pf, df = stats["whole"], stats["whole_decode_first"]
        schedule_note = f"""
Off has two schedules (`non_chunked_schedule`, [docs/policies.md](../../docs/policies.md#chunked-prefill)):
`prefill_first`, the default since issue 35 (vLLM v0's `_schedule_default` and SGLang without a mixed
chunk: waiting prompts run whole in prompt-only steps, the running decodes pause for them), and
`decode_first`, the only schedule before it (running decodes first, a whole prompt only into the
budget they leave; this page's "off" row until then, reproduced here to the digit). Here the 2,048-token
budget always has room for a prompt next to the decodes, so the two differ only in whether a prompt's
step also carries the decodes: prefill_first lowers chat TTFT p50 ({df['ttft_chat_p50']:.1f} ->
{pf['ttft_chat_p50']:.1f} ms) and doc TTFT p99 ({df['ttft_doc_p99']:.0f} -> {pf['ttft_doc_p99']:.0f} ms), and the
decodes pay with a longer stall (chat ITL p99 {df['itl_p99']:.0f} -> {pf['itl_p99']:.0f} ms, worst gap
{df['itl_max']:.0f} -> {pf['itl_max']:.0f} ms: a prompt-only step followed by the decode step it delayed).
Where decodes fill the budget the gap is of another order: on the first 2,000 requests of the Azure
conversation trace at Llama-2-70B TP 4 on simulated H100s (4,096-token budget, 256 seats) median TTFT is
185.9 s with decode_first and 0.108 s with prefill_first (issue 35 item 2; the command is in
docs/policies.md).
"""
    text = f"""# Chunked prefill on / off

{machine_note(sweep)}

    python experiments/chunked_prefill/make_workload.py  # workload.jsonl (committed)
    python run.py -m experiment=chunked_prefill           # conf/experiment/chunked_prefill.yaml
    python experiments/chunked_prefill/analyze.py         # this page and the plots

Workload (`workload.jsonl`): 32 chat requests (prompts 32-64 tokens, 96-128 output tokens, Poisson
at 6 req/s) that are decoding when 8 long documents arrive (prompts 1,024-1,536 tokens, 8-16 output
tokens, one every 0.6 s). Default tiny model (256 wide, 4 layers), fcfs, 1 torch thread. Off:
`chunked_prefill=false max_num_batched_tokens=2048` (a prompt runs whole in one step), with
`non_chunked_schedule=prefill_first` (default) or `decode_first`; on:
`chunked_prefill=true` with a step budget of 512 / 256 / 128 tokens (decodes first, then a chunk
that fills the rest).

**Chat p99 inter-token latency: {off['itl_p99']:.0f} ms off -> {on['itl_p99']:.0f} ms on (256-token
budget); worst gap {off['itl_max']:.0f} -> {on['itl_max']:.0f} ms. Long-document p99 TTFT:
{off['ttft_doc_p99']:.0f} -> {on['ttft_doc_p99']:.0f} ms.** Token outputs identical in every run: {"yes" if same else "NO"}.

{table(["chunked prefill", "chat ITL p50 ms", "chat ITL p99 ms", "chat ITL max ms", "chat TPOT p99 ms",
        "chat TTFT p50 ms", "chat TTFT p99 ms", "doc TTFT p50 ms", "doc TTFT p99 ms", "output tok/s", "steps"], rows)}

![latency](latency.png) ![ITL tail](itl_cdf.png)
{schedule_note}
Reading: without chunking a long prompt occupies a whole step, and every running request waits
for it: those steps are the ITL tail. Chunking bounds each step to the token budget, so the stall
a decode sees shrinks with the budget, at the price of spreading a long prompt's prefill over
more steps (its TTFT) and more steps overall. {doc_note} On the virtual clock (the preset's default) the times
are the profile's prices for the steps the real model ran, so they reproduce exactly; on the wall
clock (`clock=wall time_model=measured`) they move with the machine's load.
"""
    write_page(out, text)


if __name__ == "__main__":
    main()
