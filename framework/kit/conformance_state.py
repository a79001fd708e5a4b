"""The conformance kit's "state left behind" contract: once every sequence of a run has ended
(finished, aborted, some preempted on the way), the plugin holds nothing for any of them.

A plugin keeps per-sequence state in containers keyed or filled by ``seq.id`` or by the
:class:`~servelab.core.request.Sequence` itself. The engine tells each kind when a sequence ends,
and that is where such state must go: a scheduler's ``remove``/``abort``, an allocator's ``free``,
a drafter's ``forget``. What is left behind grows with every request a long run or a server sees.

The check looks at the plugin's attributes (``__dict__`` and ``__slots__``), and at the attributes
of each object it holds that is not itself a plugin or an executor (one level down: a scheduler's
wait queue, a drafter's index): every dict (keys and values), list, tuple, set and deque there,
and the containers inside those, is searched for an ended sequence's id or object.
"""

from __future__ import annotations

from collections import deque
from typing import Iterator

from servelab.core.kinds import KINDS
from servelab.core.executor import Executor
from servelab.core.interfaces import Plugin
from servelab.core.request import Request, Sequence

# the kinds the engine tells when a sequence ends: those whose row in the kinds table names the "state" stage
STATE_KINDS = tuple(k.name for k in KINDS.values() if "state" in k.checks)
END_HOOK = {"scheduler": "remove()/abort()", "allocator": "free()", "drafter": "forget()"}
_CONTAINERS = (dict, list, tuple, set, frozenset, deque)
_NESTED_DEPTH = 2  # containers inside containers: a heap of (key, counter, seq) tuples, a dict of lists


def plugin_of(engine, kind: str):
    """The instance of ``kind`` an engine runs (None for a drafter that is off)."""
    return {"scheduler": lambda: engine.scheduler, "allocator": lambda: engine.allocator,
            "drafter": lambda: engine.drafter, "preemption": lambda: engine.scheduler.preemption}[kind]()


def state_left_behind(plugin, ended: set[str]) -> tuple[str, str, int] | None:
    """The first place ``plugin`` still holds an ended sequence: ``(attribute path, an example id,
    how many ended ids are there)``, or None when it holds none."""
    for name, value in _attributes(plugin):
        found = _search(value, ended, _NESTED_DEPTH)
        if found:
            return name, found[0], len(found)
        if _holds_state(value):
            for sub, subvalue in _attributes(value):
                found = _search(subvalue, ended, _NESTED_DEPTH)
                if found:
                    return f"{name}.{sub}", found[0], len(found)
    return None


def state_message(kind: str, name: str, where: tuple[str, str, int], num_ended: int) -> str:
    path, example, count = where
    return (f"{kind} plugin {name!r} still holds ended sequence {example!r} in self.{path} "
            f"({count} ended id{'s' if count != 1 else ''} there) after all {num_ended} sequences of the run "
            f"ended: drop per-sequence state in {END_HOOK[kind]}")


def state_scenario(kind: str, name: str) -> tuple[tuple[str, ...], int, list[Request], dict[str, int]]:
    """A fixed run where sequences finish, are preempted (8 requests of up to 8 blocks each share a
    pool of 14) and are aborted (one waiting, one running): its overrides, pool, requests and
    ``{request id: the step after which it is aborted}``. ``kind=name`` replaces that default."""
    stack = {"scheduler": "fcfs", "allocator": "paged", "preemption": "recompute"}
    if kind in stack:
        stack[kind] = name
    overrides = tuple(f"{k}={v}" for k, v in stack.items()) + (
        "block_size=4", "chunked_prefill=true", "max_model_len=64", "max_num_seqs=4", "max_num_batched_tokens=32")
    if kind == "drafter":
        overrides += (f"drafter={name}",)
    requests = [Request(f"s{i}", tuple((11 * i + 5 * j) % 997 + 1 for j in range(10 + 2 * i)), 12,
                        arrival_time=0.001 * i) for i in range(8)]
    return overrides, 14, requests, {"s7": 0, "s1": 3}
def _attributes(obj) -> Iterator[tuple[str, object]]:
    seen = set()
    for name, value in getattr(obj, "__dict__", {}).items():
        seen.add(name)
        yield name, value
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name not in seen and not name.startswith("__") and hasattr(obj, name):
                seen.add(name)
                yield name, getattr(obj, name)


def _holds_state(value) -> bool:
    """An object worth looking into: not another plugin (checked on its own), not an executor, not a
    class, function or module."""
    if isinstance(value, (Plugin, Executor, type, Sequence, *_CONTAINERS)) or callable(value):
        return False
    return hasattr(value, "__dict__") or hasattr(type(value), "__slots__")


def _search(value, ended: set[str], depth: int) -> list[str]:
    """The ended sequences (ids) that ``value`` holds, directly or in its containers."""
    if isinstance(value, Sequence):
        return [value.id] if value.id in ended else []
    if not isinstance(value, _CONTAINERS):
        return []
    items = (*value.keys(), *value.values()) if isinstance(value, dict) else value
    found: list[str] = []
    for item in items:
        if isinstance(item, Sequence):
            if item.id in ended:
                found.append(item.id)
        elif isinstance(item, str):
            if item in ended:
                found.append(item)
        elif depth > 0 and isinstance(item, _CONTAINERS):
            found.extend(_search(item, ended, depth - 1))
    return list(dict.fromkeys(found))
