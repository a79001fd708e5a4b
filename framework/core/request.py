"""Requests (immutable input) and sequences (their runtime state inside the engine)."""

from __future__ import annotations

import enum
import functools
from array import array
from collections.abc import Iterator, MutableSequence
from collections.abc import Sequence as ReadOnlyList
from dataclasses import dataclass, field
from typing import Any, overload


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
    ``jain_fairness_index``) compare them; ``None`` = the one anonymous client. ``slo_class`` names
    the SLO class its targets came from (``workload.slo_classes``, a ``jsonl`` line's
    ``slo_class``): ``summary.json`` reports each class's attainment; policies read the targets.
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
    slo_class: str | None = None  # the SLO class its targets came from (reporting only)
    # when the client sent it, where a front end (``frontend``) delayed its arrival at the engine
    # (``arrival_time``); its TTFT and E2E count from here. None: sent at ``arrival_time``.
    sent_time: float | None = None

    @functools.cached_property  # read per running sequence per step by schedulers
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    @functools.cached_property
    def token_id_bounds(self) -> tuple[int, int]:
        """``(low, high)`` with every prompt token id in ``[low, high]``: the smallest and largest id,
        or, for ids a workload drew from a vocabulary, that vocabulary's range (:func:`drawn_from`;
        the engine checks the bounds against its model's vocabulary on arrival)."""
        ids = self.prompt_token_ids
        return (min(ids), max(ids)) if ids else (0, 0)


def drawn_from(request: Request, vocab_size: int) -> Request:
    """``request``, known to hold only token ids drawn from ``[0, vocab_size)``: its
    :attr:`~Request.token_id_bounds` are set without a pass over a long prompt."""
    request.__dict__["token_id_bounds"] = (0, vocab_size - 1)  # where the cached_property keeps its value
    return request


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
#: REJECTED and ABORTED are final. A sequence reaches them only through :meth:`Sequence.finish`
#: (FINISHED, ABORTED) or :meth:`Sequence.reject` (REJECTED), which set the reason and time too.
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
    token_times: MutableSequence[float] = field(default_factory=list)  # wall time of each output token
    finish_time: float | None = None  # set by finish() / reject(), never by hand
    finish_reason: str | None = None  # "length" | "stop" | "abort" (finish())
    rejected_reason: str | None = None  # why it could never run (reject())
    # Speculative decoding: the drafter's proposal to follow ``token_ids`` (empty = none; the
    # engine clears it whenever ``token_ids`` grows), the drafter's probabilities for it
    # (``[len(drafts), vocab]`` or None = one-hot), and what verification made of past drafts.
    draft_token_ids: list[int] = field(default_factory=list)
    draft_probs: Any = None
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_verify_steps: int = 0
    drafted_by_position: list[int] = field(default_factory=list)  # [i]: verify steps with a draft at position i
    accepted_by_position: list[int] = field(default_factory=list)  # [i]: of which kept
    predicted_output_len: float | None = None  # the length predictor's answer, once asked (Scheduler.predicted_output_len)
    # The chained digest of each full block of token_ids, computed once (servelab.core.block_hash.block_hashes;
    # vLLM's Request.block_hashes): what the prefix cache, the evictors and the KV tiers identify blocks by.
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    # prompt + outputs as one working list, made when token_ids is first read (a simulated run that
    # never reads a prompt never copies it, nor draws a lazy workload's ids: LazyPrompt)
    _token_ids: list[int] | None = field(default=None, init=False, repr=False)
    _token_view: ReadOnlyList[int] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._prompt_len = len(self.request.prompt_token_ids)  # len() of a LazyPrompt draws nothing

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
        """The one way a live sequence changes state (waiting / running / swapped); raises
        :class:`IllegalTransition` naming the sequence and both states when :data:`ALLOWED_TRANSITIONS`
        does not allow the move. A sequence ends only through :meth:`finish` or :meth:`reject`."""
        if new not in _LIVE_MOVES[self._status]:
            if new in _ENDED:
                raise IllegalTransition(f"sequence {self.request.id!r}: end a sequence with finish(reason, now) or "
                                        f"reject(reason, now), not move_to({new.value})")
            raise IllegalTransition(f"sequence {self.request.id!r} cannot go from {self._status.value} to {new.value}")
        self._status = new

    def finish(self, reason: str, now: float) -> None:
        """End the sequence at ``now``: ``reason`` ``"length"`` or ``"stop"`` makes it FINISHED,
        ``"abort"`` ABORTED. Status, finish reason and finish time change together, here only."""
        if reason not in FINISH_REASONS:
            raise ValueError(f"sequence {self.request.id!r}: finish reason {reason!r} is not one of "
                             f"{sorted(FINISH_REASONS)}")
        self._end(Status.ABORTED if reason == "abort" else Status.FINISHED)
        self.finish_reason, self.finish_time = reason, now

    def reject(self, reason: str, now: float) -> None:
        """End a waiting sequence at ``now`` as REJECTED: it can never run, for ``reason``."""
        self._end(Status.REJECTED)
        self.rejected_reason, self.finish_time = reason, now

    def _end(self, new: Status) -> None:
        if new not in ALLOWED_TRANSITIONS[self._status]:
            raise IllegalTransition(f"sequence {self.request.id!r} cannot go from {self._status.value} to {new.value}")
        self._status = new

    @property
    def token_ids(self) -> ReadOnlyList[int]:
        """Prompt followed by the generated tokens, as a read-only view (it follows the sequence as
        it grows; slicing it gives a new list). Only :meth:`append_token` adds to it."""
        view = self._token_view
        if view is None:  # first read: the working list, kept in step by append_token from here on
            ids = self._token_ids = [*self.request.prompt_token_ids, *self.output_token_ids]
            view = self._token_view = TokenIds(ids)
        return view

    @property
    def num_tokens(self) -> int:
        return self._prompt_len + len(self.output_token_ids)

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
        self._token_ids = None  # no append from here on
        self._token_view = _Joined(self.request.prompt_token_ids, self.output_token_ids)

    def append_token(self, token_id: int, now: float) -> None:
        self.output_token_ids.append(token_id)
        ids = self._token_ids
        if ids is not None:
            ids.append(token_id)
        self.token_times.append(now)

    def append_repeated(self, token_id: int, times: ReadOnlyList[float]) -> None:
        """``append_token(token_id, t)`` for each ``t`` in ``times``, in one go (the simulator's
        fast-forward: placeholder tokens)."""
        block = [token_id] * len(times)
        self.output_token_ids.extend(block)
        ids = self._token_ids
        if ids is not None:
            ids.extend(block)
        self.token_times.extend(times)


