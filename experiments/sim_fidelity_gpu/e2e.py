"""End to end: the simulator against published real-GPU serving measurements.

    python experiments/sim_fidelity_gpu/e2e.py              # every entry of published.yaml, seeds 1 2 3
    python experiments/sim_fidelity_gpu/e2e.py --seeds 1    # one workload draw per entry (faster)
    python experiments/sim_fidelity_gpu/e2e.py --only lambda_vllm054_llama3_8b_a100_burst320 --max-requests 40

For each entry of ``published.yaml`` (source, engine, hardware, model, TP, dataset, conditions, figures)
it rebuilds the workload (ShareGPT first-turn lengths filtered as the benchmark filtered them, or the
published per-request lengths; Poisson arrivals at the published rate, or all at once for offline runs),
sets the engine's published or default limits (memory fraction, ``max_num_seqs``, step token budget,
chunked prefill), runs ``backend=sim`` with the default ``time_model=auto`` and compares median TPOT,
median end-to-end latency and throughput. It writes ``e2e_results.json`` and the "End to end against
published measurements" section of ``README.md`` (``run.py`` renders the same section from the JSON).

**Rule:** the time model's constants are fitted only to operator-level measurements. Nothing here
changes a coefficient: the published request-level figures only validate. The seeds are fixed in
advance (1, the seed of SGLang's bench_serving, then 2 and 3 for the spread), never chosen by result.

The full request counts are simulated (1,200 to 5,000 per entry); the whole script takes about three
minutes on this project's 2-core machine. ``--max-requests N`` samples each entry down (tests).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
PUBLISHED = HERE / "published.yaml"
POOL = HERE / "sharegpt_v3_llama3_first_turn.csv"
RESULTS = HERE / "e2e_results.json"
README = HERE / "README.md"
BEGIN, END = "<!-- e2e:begin -->", "<!-- e2e:end -->"
SEEDS = (1, 2, 3)

# published figure -> (summary key, latency field or None)
METRICS = {
    "median_tpot_ms": ("tpot_ms", "p50"),
    "median_e2e_ms": ("e2e_ms", "p50"),
    "request_throughput_req_s": ("request_throughput_req_s", None),
    "output_throughput_tok_s": ("output_throughput_tok_s", None),
    "median_ttft_ms": ("ttft_ms", "p50"),
}
LABEL = {"median_tpot_ms": "median TPOT (ms)", "median_e2e_ms": "median E2E (ms)",
         "request_throughput_req_s": "throughput (req/s)", "output_throughput_tok_s": "output throughput (tok/s)",
         "median_ttft_ms": "median TTFT (ms)"}
# The targets (reported, never forced): (name, entry ids, metrics, bound)
TARGETS = [
    ("70B on 4 x H100 and 8B on 1 x A100 at moderate load (RPS 4, 8): median TPOT and E2E within 10%",
     ["sglangpage_vllm_llama31_8b_a100_rps4", "sglangpage_vllm_llama31_8b_a100_rps8",
      "sglangpage_vllm_llama31_70b_4xh100_rps4", "sglangpage_vllm_llama31_70b_4xh100_rps8"],
     ["median_tpot_ms", "median_e2e_ms"], 0.10),
    ("offline throughput within 15%",
     ["sglangpage_vllm_llama31_8b_a100_offline", "sglangpage_vllm_llama31_70b_4xh100_offline"],
     ["request_throughput_req_s"], 0.15),
]
COMPONENTS = ("layers", "communication", "attention", "lm_head", "host")


def load_published(path: Path = PUBLISHED) -> dict:
    return yaml.safe_load(Path(path).read_text())


def sharegpt_pool(lengths: dict) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of the ShareGPT first turns that pass the benchmark's filter."""
    rows = np.loadtxt(POOL, delimiter=",", skiprows=1, dtype=np.int64, ndmin=2)
    p, o = rows[:, 0], rows[:, 1]
    keep = ((p >= lengths["min_prompt"]) & (p <= lengths["max_prompt"]) & (o >= lengths["min_output"])
            & (p + o <= lengths["max_total"]))
    return p[keep], o[keep]


