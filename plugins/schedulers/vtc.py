"""Fair sharing between clients: the Virtual Token Counter (Sheng et al., "Fairness in Serving
Large Language Models", OSDI'24, Algorithm 2).

Each client (``Request.client_id``; requests without one share the anonymous client ``""``) has a
counter of the weighted tokens it was served: ``input_weight`` per prompt token when a request
is admitted, ``output_weight`` per output token as it is generated.

- **Admission.** Among the *backlogged* clients (those with a request in the waiting queue), the
  one with the smallest counter goes next, with its earliest request (ties: the earlier head
  request, then the client id).
- **Counter lift.** A client that becomes backlogged (a request arrives and it had none waiting)
  has its counter raised to the smallest counter among the backlogged clients, or, when nobody
  is backlogged, to the counter of the client admitted last. Idle time is not credit: a client
  cannot bank service while away and then starve the others.
- **Running requests** keep going (VTC is work-conserving and does not preempt for fairness);
  under memory pressure the running request of the client with the largest counter is preempted
  first. A request put back by a recompute preemption returns to the head of its client's queue
  and is not charged its prompt again; its output tokens are never charged twice.

The paper's bound: while two clients are both backlogged, their service differs by at most about
``2 * max(input_weight * max_prompt + output_weight * max_output)`` (with a batch's worth of
slack); ``summary.json``'s ``max_service_gap_tokens`` measures it. Counters grow without bound
over a run (floats; exact up to 2**53 weighted tokens).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterator

from servelab.plugin_api import EVERY_STEP, UNTIL_ARRIVAL, ConfigError, NextDecision, QueueScheduler, Sequence

ANONYMOUS = ""  # the client of requests without a client_id


def client_of(seq: Sequence) -> str:
    client = seq.request.client_id
    return ANONYMOUS if client is None else client


@dataclass
class VTCConfig:
    input_weight: float = 1.0  # counter charge per prompt token admitted (the paper's w_p)
    output_weight: float = 2.0  # counter charge per output token generated (the paper's w_q)


class ClientQueues:
    """The waiting queue: one FIFO per client; the head is the earliest request of the backlogged
    client with the smallest counter. ``peek`` is O(backlogged clients)."""

    def __init__(self, counters: dict[str, float]) -> None:
        self._counters = counters
        self._queues: dict[str, deque[Sequence]] = {}
        self._len = 0

    def is_backlogged(self, client: str) -> bool:
        return bool(self._queues.get(client))

    def backlogged(self) -> Iterator[str]:
        return (c for c, q in self._queues.items() if q)

    def push(self, seq: Sequence) -> None:
        self._queues.setdefault(client_of(seq), deque()).append(seq)
        self._len += 1

    def push_front(self, seq: Sequence) -> None:
        self._queues.setdefault(client_of(seq), deque()).appendleft(seq)
        self._len += 1

    def _head_client(self) -> str:
        counters = self._counters
        return min(self.backlogged(), key=lambda c: (counters[c], self._queues[c][0].arrival_s, c))

    def peek(self) -> Sequence:
        return self._queues[self._head_client()][0]

    def pop(self) -> Sequence:
        self._len -= 1
        return self._queues[self._head_client()].popleft()

    def remove(self, seq: Sequence) -> None:
        self._queues[client_of(seq)].remove(seq)
        self._len -= 1

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence, client by client (not in admission order)."""
        return (seq for q in self._queues.values() for seq in q)

    def __len__(self) -> int:
        return self._len


class VTCScheduler(QueueScheduler):
    """Admission by the smallest virtual token counter among backlogged clients."""

    name = "vtc"
    Config = VTCConfig

    def __init__(self, config, *args, **kwargs) -> None:
        for key in ("input_weight", "output_weight"):
            if not getattr(config, key) > 0:
                raise ConfigError(f"scheduler.{key}={getattr(config, key)} must be > 0 (weighted tokens per token)")
        self.counters: dict[str, float] = {}
        self._charged_outputs: dict[str, int] = {}  # seq id -> output tokens already charged
        self._last_admitted: str | None = None  # the client whose request left the queue last
        super().__init__(config, *args, **kwargs)

    def make_waiting_queue(self) -> ClientQueues:
        return ClientQueues(self.counters)

    # ---- counters -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        client = client_of(seq)
        counters = self.counters
        counters.setdefault(client, 0.0)
        if not self.waiting.is_backlogged(client):  # the counter lift
            floor = min((counters[c] for c in self.waiting.backlogged()), default=None)
            if floor is None and self._last_admitted is not None:
                floor = counters[self._last_admitted]
            if floor is not None and floor > counters[client]:
                counters[client] = floor
        super().add(seq)  # the waiting queue (or, when its KV comes through a connector, the KV path)

    def on_admit(self, seq: Sequence, now: float) -> None:
        client = client_of(seq)
        self._last_admitted = client
        if seq.id not in self._charged_outputs:  # first admission: the prompt is charged once
            self.counters[client] += self.config.input_weight * seq.request.prompt_len
            self._charged_outputs[seq.id] = seq.num_output_tokens

    def _charge_outputs(self, seq: Sequence) -> None:
        charged = self._charged_outputs.get(seq.id)
        if charged is not None and seq.num_output_tokens > charged:
            self.counters[client_of(seq)] += self.config.output_weight * (seq.num_output_tokens - charged)
            self._charged_outputs[seq.id] = seq.num_output_tokens

    def schedule(self, now: float):
        for seq in self.running:  # the tokens the last step generated
            self._charge_outputs(seq)
        return super().schedule(now)

    def next_decision(self, now: float) -> NextDecision:
        """One client running: its counter moves but no order does, and with whole-number weights a
        late charge of k tokens equals k charges of one. Several clients: their counters race and
        the running order can change at any step."""
        cfg = self.config
        one_client = len({client_of(seq) for seq in self.running}) <= 1
        whole = float(cfg.input_weight).is_integer() and float(cfg.output_weight).is_integer()
        in_order = self.running_sorted_by(lambda seq: seq.arrival_s)  # one counter: the sort goes by arrival
        return UNTIL_ARRIVAL if one_client and whole and in_order else EVERY_STEP

    def remove(self, seq: Sequence) -> None:
        self._charge_outputs(seq)
        self._charged_outputs.pop(seq.id, None)
        super().remove(seq)

    # ---- order of running sequences -----------------------------------------------------
    def running_order(self, running: list[Sequence], now: float) -> list[Sequence]:
        counters = self.counters
        running.sort(key=lambda seq: (counters[client_of(seq)], seq.arrival_s))
        return running
