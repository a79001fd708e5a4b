"""The conformance kit's starvation check, for schedulers that promise a bound.

A scheduler whose ``Config`` has a ``max_wait_s`` field promises that a waiting request is
started within ``max_wait_s`` of its arrival, up to the time a seat takes to free up (the kit
cannot ask a policy to preempt for it). The check: one seat, a long low-priority request at
t=0 among short high-priority ones that keep arriving — what shortest-first and priority orders
starve — and the long request must start within ``max_wait_s`` plus the longest time any
request held the seat, plus one step.
"""

from __future__ import annotations

from dataclasses import fields

from servelab.core.request import Request

BOUND_FIELD = "max_wait_s"
BOUND_S = 0.1  # the bound the check sets: long enough to need several short requests to pass it
SHORTS, SHORT_GAP_S = 150, 0.002


def promises_bound(scheduler_cls) -> bool:
    return any(f.name == BOUND_FIELD for f in fields(scheduler_cls.Config))


def starvation_scenario() -> tuple[tuple[str, ...], list[Request]]:
    """Overrides and requests that starve the long request ``long`` under any shortest-first or
    priority order that ignores its bound."""
    overrides = (f"scheduler.{BOUND_FIELD}={BOUND_S}", "max_num_seqs=1", "block_size=16", "max_model_len=512",
                 "max_num_batched_tokens=512")
    requests = [Request("short-0", tuple(range(1, 6)), 4, arrival_time=0.0, priority=0),
                Request("long", tuple(range(10, 310)), 4, arrival_time=0.0, priority=1)]
    requests += [Request(f"short-{i}", tuple(range(i % 7 + 1, i % 7 + 6)), 4, arrival_time=i * SHORT_GAP_S, priority=0)
                 for i in range(1, SHORTS)]
    return overrides, requests


def starvation_message(records: dict[str, dict]) -> str | None:
    """Why the run broke the bound, or None when ``long`` started in time."""
    long = records["long"]
    if long["queue_ms"] is None:
        return "the long request never started"
    held_ms = max(r["e2e_ms"] - r["queue_ms"] for r in records.values() if r["queue_ms"] is not None)
    allowed_ms = BOUND_S * 1e3 + held_ms + 50.0  # + one step of the fake executor, generously
    if long["queue_ms"] > allowed_ms:
        return (f"with {BOUND_FIELD}={BOUND_S}, one seat and short requests arriving every {SHORT_GAP_S * 1e3:g} ms, "
                f"the long request waited {long['queue_ms']:.0f} ms before it started; allowed "
                f"{allowed_ms:.0f} ms (the bound + the longest time a request held the seat + one step)")
    return None