def workload(entry: dict, seed: int, max_requests: int | None = None) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens) of every request of ``entry`` under ``seed``."""
    c = entry["conditions"]
    lengths = c["lengths"]
    rng = np.random.default_rng(seed)
    if lengths["kind"] == "sharegpt_first_turn":
        p, o = sharegpt_pool(lengths)
        n = c["num_prompts"] if max_requests is None else min(max_requests, c["num_prompts"])
        pick = rng.choice(len(p), size=n, replace=False)
        prompt, output = p[pick], o[pick]
    elif lengths["kind"] == "per_request":
        prompt = np.asarray(lengths["input_lens"], dtype=np.int64)
        output = np.maximum(1, np.asarray(lengths["output_lens"], dtype=np.int64))  # empty text: 1 token (EOS)
        if max_requests is not None and max_requests < len(prompt):
            pick = np.sort(rng.choice(len(prompt), size=max_requests, replace=False))
            prompt, output = prompt[pick], output[pick]
    else:
        raise ValueError(f"{entry['id']}: unknown lengths kind {lengths['kind']!r}")
    n = len(prompt)
    if c["arrival"] == "offline":
        arrivals = np.zeros(n)
    elif c["arrival"] == "poisson":  # the client sends the first request at once, then waits Exp(1/rate)
        arrivals = np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / float(c["rate"]), size=n - 1))])
    else:
        raise ValueError(f"{entry['id']}: unknown arrival {c['arrival']!r}")
    return [(float(a), int(pl), int(ol)) for a, pl, ol in zip(arrivals, prompt, output)]


def overrides(entry: dict, seed: int) -> list[str]:
    """The simulator's config for ``entry``: the published (or engine-default) limits, time_model=auto."""
    c = entry["conditions"]
    return ["backend=sim", f"hardware={entry['hardware']}", f"model={entry['model']}",
            f"tensor_parallel_size={entry['tp']}", f"max_model_len={c['max_model_len']}",
            f"max_num_seqs={c['max_num_seqs']}", f"max_num_batched_tokens={c['max_num_batched_tokens']}",
            f"chunked_prefill={str(bool(c['chunked_prefill'])).lower()}", f"block_size={c['block_size']}",
            f"backend.gpu_memory_utilization={c['gpu_memory_utilization']}", f"seed={seed}",
            "allocator.prefix_caching=false", "debug.log_steps=false"]


def simulate(entry: dict, seed: int = SEEDS[0], max_requests: int | None = None, breakdown: bool = False) -> dict:
    """Run ``entry`` once in the simulator; the figures it publishes, and what priced the steps."""
    from servelab.api import compose
    from servelab.core.request import Request
    from servelab.run.session import run_job
    from servelab.run.stack import build_stack

    cfg = compose(overrides(entry, seed), logger="none", progress=False)
    reqs = workload(entry, seed, max_requests)
    stack = build_stack(cfg)
    vocab = stack.executor.spec.vocab_size
    rng = np.random.default_rng(seed)
    requests = [Request(id=f"r{i}", prompt_token_ids=tuple(rng.integers(1, vocab, size=pl).tolist()),
                        max_tokens=ol, arrival_time=a, ignore_eos=True) for i, (a, pl, ol) in enumerate(reqs)]
    parts = dict.fromkeys(COMPONENTS, 0.0)
    tm = stack.time_model
    if breakdown and hasattr(tm, "breakdown"):
        plain = tm.predict

        def priced(work):
            for k, v in tm.breakdown(work).items():
                if k in parts:
                    parts[k] += v
            return plain(work)

        tm.predict = priced
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        try:
            s = run_job(cfg, out, requests=requests, stack=stack).summary
        finally:
            stack.executor.shutdown()
    wall = time.perf_counter() - start
    sim = {}
    for name, (key, field) in METRICS.items():
        v = s.get(key)
        sim[name] = (v or {}).get(field) if field else v
    outs = np.array([ol for _, _, ol in reqs])
    tmd = s.get("time_model") or {}
    total = sum(parts.values())
    return {"simulated": sim, "num_requests": len(reqs), "num_finished": s["num_finished"],
            "mean_prompt": float(np.mean([pl for _, pl, _ in reqs])), "mean_output": float(outs.mean()),
            "median_output": float(np.median(outs)), "duration_s": s["duration_s"], "num_steps": s["num_steps"],
            "max_concurrent_requests": s["max_concurrent_requests"], "num_preemptions": s["num_preemptions"],
            "num_kv_blocks": s["num_kv_blocks"], "wall_s": wall,
            "time_model": {"chosen": tmd.get("chosen", tmd.get("name")), "why": tmd.get("why"),
                           "priced_by": tmd.get("priced_by")},
            "time_share": {k: v / total for k, v in parts.items()} if total > 0 else None}


