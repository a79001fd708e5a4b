"""The ``autoscaler`` kind: when a cluster grows by a replica, and which replica it gives back.

A colocated cluster on the simulator (``cluster.replicas=N``) whose autoscaler scales asks it every
``cluster.autoscale_interval_s`` seconds with an :class:`AutoscaleView`: one
:class:`~servelab.core.migration_policy.ReplicaLoad` per replica in service (serving, or draining
for a scale-down), how many replicas are starting (a cold start under way) and the bounds. The
autoscaler answers with :class:`ScaleUp` (start ``count`` replicas: each serves after a priced cold
start, at once from a warm pool) and :class:`ScaleDown` (``replica`` drains: the router stops placing
there, a migration policy moves its running requests away, and it is retired once empty). The
cluster checks every answer (:func:`checked_decisions`). Scaling never changes what is computed.

``none`` (the default) never scales, and a cluster with it runs exactly as one without the kind.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence as Seq, Union

from servelab.core.interfaces import Plugin
from servelab.core.migration_policy import ReplicaLoad


@dataclass(frozen=True)
class AutoscalerContext:
    """What an autoscaler is built for: the bounds (``cluster.min_replicas`` / ``max_replicas``), how
    often the cluster asks it (``interval_s``, ``cluster.autoscale_interval_s``), a replica's cold start
    (``cold_start_s``: its weights read at ``cluster.cold_start_gb_s``), how many prompt tokens a
    replica prefills per second when busy (``prefill_tokens_per_s``, its time model's price of one
    full prefill chunk of ``max_num_batched_tokens``), and the run's seed."""

    min_replicas: int
    max_replicas: int
    interval_s: float = 5.0
    cold_start_s: float = 0.0
    prefill_tokens_per_s: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class AutoscaleView:
    """The cluster now: ``replicas`` in service (serving or draining, index order; ``draining`` says
    which), ``num_starting`` replicas whose cold start is under way, the bounds, and ``first_token_wait_s``
    (one per replica in ``replicas``): how long the request there that has waited longest for its first
    token has waited so far (0: none waits), and ``prefill_backlog_tokens`` (likewise): the tokens its
    scheduler must still compute before every request there has its first token (queued, preempted and
    part-prefilled requests: a request admitted but prefilling is in neither ``running`` nor ``waiting``)."""

    replicas: tuple[ReplicaLoad, ...]
    num_starting: int
    min_replicas: int
    max_replicas: int
    first_token_wait_s: tuple[float, ...] = ()
    prefill_backlog_tokens: tuple[int, ...] = ()

    @property
    def serving(self) -> tuple[ReplicaLoad, ...]:
        """The replicas in service that take new requests."""
        return tuple(r for r in self.replicas if not r.draining)

    @property
    def num_target(self) -> int:
        """The size the cluster is heading for: serving plus starting replicas."""
        return len(self.serving) + self.num_starting

    @property
    def num_held(self) -> int:
        """The replicas holding GPUs: serving, draining and starting."""
        return len(self.replicas) + self.num_starting


@dataclass(frozen=True)
class ScaleUp:
    """Start ``count`` more replicas."""

    count: int = 1


@dataclass(frozen=True)
class ScaleDown:
    """Drain replica ``replica`` (a serving one) and retire it once it is empty."""

    replica: int


Decision = Union[ScaleUp, ScaleDown]


class AutoscalerError(RuntimeError):
    """An autoscaler's answer is not one the cluster can carry out (names the plugin and the decision)."""


class Autoscaler(Plugin):
    """Grows and shrinks a cluster (``autoscaler=<name>``).

    :meth:`decide` is called every ``context.interval_s`` of the cluster's clock with an
    :class:`AutoscaleView` and returns the decisions to carry out now (empty: none). A :class:`ScaleUp`
    needs ``count >= 1`` and may not take the replicas holding GPUs (serving, draining, starting) above
    ``max_replicas``; a :class:`ScaleDown` names a serving replica, each at most once, and may not take the
    serving plus starting ones below ``min_replicas`` nor leave none serving; anything else (or a raise) stops the run with :class:`AutoscalerError` naming the
    plugin. ``scales = False`` (``none``) means the cluster never asks: a run exactly as without it.
    """

    context_type = AutoscalerContext
    context: AutoscalerContext
    scales: ClassVar[bool] = True
    # the books of scale_up_or_retire (per instance once it is first called)
    _low_since: float | None = None  # the low marks held at every question since then
    _last_decision: float = float("-inf")

    @abstractmethod
    def decide(self, view: AutoscaleView, now: float) -> Seq[Decision]:
        """The scaling decisions at ``now``."""

    def scale_up_or_retire(self, view: AutoscaleView, now: float, up: ScaleUp | None, low: bool,
                           cooldown_s: float) -> tuple[Decision, ...]:
        """The built-ins' rule around their own tests, for a :meth:`decide` to return; call it at every
        question. ``up``: the scale-up the autoscaler wants now (None: none), carried out first. Else the
        serving replica with the fewest requests (running + waiting; the highest index on a tie) is
        retired once ``low`` (the autoscaler's low marks) held at every question for ``cooldown_s``
        since the last decision, while no cold start and no drain is under way, the cluster is above
        ``min_replicas`` and more than one replica serves: the cool-down is the hysteresis in time, so
        a lull inside a burst retires nothing."""
        self._low_since = (self._low_since if self._low_since is not None else now) if low else None
        if up is not None:
            self._last_decision = now
            return (up,)
        serving = view.serving
        if (self._low_since is not None and now - max(self._low_since, self._last_decision) >= cooldown_s
                and not view.num_starting and len(serving) == len(view.replicas)
                and view.num_target > view.min_replicas and len(serving) > 1):
            self._last_decision = now
            return (ScaleDown(min(serving, key=lambda r: (r.num_running + r.num_waiting, -r.index)).index),)
        return ()


def checked_decisions(autoscaler: Autoscaler, view: AutoscaleView, now: float) -> list[Decision]:
    """``autoscaler``'s decisions at ``now``, each checked (see :class:`Autoscaler`)."""
    name = type(autoscaler).name
    try:
        answer = list(autoscaler.decide(view, now))
    except Exception as exc:  # reported naming the plugin
        raise AutoscalerError(f"autoscaler plugin {name!r} failed at t={now:g}: {type(exc).__name__}: {exc}") from exc
    serving = {r.index for r in view.serving}
    target, held = view.num_target, view.num_held
    downs: set[int] = set()
    for d in answer:
        where = f"autoscaler plugin {name!r} returned {d!r} at t={now:g}"
        if isinstance(d, ScaleUp):
            if not isinstance(d.count, int) or isinstance(d.count, bool) or d.count < 1:
                raise AutoscalerError(f"{where}: a scale-up starts at least one replica")
            target += d.count
            held += d.count
            if held > view.max_replicas:
                raise AutoscalerError(f"{where}: {held} replicas would hold GPUs (serving, draining, starting), "
                                      f"above cluster.max_replicas={view.max_replicas}")
        elif isinstance(d, ScaleDown):
            if d.replica not in serving or d.replica in downs:
                raise AutoscalerError(f"{where}: not a serving replica (serving: {sorted(serving - downs)})")
            downs.add(d.replica)
            target -= 1
            if not serving - downs:
                raise AutoscalerError(f"{where}: no replica would be left serving")
        else:
            raise AutoscalerError(f"{where}: not a ScaleUp or ScaleDown")
        if target < view.min_replicas:
            raise AutoscalerError(f"{where}: {target} replicas would serve or start, below "
                                  f"cluster.min_replicas={view.min_replicas}")
    return answer