_ENDED = frozenset({Status.FINISHED, Status.REJECTED, Status.ABORTED})
_LIVE_MOVES = {status: allowed - _ENDED for status, allowed in ALLOWED_TRANSITIONS.items()}  # what move_to may do
#: ``Sequence.finish_reason``: the output reached its length limit, a stop token or string, or the client left.
FINISH_REASONS = frozenset({"length", "stop", "abort"})


class TokenIds(ReadOnlyList[int]):
    """A live sequence's token ids as a read-only view of its working list: indexing, slicing
    (a new list), ``len``, iteration and ``in`` read the list itself, so the view costs one call and
    never a copy. There is no way to change the sequence through it."""

    __slots__ = ("_ids",)

    def __init__(self, ids: list[int]) -> None:
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self._ids[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ReadOnlyList) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to a list, which has none

    def __repr__(self) -> str:
        return f"TokenIds({self._ids!r})"


class _Joined(TokenIds):
    """``prompt + outputs`` as a read-only view (what a finished sequence's ``token_ids`` is, once
    :meth:`Sequence.compact` dropped the working list)."""

    __slots__ = ("prompt", "outputs")

    def __init__(self, prompt: tuple[int, ...], outputs: list[int]) -> None:  # no working list: not TokenIds.__init__
        self.prompt, self.outputs = prompt, outputs

    def __len__(self) -> int:
        return len(self.prompt) + len(self.outputs)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        return [*self.prompt, *self.outputs][index]

    def __iter__(self) -> Iterator[int]:
        yield from self.prompt
        yield from self.outputs

    def __contains__(self, token: object) -> bool:
        return token in self.prompt or token in self.outputs

    def __repr__(self) -> str:
        return f"TokenIds({list(self)!r})"
