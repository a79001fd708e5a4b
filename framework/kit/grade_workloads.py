"""The fixed workloads ``servelab grade`` scores a plugin on.

Each is a seeded list of requests plus the engine settings it runs under, on the simulator
(``backend=sim``, the roofline time model, the virtual clock): the same numbers on every
machine, a few hundred milliseconds a run. Changing one changes every grade: add, don't edit.
A workload grades the kinds it names (``kinds``): an evictor is graded only where a prefix cache
thrashes, a router only on a cluster (``cluster_chat``), a migration policy on a cluster whose loads drift
apart (``cluster_drift``), the other kinds only where they were graded
before evictors came.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from servelab.core.kinds import KINDS
from servelab.core.request import Request
from servelab.workloads.grade import (VOCAB, chat_burst, cluster_chat, cluster_drift,  # noqa: F401
                                      fairness_flood, long_prompts, prefix_thrash, tight_pool)

# Priced on a catalogue model and GPU: no weights, no device, the same on every machine.
SIM = ("backend=sim", "model=llama3_8b", "hardware=h100", "seed=0", "max_num_seqs=32")


@dataclass(frozen=True)
class GradeWorkload:
    """``name``; what it stresses; the overrides it runs under (after :data:`SIM`); its requests."""

    name: str
    about: str
    overrides: tuple[str, ...]
    requests: Callable[[], list[Request]]
    #: The clients whose goodput is the score (None: every request's). A fairness workload scores
    #: the goodput of the client that behaves: what it keeps while another floods the server.
    scored_clients: tuple[str, ...] | None = None
    kinds: tuple[str, ...] = ("scheduler", "allocator", "preemption")  # the plugin kinds it grades


WORKLOADS = (
    GradeWorkload("chat_burst", "bursty chat mix, two SLO classes", ("max_model_len=2048",), chat_burst),
    GradeWorkload("long_prompts", "long prompts, short answers", ("max_model_len=8192",), long_prompts),
    GradeWorkload("tight_pool", "small KV pool: preemptions", ("max_model_len=2048", "num_kv_blocks=256",
                                                               "backend.num_swap_blocks=512"), tight_pool),
    GradeWorkload("fairness_flood", "two clients, one flooding: the steady client's goodput",
                  ("max_model_len=2048",), fairness_flood, scored_clients=("steady",)),
    GradeWorkload("prefix_thrash", "shared prefixes and one-off long prompts through a 3,072-block prefix cache",
                  ("max_model_len=8192", "allocator.prefix_caching=true", "num_kv_blocks=3072"), prefix_thrash,
                  kinds=("evictor",)),
    GradeWorkload("cluster_chat", "multi-turn chat with shared system prompts through 4 busy replicas",
                  ("max_model_len=8192", "cluster.replicas=4", "allocator.prefix_caching=true"), cluster_chat,
                  kinds=("router",)),
    GradeWorkload("tier_chat", "prefix_thrash's traffic over a 3,072-block GPU pool, a 1 GiB host tier and a disk",
                  ("max_model_len=8192", "allocator.prefix_caching=true", "num_kv_blocks=3072", "kv_tiers=host_disk",
                   "kv_tiers.tiers.0.capacity_gib=1"), prefix_thrash, kinds=("kv_tier_policy",)),
    GradeWorkload("cluster_drift", "heavy-tailed answers through 4 replicas of 600 KV blocks, placed round robin",
                  ("max_model_len=8192", "cluster.replicas=4", "num_kv_blocks=600", "router=round_robin",
                   "cluster.migration_interval_s=0.25"), cluster_drift, kinds=("migration_policy",)),
)


def workloads_for(kind: str) -> tuple[GradeWorkload, ...]:
    """The workloads that grade ``kind``."""
    return tuple(w for w in WORKLOADS if kind in w.kinds)


def graded_kinds() -> dict[str, str]:
    """kind -> the built-in a ``grade`` run scores it against, for every kind that can be graded: the
    kinds table's ``grade_reference``, else, for a kind a workload here grades, the kind's default
    (``router``: ``round_robin``). The other kinds are refused by ``grade``."""
    graded = {}
    for spec in KINDS.values():
        reference = spec.grade_reference or (spec.default if workloads_for(spec.name) else None)
        if reference:
            graded[spec.name] = reference
    return graded