def _err(sim, pub):
    return None if sim is None or pub in (None, 0) else sim / pub - 1


def run_entries(entries: list[dict], seeds=SEEDS, max_requests: int | None = None, log=print) -> dict:
    out = []
    for e in entries:
        kind = e["conditions"]["lengths"]["kind"]
        entry_seeds = list(seeds) if kind == "sharegpt_first_turn" else list(seeds)[:1]  # per-request: deterministic
        runs = []
        for i, seed in enumerate(entry_seeds):
            runs.append(simulate(e, seed, max_requests, breakdown=(i == 0)))
            log(f"{e['id']} seed {seed}: " + ", ".join(
                f"{k} {runs[-1]['simulated'][k]:.4g}" for k in e["figures"] if runs[-1]["simulated"].get(k) is not None)
                + f" ({runs[-1]['wall_s']:.1f} s)")
        main = runs[0]
        metrics = {}
        for name, pub in {**e["figures"], **{k: v for k, v in (e.get("also_reported") or {}).items() if k in METRICS}}.items():
            vals = [r["simulated"].get(name) for r in runs]
            errs = [_err(v, pub) for v in vals if v is not None]
            metrics[name] = {"published": pub, "simulated": vals[0], "error": _err(vals[0], pub),
                             "simulated_by_seed": vals, "error_range": [min(errs), max(errs)] if errs else None,
                             "scored": name in e["figures"]}
        c = e["conditions"]
        implied = None
        also = e.get("also_reported") or {}
        if {"median_e2e_ms", "median_tpot_ms"} <= e["figures"].keys() and "median_ttft_ms" in also:
            f = e["figures"]
            implied = (f["median_e2e_ms"] - also["median_ttft_ms"]) / f["median_tpot_ms"] + 1
        out.append({
            "id": e["id"], "source": {k: e["source"].get(k) for k in ("short", "url", "title", "date")},
            "engine": f"{e['engine']['name']} {e['engine']['version']}", "hardware": e["hardware"], "model": e["model"],
            "tp": e["tp"], "published_setup": f"{e['model_published']} on {e['hardware_published']}",
            "load": "offline" if c["arrival"] == "offline" else f"{c['rate']} req/s Poisson",
            "num_prompts_published": c["num_prompts"], "num_requests_simulated": main["num_requests"],
            "seeds": entry_seeds, "metrics": metrics,
            "workload": {k: main[k] for k in ("mean_prompt", "mean_output", "median_output")},
            "published_implied_median_output": implied,
            "run": {k: main[k] for k in ("duration_s", "num_steps", "max_concurrent_requests", "num_preemptions",
                                         "num_kv_blocks", "num_finished")},
            "time_model": main["time_model"], "time_share": main["time_share"],
            "wall_s": sum(r["wall_s"] for r in runs)})
    return {"generated": dt.date.today().isoformat(),
            "rule": "constants are fitted only to operator-level measurements; these request-level figures only "
                    "validate and are never used to fit, tune or choose a coefficient",
            "seeds": list(seeds), "max_requests": max_requests, "entries": out, "targets": targets(out)}


