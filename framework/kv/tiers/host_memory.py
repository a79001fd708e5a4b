"""One host memory for the swap pool and the host tier (issue 44, item 8).

With tiers on (a host tier below the GPU, a policy that stores) and a preemption policy that swaps,
both hold KV in the same host memory: the host tier's ``capacity_gib`` is that memory, the swap
pool is sized to it (``servelab.assemble.swap_pool``), and one :class:`HostMemory` hands out its
``num_blocks`` block slots. A swapped-out sequence is live state and the tier a cache, so the swap
comes first: it may take every slot, and when none is free the host tier gives one up as when it
is full (its policy's victim, demoted to the disk tier or dropped); the tier holds at most what the
swap leaves (:meth:`tier_capacity`). One pricing: swaps cross the host tier's link (the stack prices
them at its bandwidth on the virtual clock and in the policies' cost model). On a real engine the
tier's slots are blocks of the executor's host pool (``servelab.kv.tiers.pools``): one tensor.

The allocator sees :meth:`swap_slots` as its free host blocks (``len``, ``popleft``, ``extend``);
the tiered store sees :meth:`tier_slots` as its free host slots (``pop``, ``append``) and settles the
memory at each step's poll (:meth:`settle`: slots a swap-in freed are read by that step's copy, so the
tier, which copies at once, takes them only after it).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Sequence

from servelab.core.kv_tiers import TierSpec


def host_memory(tiers: Sequence[TierSpec], executor: Any) -> "HostMemory | None":
    """The host memory the swap pool and the host tier of ``tiers`` share (tiers on), or None: no swap
    pool (a policy that never swaps: the tier has its memory alone) or no host tier of this engine's own."""
    index = next((i for i, t in enumerate(tiers) if t.kind == "host" and not t.shared), None)
    if index is None or executor.num_swap_blocks <= 0:
        return None
    tier = tiers[index]
    # both sized from the tier's capacity_gib; a rounding apart, the smaller is the memory
    memory = HostMemory(min(tier.num_blocks, executor.num_swap_blocks), index, min(tier.read_gb_s, tier.write_gb_s))
    memory.pool = executor.host_pool
    return memory


class HostMemory:
    """``num_blocks`` host block slots shared by the swap pool and the host tier (tier ``tier``);
    ``link_gb_s`` is the host link both cross (the tier's); ``pool``: the host pool's tensors on a
    real engine (None in the simulator)."""

    def __init__(self, num_blocks: int, tier: int = 0, link_gb_s: float | None = None) -> None:
        self.num_blocks = num_blocks
        self.tier = tier
        self.link_gb_s = link_gb_s
        self.pool: Any = None
        self.free: deque[int] = deque(range(num_blocks))
        self.swapped = 0  # slots the swap holds now
        self.fresh: set[int] = set()  # freed by a swap-in this step: its copy reads them in the step's execute
        self.max_swapped = 0
        self.reclaimed = 0  # tier blocks given up for a swap-out
        self.reclaim: Callable[[], None] | None = None  # the host tier gives up one block (its slot comes back)
        self.tier_held: Callable[[], int] = lambda: 0  # blocks the host tier holds now

    def tier_capacity(self) -> int:
        """Blocks the host tier may hold now: what the swap leaves (a slot a swap-in freed this step
        only from the next: the tier copies at once, the swap-in in the step's execute)."""
        return self.num_blocks - self.swapped - len(self.fresh)

    def settle(self) -> None:
        """A step ran (its swap copies are done): the slots swap-ins freed are the tier's to take too."""
        self.fresh.clear()

    def swap_slots(self) -> "SwapSlots":
        return SwapSlots(self)

    def tier_slots(self) -> "TierSlots":
        return TierSlots(self)

    def take_for_swap(self) -> int:
        while self.num_blocks - self.swapped - self.tier_held() < 1:  # full: the tier gives a block up
            if self.reclaim is None or not self.tier_held():
                raise RuntimeError("the host memory is full and nothing can give a block up")
            self.reclaim()
            self.reclaimed += 1
        slot = self.free.popleft()  # with real bytes the tier's slots are out of ``free``; without, only counted
        self.swapped += 1
        self.max_swapped = max(self.max_swapped, self.swapped)
        return slot

    def give_back_from_swap(self, slots: Iterable[int]) -> None:
        slots = list(slots)
        self.free.extend(slots)
        self.fresh.update(slots)
        self.swapped -= len(slots)

    def figures(self) -> dict:
        """``summary.json``'s ``host_memory``: its blocks, the most the swap held, tier blocks given up."""
        return {"blocks": self.num_blocks, "shared_by": ["swap", "host tier"], "max_swapped_blocks": self.max_swapped,
                "tier_blocks_given_up_for_swap": self.reclaimed}


class SwapSlots:
    """The allocator's free host blocks: every slot the swap does not hold (the tier's can be reclaimed)."""

    def __init__(self, memory: HostMemory) -> None:
        self.memory = memory

    def __len__(self) -> int:
        return self.memory.num_blocks - self.memory.swapped

    def popleft(self) -> int:
        return self.memory.take_for_swap()

    def extend(self, slots: Iterable[int]) -> None:
        self.memory.give_back_from_swap(slots)


class TierSlots:
    """The tiered store's free host slots: the ones nobody holds."""

    def __init__(self, memory: HostMemory) -> None:
        self.memory = memory

    def __len__(self) -> int:
        return len(self.memory.free)

    def pop(self) -> int:
        free, fresh = self.memory.free, self.memory.fresh
        for i in range(len(free) - 1, -1, -1):  # not one a swap-in reads in this step
            if free[i] not in fresh:
                slot = free[i]
                del free[i]
                return slot
        raise RuntimeError("no host slot free for the tier (its capacity counts the swap's)")

    def append(self, slot: int) -> None:
        self.memory.free.append(slot)
