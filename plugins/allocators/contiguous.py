"""The naive baseline: one contiguous reservation per request, made up front (pre-vLLM serving).

At admission a request reserves one run of consecutive blocks large enough for its prompt plus
``max_tokens`` (``reserve=max_tokens``, capped at ``max_model_len``) or for ``max_model_len``
(``reserve=max_model_len``), first-fit. Two kinds of loss show up in ``usage_stats``:
``kv_waste_fraction`` (internal: reserved but unused slots / reserved slots) and
``kv_external_fragmentation`` (1 - largest free run / free blocks: free space too scattered to
admit). Nothing is shared, so prefix caching is not available.
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass

from servelab.plugin_api import BlockAllocator, ConfigError, Sequence


class ReserveFor(enum.Enum):
    max_tokens = "max_tokens"  # prompt + max_tokens (capped at max_model_len)
    max_model_len = "max_model_len"  # the model's whole context, whatever the request asks


@dataclass
class ContiguousConfig:
    reserve: ReserveFor = ReserveFor.max_tokens
    prefix_caching: bool = False  # not supported: rejected with a clear error


class ContiguousAllocator(BlockAllocator):
    """First-fit contiguous reservations; free runs are kept sorted and merged."""

    name = "contiguous"
    Config = ContiguousConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if config.prefix_caching:
            raise ConfigError("allocator.prefix_caching=true is not supported by allocator=contiguous: "
                             "only allocator=paged shares blocks between requests")
        num_blocks = self.num_blocks
        self.free_runs: list[tuple[int, int]] = [(0, num_blocks)] if num_blocks else []  # (start, length)
        self.reserved: dict[str, tuple[int, int]] = {}  # seq id -> (start, length)
        self.slots_used: dict[str, int] = {}
        self._num_free = num_blocks
        self._used_slots = 0  # sum of slots_used (usage_stats runs every step)

    def _reservation_blocks(self, num_tokens: int) -> int:
        if getattr(self.config.reserve, "value", self.config.reserve) == "max_model_len":
            num_tokens = self.limits.max_model_len
        return -(-min(num_tokens, self.limits.max_model_len) // self.block_size)

    # ---- the interface ------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        total = seq.num_computed_tokens + num_new_tokens
        if seq.id not in self.reserved:
            size = self._reservation_blocks(seq.prompt_len + seq.request.max_tokens)
            index = next((i for i, (_, n) in enumerate(self.free_runs) if n >= size), None)
            if index is None:
                return False
            start, length = self.free_runs[index]
            if length == size:
                del self.free_runs[index]
            else:
                self.free_runs[index] = (start + size, length - size)
            self.reserved[seq.id] = (start, size)
            self._num_free -= size
        if total > self.reserved[seq.id][1] * self.block_size:
            raise RuntimeError(f"request {seq.id!r} grew to {total} tokens beyond its contiguous reservation of "
                               f"{self.reserved[seq.id][1] * self.block_size} slots")
        self._used_slots += total - self.slots_used.get(seq.id, 0)
        self.slots_used[seq.id] = total
        return True

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        if seq.id in self.reserved:
            return True
        size = self._reservation_blocks(seq.prompt_len + seq.request.max_tokens)
        return any(n >= size for _, n in self.free_runs)

    def release_slots(self, seq: Sequence, num_tokens: int) -> None:
        if seq.id in self.slots_used:  # the reservation itself stays: that is this policy
            self._used_slots += num_tokens - self.slots_used[seq.id]
            self.slots_used[seq.id] = num_tokens

    def free(self, seq: Sequence) -> None:
        run = self.reserved.pop(seq.id, None)
        self._used_slots -= self.slots_used.pop(seq.id, 0)
        if run is None:
            return
        self._num_free += run[1]
        i = bisect.bisect(self.free_runs, run)
        self.free_runs.insert(i, run)
        # merge with the next run, then with the previous one
        if i + 1 < len(self.free_runs) and run[0] + run[1] == self.free_runs[i + 1][0]:
            self.free_runs[i] = (run[0], run[1] + self.free_runs.pop(i + 1)[1])
        if i > 0 and self.free_runs[i - 1][0] + self.free_runs[i - 1][1] == self.free_runs[i][0]:
            prev = self.free_runs[i - 1]
            self.free_runs[i - 1] = (prev[0], prev[1] + self.free_runs.pop(i)[1])

    def block_table(self, seq_id: str) -> list[int]:
        run = self.reserved.get(seq_id)
        return list(range(run[0], run[0] + run[1])) if run else []

    def num_free_blocks(self) -> int:
        return self._num_free

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self._reservation_blocks(num_tokens) <= self.num_blocks

    def quiet_decode_tokens(self, seq: Sequence) -> int:
        """Every decode step inside the reservation is quiet."""
        run = self.reserved.get(seq.id)
        return max(0, run[1] * self.block_size - seq.num_computed_tokens) if run else 0

    def count_quiet_decodes(self, num_tokens: int) -> None:
        self._used_slots += num_tokens

    def settle_quiet_decodes(self, seq: Sequence, num_tokens: int) -> None:
        self.slots_used[seq.id] += num_tokens

    def usage_stats(self) -> dict[str, float]:
        reserved = (self.num_blocks - self._num_free) * self.block_size
        used = self._used_slots
        largest = max((n for _, n in self.free_runs), default=0)
        return {
            "kv_waste_fraction": 1.0 - used / reserved if reserved else 0.0,
            "kv_external_fragmentation": 1.0 - largest / self._num_free if self._num_free else 0.0,
        }
