"""Random prompt token ids made when they are first read, the same ids as drawing them all up front.

A workload of random prompts draws them in request order from its generators (request ``i``'s ids
follow request ``i - 1``'s in the stream). :class:`PromptDraws` replays that stream on demand: it
keeps a cursor (generators positioned just before some request), a copy of the generators every
:data:`EVERY` requests and the last :data:`RECENT` prompts made, so reading request ``i`` costs
drawing the requests between the cursor and ``i`` (none when requests are read in order, as a run
reads them), and a read behind the cursor goes back at most :data:`EVERY` requests. A request's
:class:`LazyPrompt` holds only its length and index and makes its ids each time they are read:
building a million-request workload, or a pass over it that reads lengths, arrival times and
targets (``assemble.preflight``), draws no token at all, and a workload kept as a list (a trace)
holds no prompt.
"""

from __future__ import annotations

import copy
import functools
from collections import OrderedDict
from collections.abc import Sequence as ReadOnlyList
from typing import Any, Callable, Iterator, overload

import numpy as np

EVERY = 256  # requests between two saved copies of the generators
RECENT = 64  # prompts kept after they were made (a router and then the engine read the same one)

#: request index -> the draws that make its prompt, in order: (generator index, length); the prompt
#: is the last draw's ids (an earlier draw is one the workload made and then replaced, as a client
#: with its own prompt lengths does)
Draws = Callable[[int], tuple[tuple[int, int], ...]]


class PromptDraws:
    """The prompts of one workload: request ``i``'s are the ids of ``draws(i)``'s last draw, each
    draw ``generators[g].integers(0, vocab_size, size=length)`` in request order."""

    def __init__(self, generators: list[np.random.Generator], draws: Draws, vocab_size: int) -> None:
        self.draws, self.vocab_size = draws, vocab_size
        self._generators = copy.deepcopy(generators)  # the cursor's: positioned just before request _next
        self._next = 0
        self._saved: dict[int, list[np.random.Generator]] = {}  # i // EVERY -> the generators just before i
        self._recent: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def prompt(self, i: int) -> tuple[int, ...]:
        """Request ``i``'s token ids."""
        if i in self._recent:
            return self._recent[i]
        if i < self._next:  # behind the cursor: from the copy saved at or before i
            block = i // EVERY
            self._next, self._generators = block * EVERY, copy.deepcopy(self._saved[block])
        while self._next < i:
            self._draw(make=False)
        ids = self._draw(make=True)
        assert ids is not None
        self._recent[i] = ids
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        return ids

    def _draw(self, make: bool) -> tuple[int, ...] | None:
        i = self._next
        if i % EVERY == 0 and i // EVERY not in self._saved:
            self._saved[i // EVERY] = copy.deepcopy(self._generators)
        drawn = None
        for g, length in self.draws(i):
            drawn = self._generators[g].integers(0, self.vocab_size, size=length)
        self._next = i + 1
        if not make:
            return None
        # plain ints: only the live requests' prompts exist at once (sharing one int object per id
        # would save memory and cost twice the time: an increment on a scattered object per token)
        return () if drawn is None else tuple(drawn.tolist())


@functools.lru_cache(maxsize=4)
def token_objects(vocab_size: int) -> np.ndarray:
    """The ints ``0 .. vocab_size - 1`` as one object array (indexing it is a C loop): a workload that
    keeps every prompt (a jsonl file's ``prompt_len`` requests) shares one int object per token id."""
    return np.array(range(vocab_size), dtype=object)


class LazyPrompt(ReadOnlyList[int]):
    """Request ``index``'s prompt of ``draws``: ``length`` ids, made when read (not kept). It reads
    as the tuple it stands for: ``len`` without drawing; indexing, slicing (a tuple), iteration,
    ``==`` / ``hash`` with tuples, ``+``, numpy conversion; pickled, it is that tuple."""

    __slots__ = ("_draws", "_index", "_length")

    def __init__(self, draws: PromptDraws, index: int, length: int) -> None:
        self._draws, self._index, self._length = draws, index, length

    def ids(self) -> tuple[int, ...]:
        """The token ids as a tuple."""
        return self._draws.prompt(self._index)

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        return self.ids()[index]

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __contains__(self, token: object) -> bool:
        return token in self.ids()

    def __eq__(self, other: object) -> bool:
        return self.ids() == (other.ids() if isinstance(other, LazyPrompt) else other)

    def __hash__(self) -> int:
        return hash(self.ids())

    def __add__(self, other: Any) -> tuple[int, ...]:
        return self.ids() + (other.ids() if isinstance(other, LazyPrompt) else other)

    def __radd__(self, other: Any) -> tuple[int, ...]:
        return other + self.ids()

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return np.asarray(self.ids(), dtype=dtype)

    def __reduce__(self):
        return tuple, (self.ids(),)

    def __repr__(self) -> str:
        return repr(self.ids())
