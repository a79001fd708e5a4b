"""The engine: continuous (iteration-level) batching around one unified step.

``step()`` is schedule -> execute -> apply. Requests join at any step boundary once they have
arrived and leave as soon as they finish.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .clock import WallClock
from .cost_model import StepCostModel, StepFeatures
from .executor import Executor
from .interfaces import BlockAllocator, EngineLimits, PreemptionDecision, Scheduler, SchedulePlan
from .request import Request, Sequence, Status
from .step_totals import StepTotals
from .step_work import StepWork, step_work


class PluginFailure(RuntimeError):
    """A policy plugin raised; the message names the plugin and the step."""


@dataclass
class StepRecord:
    """What one step did and how long it took (one line of ``steps.jsonl``).

    ``queues``, ``scheduled`` and ``scheduler`` are filled only while someone reads the records
    (the engine's ``keep_steps``, or a step listener); otherwise they are empty.
    """

    step: int
    time_s: float
    duration_s: float
    model_s: float
    num_seqs: int
    num_tokens: int
    prefill_tokens: int
    decode_seqs: int
    kv_utilization: float
    queues: dict[str, int]
    comm_s: float = 0.0  # time in cross-rank communication (tensor parallel); not counted in model_s
    preempted: list[PreemptionDecision] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    scheduled: list[tuple[str, int]] = field(default_factory=list)  # (request id, tokens) in plan order
    scheduler: dict[str, float] = field(default_factory=dict)  # the scheduler's step_stats()
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    work: StepWork | None = None  # the step's features, as time models see them


class Engine:
    """Owns every sequence; asks the scheduler for a plan, the executor for tokens, and applies them."""

    def __init__(self, limits: EngineLimits, scheduler: Scheduler, allocator: BlockAllocator,
                 executor: Executor, cost_model: StepCostModel, seed: int = 0,
                 clock: Callable[[], float] | None = None) -> None:
        self.limits = limits
        self.scheduler = scheduler
        self.allocator = allocator
        self.executor = executor
        self.cost_model = cost_model
        self.seed = seed
        self.eos_token_ids = frozenset(executor.spec.eos_token_ids)
        self.clock = clock if clock is not None else WallClock()
        self._clock = self.clock
        self._end_step = getattr(self.clock, "end_step", None)
        self._t0 = self.clock()
        self.sequences: dict[str, Sequence] = {}
        self.num_ended = 0  # finished or rejected
        self.steps: list[StepRecord] = []  # every step's record while ``keep_steps``
        self.keep_steps = True
        self.totals = StepTotals()  # what the summary needs, whether or not the steps are kept
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        # Told of each sequence as it ends (finished or rejected). With ``forget_ended`` the engine
        # then drops it (a listener has recorded it): long runs hold only live sequences.
        self.end_listeners: list[Callable[[Sequence], None]] = []
        self.forget_ended = False
        self._forgotten: set[str] = set()

    def now(self) -> float:
        """Seconds since the engine started."""
        return self._clock() - self._t0

    def reset_clock(self) -> None:
        self._t0 = self._clock()

    def sleep(self, seconds: float) -> None:
        """Wait idle for up to ``seconds`` (the clock decides: a nap, or a jump in virtual time)."""
        self.clock.sleep(seconds)

    # ---- requests -----------------------------------------------------------------------
    def add_request(self, request: Request, arrival_s: float | None = None) -> Sequence:
        """Admit a request to the scheduler, or reject it (with a reason) if it can never run.

        ``arrival_s`` is its arrival in engine seconds (SLO deadlines count from it); default
        ``request.arrival_time`` (a time scale of 1).
        """
        if request.id in self.sequences or request.id in self._forgotten:
            raise ValueError(f"duplicate request id {request.id!r}")
        seq = Sequence(request, arrival_s=request.arrival_time if arrival_s is None else arrival_s)
        self.sequences[request.id] = seq
        reason = self._rejection_reason(request)
        if reason:
            seq.status, seq.rejected_reason, seq.finish_time = Status.REJECTED, reason, self.now()
            self._ended(seq)
        else:
            self.scheduler.add(seq)
        return seq

    def _rejection_reason(self, request: Request) -> str | None:
        if request.prompt_len == 0:
            return "empty prompt"
        if request.max_tokens < 1:
            return f"max_tokens={request.max_tokens} < 1"
        if request.prompt_len >= self.limits.max_model_len:
            return (f"prompt of {request.prompt_len} tokens leaves no room to generate within "
                    f"max_model_len={self.limits.max_model_len}")
        vocab = self.executor.spec.vocab_size
        if min(request.prompt_token_ids) < 0 or max(request.prompt_token_ids) >= vocab:
            return f"prompt token id outside the vocabulary [0, {vocab})"
        needed = min(request.prompt_len + request.max_tokens, self.limits.max_model_len)
        if not self.allocator.can_ever_fit(needed):
            blocks = -(-needed // self.limits.block_size)
            return (f"needs {needed} KV slots ({blocks} blocks of {self.limits.block_size}) but the whole pool "
                    f"has {self.allocator.num_blocks} blocks")
        return None

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished() > 0

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> StepRecord | None:
        """One iteration: schedule -> execute -> apply. Returns None if nothing could run."""
        start = self.now()
        plan = self._call_plugin("scheduler", lambda: self.scheduler.schedule(start))
        if plan.is_empty:
            return None
        work = step_work(plan)  # before _apply: it reads the sequences as the plan saw them
        output = self.executor.run(plan, self.allocator, self.limits.block_size, self.seed, work)
        if self._end_step is not None:
            self._end_step(work)  # a virtual clock advances by the time model's prediction
        finished_at = self.now()
        self._apply(plan, output.sampled, finished_at)
        record = self._record(plan, work, start, finished_at, output.model_s, output.comm_s)
        for listener in self.step_listeners:
            listener(record)
        return record

    def _apply(self, plan: SchedulePlan, sampled: list[int], now: float) -> None:
        tokens = iter(sampled)
        on_tokens_computed = self.allocator.on_tokens_computed
        for entry in plan.scheduled:
            seq = entry.seq
            seq.num_computed_tokens += entry.num_tokens
            on_tokens_computed(seq)
            if seq.num_computed_tokens < len(seq.token_ids):
                continue  # a prompt chunk: nothing sampled yet
            token = next(tokens)
            seq.append_token(token, now)
            reason = self._finish_reason(seq, token)
            if reason:
                seq.status, seq.finish_reason, seq.finish_time = Status.FINISHED, reason, now
                self.scheduler.remove(seq)
                self.allocator.free(seq)
                seq.compact()
                self._ended(seq)

    def _ended(self, seq: Sequence) -> None:
        self.num_ended += 1
        for listener in self.end_listeners:
            listener(seq)
        if self.forget_ended:
            del self.sequences[seq.id]
            self._forgotten.add(seq.id)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        request = seq.request
        if not request.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= request.max_tokens or len(seq.token_ids) >= self.limits.max_model_len:
            return "length"
        return None

    def _record(self, plan: SchedulePlan, work: StepWork, start: float, end: float, model_s: float,
                comm_s: float = 0.0) -> StepRecord:
        self.cost_model.observe(StepFeatures(work.prefill_tokens, work.decode_seqs, work.attended), end - start)
        # with no reader (a long simulated run keeps only totals) the per-entry fields are skipped
        detailed = self.keep_steps or self.step_listeners
        record = StepRecord(
            step=self.totals.num_steps, time_s=end, duration_s=end - start, model_s=model_s,
            num_seqs=work.num_seqs, num_tokens=work.num_tokens, prefill_tokens=work.prefill_tokens,
            decode_seqs=work.decode_seqs, kv_utilization=self.allocator.num_used_blocks() / max(1, self.allocator.num_blocks),
            queues=self.scheduler.queue_lengths() if detailed else {}, comm_s=comm_s, preempted=plan.preempted,
            extra=self.allocator.usage_stats(), swap_out_blocks=len(plan.swap_out), swap_in_blocks=len(plan.swap_in),
            scheduled=[(e.seq.id, e.num_tokens) for e in plan.scheduled] if detailed else [],
            scheduler=self.scheduler.step_stats() if detailed else {}, work=work,
        )
        self.totals.add(record)
        if self.keep_steps:
            self.steps.append(record)
        return record

    def _call_plugin(self, role: str, fn):
        try:
            return fn()
        except Exception as exc:  # name the plugin and step in the error
            plugin = getattr(self, role)
            raise PluginFailure(f"{role} plugin {type(plugin).name!r} failed at step {self.totals.num_steps}: "
                                f"{type(exc).__name__}: {exc}") from exc