def targets(entries: list[dict]) -> list[dict]:
    by_id = {e["id"]: e for e in entries}
    res = []
    for name, ids, metrics, bound in TARGETS:
        cells = [(i, m, by_id[i]["metrics"][m]["error"]) for i in ids if i in by_id for m in metrics]
        if not cells:
            continue
        worst = max(abs(err) for _, _, err in cells)
        res.append({"target": name, "bound": bound, "holds": worst <= bound, "worst_abs_error": worst,
                    "misses": [f"{i} {m} {100 * err:+.1f}%" for i, m, err in cells if abs(err) > bound]})
    return res


# ---------------------------------------------------------------------------------------------- page
def _pct(v):
    return "n/a" if v is None else f"{100 * v:+.1f}%"


def _num(v):
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.2f}"


def render_section(results: dict | None) -> str:
    """The README's "End to end against published measurements" section (markers included)."""
    head = "## End to end against published measurements\n\n"
    if not results:
        return (f"{BEGIN}\n{head}Not run yet: `python experiments/sim_fidelity_gpu/e2e.py` writes "
                f"`e2e_results.json` and this section.\n{END}\n")
    rows, diag = [], []
    for e in results["entries"]:
        src = f"[{e['source'].get('short') or e['source']['title']}]({e['source']['url']})"
        setup = (f"{e['engine']}, {e['model']} {e['hardware']} TP{e['tp']}, {e['load']}, "
                 f"{e['num_requests_simulated']:,} req")
        for name, m in e["metrics"].items():
            if not m["scored"]:
                continue
            lo, hi = m["error_range"] or (None, None)
            spread = "" if len(e["seeds"]) < 2 else f"{_pct(lo)} .. {_pct(hi)}"
            rows.append([src, setup, LABEL[name], _num(m["published"]), _num(m["simulated"]), _pct(m["error"]), spread])
        share = e["time_share"] or {}
        ttft = e["metrics"].get("median_ttft_ms")
        diag.append([e["id"], f"{e['workload']['mean_prompt']:.0f} / {e['workload']['mean_output']:.0f}",
                     f"{e['workload']['median_output']:.0f}",
                     "n/a" if e["published_implied_median_output"] is None else f"{e['published_implied_median_output']:.0f}",
                     "n/a" if not ttft else f"{_num(ttft['published'])} / {_num(ttft['simulated'])}",
                     e["run"]["max_concurrent_requests"], e["run"]["num_preemptions"],
                     " / ".join(f"{100 * share.get(k, 0):.0f}" for k in COMPONENTS) if share else "n/a",
                     e["time_model"]["chosen"]])
    t_rows = [[t["target"], f"{100 * t['worst_abs_error']:.1f}%", "yes" if t["holds"] else "no",
               "; ".join(t["misses"]) or "-"] for t in results["targets"]]
    table = _table(["source", "setup (simulated)", "metric", "published", "simulated (seed 1)", "error",
                    "error over seeds"], rows)
    diag_t = _table(["entry", "mean prompt / output (tok)", "median output (tok)",
                     "published implied median output", "median TTFT pub / sim (ms)", "max batch", "preemptions",
                     "sim time %: layers / all-reduce / attention / LM head / host", "time model"], diag)
    sampled = (f" Each entry was sampled down to at most {results['max_requests']} requests."
               if results.get("max_requests") else " Every entry simulates its full published request count.")
    return f"""{BEGIN}
{head}Regenerate: `python experiments/sim_fidelity_gpu/e2e.py` (about three minutes on 2 cores; writes
`e2e_results.json` and this section; `run.py` renders it from that file). Sources, conditions and the
figures, each with the table row or JSON key it was copied from, are in
[published.yaml](published.yaml).

**Rule:** the time model's constants are fitted only to operator-level measurements (the tables
above). These request-level published figures validate; they are never used to fit, tune or choose a
coefficient, and nothing here was changed after seeing them. The simulator runs with its defaults
(`backend=sim`, `time_model=auto`) and the engine limits each source states or its engine's defaults
(memory fraction, `max_num_seqs`, step token budget, chunked prefill).

Workloads: ShareGPT first turns under the Llama-3 tokenizer, filtered as the benchmark filters
(4 <= prompt <= 1024, output >= 4, prompt + output <= 2048), each request generating its completion
length (the clients sent `ignore_eos`), Poisson arrivals at the published rate or all at once (offline),
drawn with seed 1 (the benchmark client's default); seeds 2 and 3 give the spread. The pool is the
17,400 conversations at the start of ShareGPT V3 (the copy at hand is truncated,
[sharegpt_lengths.py](sharegpt_lengths.py)), so the published runs' exact draw is not rebuilt. Lambda's runs list every request's lengths, used as
published.{sampled} Generated {results['generated']}.

Error = simulated / published - 1.

{table}

### Targets (reported, not forced)

{_table(["target", "worst abs. error", "holds", "misses"], t_rows)}

### What drives the differences

{diag_t}

- *published implied median output* = (median E2E - median TTFT) / median TPOT + 1 of the published
  row: roughly the output length of the published run's median request. Where it is shorter than the
  simulated sample's median output, the simulated median E2E is long for workload reasons, not time.
- *sim time %*: where the simulated step time went (first seed), by the part of the time model that
  priced it: decoder layers and all-reduce from the measured op tables, attention and the LM head from
  the calibrated roofline, the host from the calibrated roofline's host term (no host table exists for
  these shapes).
- The all-reduce share of the 70B TP 4 rows is Vidur's NCCL kernel time, about 39 us per call at
  decode batch sizes on H100 (160 calls a step); vLLM and SGLang run their own one-shot all-reduce
  kernel on NVLink at TP <= 8, which that table did not measure.
- SGLang's offline 70B rows prefill in 8192-token chunks, beyond the H100 tables' measured 4,096
  tokens: those steps are extrapolated in proportion (the run warns once per table).
- Not modelled: vLLM v0.6.0's multi-step scheduling (`--num-scheduler-steps 10`: prompts join only every
  10 steps, outputs stream in chunks of 10, which lifts the published TTFT and ITL); vLLM v0's
  prefill-only steps (servelab's step puts decodes and whole prompts together, vLLM v1 style); SGLang's
  separate prefill batches, radix scheduling and `--enable-torch-compile`; CUDA graphs; the API server's
  and detokenizer's CPU time, which vLLM v0.5.4 (Lambda's runs) spends in the engine's own process.
{END}
"""


