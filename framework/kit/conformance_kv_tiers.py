"""The conformance kit's KV tier policy checks (``servelab check-plugin kv_tier_policy=<name>``).

A tier policy never changes what is computed, only which blocks are kept below the GPU and for how
long, so it is checked in the simulator: multi-turn chats (every turn repeats the conversation) on
the tiny model with a GPU pool far below the working set, above a host tier of
:data:`HOST_BLOCKS` blocks and a disk tier of :data:`DISK_BLOCKS`, so that the GPU evicts, the host
fills and demotes, and the disk drops. The store records every event (store, move, drop, load,
prefetch);
the kit replays them against its own ledger:

- "valid answers": every answer of the policy is one the store may act on (a held victim, a tier
  below, ...); the store stops the run naming the policy otherwise;
- "loads return the stored blocks": every load reads a block the ledger has in that tier (stored
  there, not moved or dropped since): in the simulator a block *is* its prefix digest;
- "prefetches read stored blocks": every block a policy prefetches (``prefetch``) for a queued
  request is one the ledger has in that tier, and no more blocks are read by admissions as
  prefetched than were prefetched (a prefetch never takes a block out of its tier);
- "capacities respected": no tier ever holds more blocks than its capacity, and a block is in one
  tier at most;
- "no block lost while referenced": every request ends and no GPU block stays held;
- "deterministic": the same run twice gives the same requests and the same figures.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

HOST_BLOCKS, DISK_BLOCKS = 12, 40
RUN = ("backend=sim", "model=tiny_code", "workload=chat_sessions", "workload.num_sessions=10",
       "workload.session_rate=4.0", "workload.think_time_s=1.0", "workload.num_system_prompts=3",
       "workload.system_prompt_len.min=32", "workload.system_prompt_len.max=96", "workload.user_len.max=48",
       "workload.output_len.max=32", "workload.turns.min=2", "workload.turns.max=4", "num_kv_blocks=40",
       "logger=none", "progress=false", "kv_tiers=host_disk")


def check_kv_tier_policy(run: "KitRun") -> "Failure | None":
    from servelab.kit.conformance import Failure  # noqa: PLC0415 - the kit's module imports this one by name

    seeds = range(run.seed, run.seed + max(1, min(run.cases, 3)))
    first: tuple | None = None
    for i, seed in enumerate(seeds):
        load = "serialize" if i % 2 else "overlap"
        overrides = (*RUN, f"seed={seed}", f"kv_tiers.load={load}", f"kv_tier_policy={run.name}", *run.extra)
        try:
            outcome = _run(run, overrides)
        except Exception as exc:  # noqa: BLE001 - a policy's error is the finding
            return Failure("valid answers", f"{type(exc).__name__}: {exc} (run: {' '.join(overrides)})")
        if isinstance(outcome, Failure):
            return outcome
        if first is None:
            first = outcome
            try:
                again = _run(run, overrides)
            except Exception as exc:  # noqa: BLE001
                return Failure("deterministic", f"the second run raised {type(exc).__name__}: {exc}")
            if not isinstance(again, Failure) and again != outcome:
                return Failure("deterministic", f"two runs of {' '.join(overrides)} differ")
    run.report.cases = len(seeds)
    run.report.notes.append(f"kv tiers: {len(seeds)} chat runs on the simulator (GPU 40 blocks, host {HOST_BLOCKS}, "
                            f"disk {DISK_BLOCKS}), every store/move/drop/load/prefetch replayed against a ledger")
    return None


def _run(run: "KitRun", overrides: tuple[str, ...]):
    from servelab.api import compose  # noqa: PLC0415 - above the kit's core imports
    from servelab.kit.conformance import Failure  # noqa: PLC0415
    from servelab.kv.connectors import find_part  # noqa: PLC0415
    from servelab.kv.tiers.store import TieredKVConnector  # noqa: PLC0415
    from servelab.run.session import run_job  # noqa: PLC0415
    from servelab.assemble.stack import build_stack  # noqa: PLC0415

    cfg = compose(list(overrides))
    probe = build_stack(compose([*overrides, "kv_tier_policy=none"]), run.registry)
    per_block = probe.executor.bytes_per_block
    cfg.kv_tiers.tiers[0].capacity_gib = HOST_BLOCKS * per_block / 2**30
    cfg.kv_tiers.tiers[1].capacity_gib = DISK_BLOCKS * per_block / 2**30
    stack = build_stack(cfg, run.registry)
    store = find_part(stack.engine.connector, TieredKVConnector)
    if not isinstance(store, TieredKVConnector):  # a policy that stores nothing (``stores = False``)
        return ("no store",)
    store.trace = []
    with tempfile.TemporaryDirectory() as out:
        result = run_job(cfg, out, stack=stack)
        requests = (Path(out) / "requests.jsonl").read_text()
    summary = result.summary
    problem = _replay(store.trace, [t.num_blocks for t in store.tiers])
    if problem is not None:
        return Failure(*problem)
    if summary["num_finished"] + summary["num_rejected"] != summary["num_requests"] or summary["leaked_blocks"]:
        return Failure("no block lost while referenced", f"{summary['num_finished']} of {summary['num_requests']} "
                       f"requests finished, {summary['leaked_blocks']} GPU blocks left held")
    if not 0 <= summary["kv_tier_prefetch_used_blocks"] <= summary["kv_tier_prefetch_blocks"]:
        return Failure("prefetches read stored blocks", f"{summary['kv_tier_prefetch_used_blocks']} prefetched "
                       f"blocks read by admissions, of {summary['kv_tier_prefetch_blocks']} prefetched")
    figures = {k: v for k, v in summary.items() if k.startswith("kv_tier")}
    return requests, json.dumps(figures, sort_keys=True)


def _replay(trace: list[tuple], capacity: list[int]) -> tuple[str, str] | None:
    """Replay the store's events against a ledger; the first broken contract and why, or None."""
    held: list[set[bytes]] = [set() for _ in capacity]
    where: dict[bytes, int] = {}
    for n, (event, tier, digest, *rest) in enumerate(trace):
        if event == "prefetch":
            if where.get(digest) != tier:
                return ("prefetches read stored blocks", f"event {n}: block {digest.hex()[:12]} prefetched from "
                        f"tier {tier}, where the ledger has {where.get(digest)}")
            continue
        if event == "load":
            if where.get(digest) != tier:
                return ("loads return the stored blocks", f"event {n}: block {digest.hex()[:12]} loaded from tier "
                        f"{tier}, where the ledger has {where.get(digest)}")
            continue
        if event in ("drop", "move"):
            if where.get(digest) != tier:
                return ("capacities respected", f"event {n}: {event} of block {digest.hex()[:12]} from tier {tier}, "
                        "which does not hold it")
            held[tier].discard(digest)
            del where[digest]
            if event == "drop":
                continue
            tier = rest[0]
        if digest in where:
            return ("capacities respected", f"event {n}: block {digest.hex()[:12]} stored in tier {tier} while tier "
                    f"{where[digest]} holds it")
        held[tier].add(digest)
        where[digest] = tier
        if len(held[tier]) > capacity[tier]:
            return ("capacities respected", f"event {n}: tier {tier} holds {len(held[tier])} blocks, capacity "
                    f"{capacity[tier]}")
    return None
