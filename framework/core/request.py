"""Requests (immutable input) and sequences (their runtime state inside the engine)."""

from __future__ import annotations

import enum
import functools
from array import array
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. ``temperature == 0`` is greedy; otherwise seeded sampling."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None


@dataclass(frozen=True)
class Request:
    """One generation request as it arrives; never mutated by the engine.

    ``arrival_time`` is the workload's arrival number (0 = at start): the run feeds the request
    ``arrival_time * workload.time_scale`` seconds after its start, and that — the sequence's
    ``arrival_s`` — is what policies compare with ``now``; the two differ unless the time scale is
    1. ``ttft_slo_ms`` and
    ``tpot_slo_ms`` are per-request targets (``None`` = use the run's defaults). Requests share
    prefix-cache blocks only when their ``cache_salt`` is equal (``None``: the unsalted pool), so
    tenants with different salts cannot probe each other's prompts through cache-hit timing.
    ``client_id`` says who sent it: fair-sharing schedulers (``scheduler=vtc``) share service
    between clients, and the run's fairness figures (``service_by_client``, ``max_service_gap_tokens``,
    ``jain_fairness_index``) compare them; ``None`` = the one anonymous client.
    """

    id: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_time: float = 0.0
    sampling: SamplingParams = SamplingParams()
    ignore_eos: bool = True
    priority: int = 0
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    cache_salt: str | None = None
    client_id: str | None = None  # who sent it; None: the anonymous client

    @functools.cached_property  # read per running sequence per step by schedulers
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"
    REJECTED = "rejected"
    ABORTED = "aborted"  # the client left (or the server shut down) before it finished


#: The moves a sequence may make (vLLM v1 asserts the same at every transition). A recompute
#: preemption is RUNNING -> WAITING; a swap is RUNNING -> SWAPPED -> RUNNING. A request can be
#: aborted, or stopped (FINISHED, ``finish_reason="stop"``), from any live state. FINISHED,
#: REJECTED and ABORTED are final.
ALLOWED_TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WAITING: frozenset({Status.RUNNING, Status.REJECTED, Status.FINISHED, Status.ABORTED}),
    Status.RUNNING: frozenset({Status.WAITING, Status.SWAPPED, Status.FINISHED, Status.ABORTED}),
    Status.SWAPPED: frozenset({Status.RUNNING, Status.FINISHED, Status.ABORTED}),
    Status.FINISHED: frozenset(),
    Status.REJECTED: frozenset(),
    Status.ABORTED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A sequence was moved to a state it cannot reach from its current one (a scheduler bug)."""


@dataclass(eq=False)
class Sequence:
    """The engine's runtime state of one request.

    ``num_computed_tokens`` counts tokens whose KV is in the cache; the next tokens to compute are
    ``token_ids[num_computed_tokens:]``. After a recompute-preemption it drops to 0 and the prompt
    plus the already generated tokens are recomputed (outputs are kept).
    """

    request: Request
    arrival_s: float = 0.0  # engine seconds: the request's arrival_time x the run's time_scale
    _status: Status = field(default=Status.WAITING, repr=False)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # prefix-cache hits at (last) admission
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # wall time of each output token
    finish_time: float | None = None
    finish_reason: str | None = None  # "length" | "stop" | "abort"
    rejected_reason: str | None = None
    # Speculative decoding: the drafter's proposal to follow ``token_ids`` (empty = none; the
    # engine clears it whenever ``token_ids`` grows), the drafter's probabilities for it
    # (``[len(drafts), vocab]`` or None = one-hot), and what verification made of past drafts.
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: object = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: verify steps with a draft at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: of which kept
    predicted_output_len: float | None = None  # the length predictor's answer, once asked (Scheduler.predicted_output_len)
    _token_ids: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._token_ids = list(self.request.prompt_token_ids)

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def status(self) -> Status:
        """waiting / running / swapped, then finished / rejected / aborted (:data:`ALLOWED_TRANSITIONS`)."""
        return self._status

    @status.setter
    def status(self, new: Status) -> None:
        self.move_to(new)

    def move_to(self, new: Status) -> None:
        """The one way a sequence changes state; raises :class:`IllegalTransition` naming the
        sequence and both states when :data:`ALLOWED_TRANSITIONS` does not allow the move."""
        if new not in ALLOWED_TRANSITIONS[self._status]:
            raise IllegalTransition(f"sequence {self.request.id!r} cannot go from {self._status.value} to {new.value}")
        self._status = new

    @property
    def token_ids(self) -> list[int]:
        """Prompt followed by the generated tokens (do not mutate)."""
        return self._token_ids

    @property
    def num_tokens(self) -> int:
        return len(self._token_ids)

    @property
    def prompt_len(self) -> int:
        return self.request.prompt_len

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """True while more than one known token is still uncomputed (a prompt or a recompute)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self._status in _ENDED

    def compact(self) -> None:
        """Once finished: timestamps become an ``array('d')`` and ``token_ids`` a read-only view of
        prompt + outputs, dropping the working copy (a long simulated run keeps every finished
        sequence until its results are written)."""
        self.token_times = array("d", self.token_times)
        self.draft_token_ids, self.draft_probs = [], None
        self._token_ids = _Joined(self.request.prompt_token_ids, self.output_token_ids)  # type: ignore[assignment]

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        self._token_ids.append(token_id)
        self.token_times.append(now)


_ENDED = frozenset({Status.FINISHED, Status.REJECTED, Status.ABORTED})


class _Joined:
    """``prompt + outputs`` as a read-only view (what a finished sequence's ``token_ids`` is)."""

    __slots__ = ("prompt", "outputs")

    def __init__(self, prompt, outputs) -> None:
        self.prompt, self.outputs = prompt, outputs

    def __len__(self) -> int:
        return len(self.prompt) + len(self.outputs)

    def __getitem__(self, index):
        return (list(self.prompt) + list(self.outputs))[index]

    def __iter__(self):
        yield from self.prompt
        yield from self.outputs
