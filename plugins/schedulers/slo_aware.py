"""SLO-aware scheduling: maximise the number of requests that meet both their TTFT and TPOT
targets (goodput), using the shared step-time cost model (``self.cost_model``).

Targets: a request's ``ttft_slo_ms`` / ``tpot_slo_ms``, else the run's ``slo.ttft_ms`` /
``slo.tpot_ms``; a missing target never constrains anything. ``t_dec`` below is the cost model's
predicted time of a decode-only step of the running sequences.

Rules, applied every step:

1. **Deadline order.** Waiting requests are admitted earliest TTFT deadline first
   (``arrival + ttft_slo``; no target = never due). Running sequences get the step budget in the
   same order, so under memory pressure the latest-deadline one is preempted first.
2. **Late requests are deprioritised, never dropped.** A waiting request is *late* when even if it
   started now it would miss its TTFT deadline, or, after a preemption, its TPOT. Its prefill is
   predicted at this step's prefill rate: ``ceil(prompt / prefill cap)`` steps of
   ``t_dec + cap`` tokens each (at least one step with the whole prompt). A running request is late when decoding its remaining
   ``max_tokens`` at ``t_dec`` per token cannot keep its TPOT. Late requests stay late; they queue
   behind every on-time request (oldest first), are preempted first, and are not protected by
   rule 3. They still run whenever there is room, and count as misses.
3. **Prefill that fits the TPOT budget.** Each on-time decoding request ``i`` with target ``T_i``
   has a pace: its ``k``-th token is due ``k * T_i`` after its first. The step may last
   ``limit = min_i clip(next_due_i - now, T_i, max_step_tpots * T_i)``: slack earned by fast
   steps can be spent on prefill, but a step never gets less than one ``T_i`` nor more than
   ``max_step_tpots`` of them (a misprediction of one huge step would break every TPOT).
   Prefill tokens this step are capped so that the predicted step time stays within
   ``margin * limit``. With chunked prefill off a prompt that does
   not fit waits (head of line) until it fits or the decodes drain.
4. **Admission control.** A new request is admitted only if the predicted decode step with it
   added stays within ``(1 - prefill_share) * margin * min(T)`` over on-time running requests and
   itself: admitting must not break everybody's TPOT, and ``prefill_share`` of each step stays
   free for prefill, so admitted requests get their first token soon (under overload it is better
   to serve fewer requests within both targets than all of them late). A request is always admitted when nothing runs, so one whose
   SLO cannot be met even alone still runs (and counts as a miss).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from servelab.plugin_api import EVERY_STEP, UNTIL_ARRIVAL, ConfigError, NextDecision, QueueScheduler, StepFeatures

INF = float("inf")


@dataclass
class SLOAwareConfig:
    margin: float = 0.9  # fraction of a TPOT budget a predicted step may use (prediction error headroom)
    admission_control: bool = True  # rule 4
    max_step_tpots: float = 4.0  # rule 3: longest step, in TPOT targets of the running requests
    prefill_share: float = 0.3  # rule 4: fraction of a TPOT budget admission leaves for prefill


class DeadlineQueue:
    """Waiting requests: on-time ones by TTFT deadline (a heap), then late ones by arrival."""

    def __init__(self, scheduler: "SLOAwareScheduler") -> None:
        self._sched = scheduler
        self._on_time: list = []
        self._late: list = []
        self._counter = itertools.count()
        self._front_counter = itertools.count(1)

    def push(self, seq, order: int | None = None) -> None:
        order = next(self._counter) if order is None else order
        if seq in self._sched.late:
            heapq.heappush(self._late, (seq.arrival_s, order, seq))
        else:
            heapq.heappush(self._on_time, (self._sched.targets(seq)[0], order, seq))

    def push_front(self, seq) -> None:
        """Back by its deadline (or to the late queue), first among equal keys."""
        self.push(seq, -next(self._front_counter))

    def demote_late(self, is_late) -> int:
        """Move on-time heads for which ``is_late(seq)`` holds to the late queue; return how many."""
        moved = 0
        while self._on_time and is_late(self._on_time[0][2]):
            seq = heapq.heappop(self._on_time)[2]
            self._sched.mark_late(seq)
            self.push(seq)
            moved += 1
        return moved

    def remove(self, seq) -> None:
        """Take ``seq`` out (an aborted request), wherever it waits."""
        for name in ("_on_time", "_late"):
            heap = getattr(self, name)
            kept = [e for e in heap if e[2] is not seq]
            if len(kept) < len(heap):
                heapq.heapify(kept)
                setattr(self, name, kept)

    def peek(self):
        return (self._on_time or self._late)[0][2]

    def pop(self):
        return heapq.heappop(self._on_time or self._late)[2]

    def __iter__(self):
        return itertools.chain((e[2] for e in sorted(self._on_time)), (e[2] for e in sorted(self._late)))

    def __len__(self) -> int:
        return len(self._on_time) + len(self._late)


class SLOAwareScheduler(QueueScheduler):
    """Deadline-ordered admission with TPOT-safe prefill caps (rules in the module docstring)."""

    name = "slo_aware"
    Config = SLOAwareConfig

    def __init__(self, *args, **kwargs) -> None:
        self.late: set = set()  # sequences that can no longer meet their SLOs (rule 2)
        self._targets: dict = {}  # seq -> (ttft deadline s, tpot target s, max_tokens)
        self._rank: dict = {}  # seq -> (is late, ttft deadline): the running order
        self._paced: set = set()  # on-time sequences with a TPOT target: those that can turn late running
        super().__init__(*args, **kwargs)
        cfg = self.config
        for key, ok in (("margin", 0 < cfg.margin <= 1), ("prefill_share", 0 <= cfg.prefill_share < 1),
                        ("max_step_tpots", cfg.max_step_tpots >= 1)):
            if not ok:
                raise ConfigError(f"scheduler.{key}={getattr(cfg, key)} is out of range (margin in (0, 1], "
                                  f"prefill_share in [0, 1), max_step_tpots >= 1)")
        self._fit = self.cost_model.fit()  # the cost model as of this step's prediction, solved when read
        self._decode_counts = (0, 0)  # this step's running decodes and their context, as predicted
        self._t_dec_value: float | None = 0.0  # the predicted decode-only step (s), once computed
        self._limit = INF  # how long this step may take (s), rule 3
        self._min_tpot = INF  # tightest TPOT target (s) among on-time running requests
        self._num_decodes = 0
        self._decode_context = 0
        self._cap = self.limits.max_num_batched_tokens  # this step's prefill cap (rule 3)

    @property
    def _coef(self) -> tuple[float, float, float, float]:
        """The cost model's coefficients as of this step's prediction."""
        return self._fit.coefficients

    @property
    def _t_dec(self) -> float:
        """This step's predicted decode-only step (s), computed when first read: a rule reads it only
        against a finite target, so a run without targets never solves the cost model for it."""
        t_dec = self._t_dec_value
        if t_dec is None:
            c0, _, c2, c3 = self._fit.coefficients
            decodes, context = self._decode_counts
            t_dec = self._t_dec_value = max(0.0, c0 + c2 * decodes + c3 * context / 1e3)
        return t_dec

    # ---- targets ------------------------------------------------------------------------
    def targets(self, seq) -> tuple[float, float, int]:
        """``(TTFT deadline in engine seconds, TPOT target in seconds, max_tokens)``; inf = none."""
        cached = self._targets.get(seq)
        if cached is None:
            req, limits = seq.request, self.limits
            ttft = req.ttft_slo_ms if req.ttft_slo_ms is not None else limits.ttft_slo_ms
            tpot = req.tpot_slo_ms if req.tpot_slo_ms is not None else limits.tpot_slo_ms
            cached = self._targets[seq] = (INF if ttft is None else seq.arrival_s + ttft / 1e3,
                                           INF if tpot is None else tpot / 1e3, req.max_tokens)
            self._rank[seq] = (seq in self.late, cached[0])
            if cached[1] != INF and seq not in self.late:
                self._paced.add(seq)
        return cached

    def mark_late(self, seq) -> None:
        """Rule 2: ``seq`` can no longer meet its SLOs; it is deprioritised for good."""
        self.late.add(seq)
        self._rank[seq] = (True, self.targets(seq)[0])
        self._paced.discard(seq)

    # ---- hooks --------------------------------------------------------------------------
    def make_waiting_queue(self):
        return DeadlineQueue(self)

    def remove(self, seq) -> None:
        super().remove(seq)
        self.late.discard(seq)
        self._targets.pop(seq, None)
        self._rank.pop(seq, None)
        self._paced.discard(seq)

    def schedule(self, now: float):
        self._observe_running(now)
        self._cap = self._prefill_cap_now()
        self.waiting.demote_late(lambda seq: self._is_late_waiting(seq, now))
        return super().schedule(now)

    def next_decision(self, now: float) -> NextDecision:
        """Nothing changes while no running request can turn late (rule 2): each is late already or
        has no TPOT target. Otherwise whether one turns late depends on every step's prediction."""
        paced, running = self._paced, self.running  # every running seq went through targets()
        if (not paced or paced.isdisjoint(running)) and self.running_sorted_by(self._rank.__getitem__):
            return UNTIL_ARRIVAL
        return EVERY_STEP

    def arrivals_beside_decodes(self) -> bool:
        """Inside :meth:`next_decision`'s horizon every running request is late or has no TPOT
        target and the running order is the rank order: :meth:`schedule` runs them all first."""
        return True

    def schedule_arrivals(self, now: float, num_decodes: int, context: int):
        # schedule()'s rule 2 and 3 pass, from the counts: no running request can turn late here
        self._predict_decodes(num_decodes, context, INF, INF)
        self._cap = self._prefill_cap_now()
        self.waiting.demote_late(lambda seq: self._is_late_waiting(seq, now))
        return super().schedule_arrivals(now, num_decodes, context)

    def running_order(self, running, now):
        running.sort(key=self._rank.__getitem__)  # every running seq went through targets()
        return running

    def prefill_token_cap(self, now: float) -> int:
        return self._cap

    def _prefill_cap_now(self) -> int:
        budget = self.limits.max_num_batched_tokens
        if self._limit == INF:
            return budget
        c0, c1, _, c3 = self._coef
        spare = self.config.margin * self._limit - self._t_dec  # a finite limit means decodes run
        if spare <= 0:
            return 0
        # predicted prefill cost of p fresh tokens: c1 * p + c3 * p^2 / 2 / 1e3 (attention)
        c1, a = max(c1, 1e-9), max(c3, 0.0) / 2e3
        p = spare / c1 if a == 0 else (-c1 + (c1 * c1 + 4 * a * spare) ** 0.5) / (2 * a)
        return int(min(budget, p))

    def may_admit(self, seq, now: float) -> bool:
        if self.running and self.config.admission_control:
            own = INF if seq in self.late else self.targets(seq)[1]
            tightest = min(self._min_tpot, own)
            if tightest != INF:  # an infinite budget admits any (finite) predicted step
                c0, _, c2, c3 = self._coef
                t = c0 + c2 * (self._num_decodes + 1) + c3 * (self._decode_context + seq.num_tokens) / 1e3
                if t > (1.0 - self.config.prefill_share) * self.config.margin * tightest:
                    return False
        self._num_decodes += 1  # the next candidate is judged with this one decoding too
        self._decode_context += seq.num_tokens
        return True

    def step_stats(self) -> dict[str, float]:
        return {**super().step_stats(), "step_limit_ms": self._limit * 1e3 if self._limit != INF else -1.0,
                "predicted_decode_ms": self._t_dec * 1e3, "late": len(self.late)}

    # ---- rules 2 and 3 ------------------------------------------------------------------
    def _observe_running(self, now: float) -> None:
        """One pass over the running sequences: mark those that can no longer keep their TPOT
        (judged with the previous step's decode prediction), find how long this step may last,
        and predict this step's decode cost."""
        paced = self._paced
        if not paced or paced.isdisjoint(self.running):  # nobody to mark late or to bound the step: count
            decodes = context = 0
            for seq in self.running:
                if seq.token_times:
                    decodes += 1
                    context += seq.num_tokens
            self._predict_decodes(decodes, context, INF, INF)
            return
        t_dec = None  # the previous step's prediction, read only for a request with a TPOT target
        limit = min_tpot = INF
        decodes = context = 0
        late, cached, targets, max_tpots = self.late, self._targets, self.targets, self.config.max_step_tpots
        for seq in self.running:  # once per step over every running sequence: no calls on the usual path
            times = seq.token_times
            if not times:
                continue
            decodes += 1
            context += seq.num_tokens
            if seq in late:
                continue
            _, target, max_tokens = cached.get(seq) or targets(seq)
            if target == INF:
                continue
            n = len(times)
            first = times[0]
            if t_dec is None:
                t_dec = self._t_dec
            if now + (max_tokens - n) * t_dec > first + (max_tokens - 1) * target:
                self.mark_late(seq)
                continue
            if target < min_tpot:
                min_tpot = target
            allowed = first + n * target - now
            allowed = target if allowed < target else (max_tpots * target if allowed > max_tpots * target else allowed)
            if allowed < limit:
                limit = allowed
        self._predict_decodes(decodes, context, limit, min_tpot)

    def _predict_decodes(self, decodes: int, context: int, limit: float, min_tpot: float) -> None:
        """This step's decode prediction from its ``decodes`` (``context`` tokens), and its limits."""
        self._fit = self.cost_model.fit()
        self._num_decodes, self._decode_context = decodes, context
        self._decode_counts, self._t_dec_value = (decodes, context), None
        self._limit, self._min_tpot = limit, min_tpot

    def _is_late_waiting(self, seq, now: float) -> bool:
        deadline, target, max_tokens = self.targets(seq)
        times = seq.token_times
        due = deadline if not times else times[0] + (max_tokens - 1) * target
        if not due < INF:  # nothing to miss (inf; nan when one token is due at an infinite pace): no prediction
            return False
        n = seq.num_tokens
        prefill_s = self.cost_model.predict(StepFeatures(n, self._num_decodes, n * (n + 1) // 2 + self._decode_context))
        if 0 < self._cap < n:  # chunks at this step's rate
            c0, c1, c2, c3 = self._coef
            steps = -(-n // self._cap)
            prefill_s = max(prefill_s, steps * (self._t_dec + c1 * self._cap + c3 * self._cap * n / 2e3))
        if not times:
            return now + prefill_s > due
        # preempted after its first token: can it still keep its TPOT?
        remaining = max_tokens - len(times)
        return now + prefill_s + remaining * self._t_dec > due
