"""Helpers of the prefix-cache reproductions (``eviction.py``, ``admission.py``, ``block_size.py``):
``experiments/policy_pack/common.py`` (runs through the Python API, results files, the README
sections between markers), pointed at this folder's README and its own run folders.

Where results go: a fresh ``multirun/prefix_cache/<date>_<time>/<name>/`` by default; ``--out DIR``:
``DIR/<name>/``; ``--update-readme``: ``experiments/prefix_cache/<name>/`` and its README section.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _policy_pack_common():
    spec = importlib.util.spec_from_file_location("policy_pack_common", HERE.parent / "policy_pack" / "common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_PP = _policy_pack_common()
_PP.HERE, _PP.RUNS, _PP.README = HERE, _PP.REPO / "multirun" / "prefix_cache", HERE / "README.md"
_PP.SECTIONS = ("eviction", "admission", "block_size")
_PP.TITLES = {"eviction": "Eviction: lru, lfu, arc, cost_aware", "admission": "Admission: lpm vs fcfs",
              "block_size": "Block size: 8 / 16 / 32 / 64 / auto"}
_PP.PAGE_HEAD = """# Policy pack II: prefix-cache eviction, prefix-aware admission, block size

Three studies of the prefix cache's policies ([docs/policies.md](../../docs/policies.md)), one
command each: which cached block to evict (`evictor=`), which waiting request to admit
(`scheduler=lpm`) and how large a KV block is (`block_size=auto`). Each script builds its
workloads itself (seeded), runs every configuration through the Python API in one process, and
writes its results (`<name>/results.json`, `<name>/*.csv`) and plots (`<name>/*.png`);
`--update-readme` regenerates its own section below and its headline here (the numeric sentences
are generated from the results). Without it a script writes to a fresh
`multirun/prefix_cache/<date>_<time>/<name>/` and leaves this page alone.

"""

REPO = _PP.REPO
SIM_70B, plt, table, save_figure = _PP.SIM_70B, _PP.plt, _PP.table, _PP.save_figure
quiet, parse_args, run, fmt, secs, lat, mean_p = _PP.quiet, _PP.parse_args, _PP.run, _PP.fmt, _PP.secs, _PP.lat, _PP.mean_p
time_model_note, machine_line, write_json, write_csv, finish = (_PP.time_model_note, _PP.machine_line, _PP.write_json,
                                                                _PP.write_csv, _PP.finish)
KEEP = _PP.KEEP + ("prefix_cache_hit_rate", "prefill_tokens_computed", "block_size", "kv_waste_fraction", "block_size_auto")
_PP.KEEP = KEEP

# The random-weight tiny model the prefix-caching tables use (conf/experiment/prefix_caching_trace.yaml),
# priced by the committed small64 CPU profile on the virtual clock.
REAL_TINY = ["model=tiny", "model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
             "model.num_attention_heads=4", "model.num_key_value_heads=2", "clock=virtual",
             "time_model=profile_small64", "backend.num_threads=1"]


def ideal_hit_tokens(requests, block_size: int) -> int:
    """Prompt tokens an unbounded cache would serve with every earlier request already computed:
    each prompt reuses its longest run of leading full blocks seen before (the last token is always
    computed), as experiments/prefix_caching_trace/analyze.py defines it."""
    from servelab.plugins.allocators.paged import block_digest

    seen, cached = set(), 0
    for r in requests:
        tokens, n, parent, hit = r.prompt_token_ids, (r.prompt_len - 1) // block_size, b"", True
        for j in range(r.prompt_len // block_size):
            parent = block_digest(parent, tokens[j * block_size:(j + 1) * block_size])
            if hit and j < n and parent in seen:
                cached += block_size
            else:
                hit = False
            seen.add(parent)
    return cached


def real_runs(overrides: list[str], variants: dict[str, list[str]], section: str) -> tuple[dict, dict]:
    """Each variant's extra overrides on the real model, each run in a temporary folder:
    ``(tokens, summaries)``, both keyed by variant, tokens as ``{request id: output token ids}``."""
    import tempfile

    from servelab.api import compose
    from servelab.run.session import run_job

    tokens, summaries = {}, {}
    for label, extra in variants.items():
        cfg = compose(overrides + extra, logger="none", progress=False)
        with tempfile.TemporaryDirectory(prefix=f"{section}-") as tmp:
            result = run_job(cfg, tmp)
            tokens[label] = {rec["id"]: rec["output_token_ids"] for rec in result.requests}
        summaries[label] = result.summary
        print(f"  tiny {label:24s} hit rate {result.summary['prefix_cache_hit_rate']:.4f}", flush=True)
    return tokens, summaries
