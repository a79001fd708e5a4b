"""SLO classes of a synthetic workload: ``workload.slo_classes``.

A list of ``{name, share, ttft_ms, tpot_ms, priority}`` (``servelab.config.workloads.SloClassConfig``).
Each request's class is drawn independently with probability share / sum(shares), and the request
then carries the class's targets as its own ``ttft_slo_ms`` / ``tpot_slo_ms`` (exactly what a
``workload=jsonl`` line's ``ttft_slo_ms`` / ``tpot_slo_ms`` give it: a target a class leaves null
falls back to the run's ``slo.ttft_ms`` / ``slo.tpot_ms``), its ``priority`` (default 0) and its
name as ``slo_class``, by which ``summary.json`` reports each class (``slo_classes``).

The draws use their own generator, seeded by (workload seed, :data:`SLO_CLASS_STREAM`), so a
workload keeps its prompts, lengths, arrivals and clients with or without classes. Errors are one
line naming ``workload.slo_classes[i].<field>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servelab.core.errors import ConfigError

SLO_CLASS_STREAM = 0x736C6F  # "slo": the generator of class draws, apart from the workload's own


@dataclass(frozen=True)
class SloClass:
    name: str
    share: float
    ttft_ms: float | None
    tpot_ms: float | None
    priority: int

    def request_fields(self) -> dict:
        """A request's fields from this class: its targets (None: the run's ``slo.*``), priority, name."""
        return {"ttft_slo_ms": self.ttft_ms, "tpot_slo_ms": self.tpot_ms, "priority": self.priority,
                "slo_class": self.name}


def parse_slo_classes(cfg) -> list[SloClass]:
    """``cfg.slo_classes`` checked ([] when unset or empty)."""
    entries = getattr(cfg, "slo_classes", None) or []
    classes: list[SloClass] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        key = f"workload.slo_classes[{i}]"
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{key}.name={name!r}: every SLO class needs a non-empty name (summary.json reports "
                              "each class by it)")
        if name in seen:
            raise ConfigError(f"{key}.name={name!r} repeats workload.slo_classes[{seen[name]}].name: names must be unique")
        seen[name] = i
        share = _positive(entry.get("share"), f"{key}.share")
        ttft, tpot = (_positive(entry.get(f), f"{key}.{f}") for f in ("ttft_ms", "tpot_ms"))
        priority = entry.get("priority")
        classes.append(SloClass(name, 1.0 if share is None else share, ttft, tpot,
                                0 if priority is None else int(priority)))
    return classes


def _positive(value, key: str) -> float | None:
    if value is None:
        return None
    number = float(value)
    if not (number > 0 and math.isfinite(number)):
        raise ConfigError(f"{key}={value!r} must be > 0 (leave it out for none)")
    return number


def draw_slo_classes(classes: list[SloClass], n: int, seed: int) -> np.ndarray | None:
    """Each of ``n`` requests' class (an index into ``classes``), or None without classes."""
    if not classes:
        return None
    shares = np.array([c.share for c in classes])
    rng = np.random.default_rng([int(seed), SLO_CLASS_STREAM])
    return rng.choice(len(classes), size=n, p=shares / shares.sum())