def _table(headers, rows) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def update_readme(section: str, readme: Path = README) -> None:
    """Replace the marked section of the README (or add it before "## Not yet")."""
    text = readme.read_text() if readme.is_file() else ""
    if BEGIN in text and END in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + section.rstrip("\n") + text[b:]
    elif "## Not yet" in text:
        text = text.replace("## Not yet", section + "\n## Not yet", 1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    readme.write_text(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--only", nargs="+", help="entry ids")
    ap.add_argument("--max-requests", type=int, help="sample each entry down to at most N requests")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--no-readme", action="store_true", help="write the JSON only")
    args = ap.parse_args(argv)
    entries = load_published()["entries"]
    if args.only:
        unknown = set(args.only) - {e["id"] for e in entries}
        if unknown:
            raise SystemExit(f"unknown entry ids: {sorted(unknown)}")
        entries = [e for e in entries if e["id"] in args.only]
    results = run_entries(entries, tuple(args.seeds), args.max_requests)
    args.out.write_text(json.dumps(results, indent=1, default=lambda v: None if isinstance(v, float) and math.isnan(v) else v) + "\n")
    if not args.no_readme:
        update_readme(render_section(results))
    for t in results["targets"]:
        print(f"target: {t['target']}: {'holds' if t['holds'] else 'misses'} (worst {100 * t['worst_abs_error']:.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
