"""Helpers for tests that drive a real engine by hand (two engines passing KV between them)."""

from __future__ import annotations


def drain(engine, max_steps: int = 2000) -> None:
    """Step ``engine`` until nothing is unfinished, napping a millisecond when a step ran nothing (a
    KV load in flight); fails after ``max_steps`` steps without getting there."""
    for _ in range(max_steps):
        if not engine.has_unfinished():
            return
        if engine.step() is None:
            engine.sleep(0.001)
    raise AssertionError("no progress")
