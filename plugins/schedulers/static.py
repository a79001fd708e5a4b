"""Static batching: the pre-2022 baseline (HF ``generate``, FasterTransformer-era servers).

When nothing runs, the requests waiting at that moment (at most ``max_num_seqs``, in arrival
order) form one batch; no other request is admitted until every member has finished, so the
batch waits for its longest member and freed seats stay empty. Members still get their prompt
in chunks when ``chunked_prefill`` is on, and a preempted member comes back before anyone else.
It exists so the gain of continuous batching can be measured inside the framework.
"""

from itertools import islice

from servelab.plugin_api import UNTIL_ARRIVAL, NextDecision, QueueScheduler


class StaticBatchScheduler(QueueScheduler):
    """FIFO batches of up to ``max_num_seqs`` that are admitted together and drain together."""

    name = "static"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.batch: set[str] = set()  # ids of the current batch's unfinished members

    def schedule(self, now: float):
        if not self.batch:
            head = islice(iter(self.waiting), self.limits.max_num_seqs)
            self.batch = {seq.id for seq in head}
        return super().schedule(now)

    def may_admit(self, seq, now: float) -> bool:
        return seq.id in self.batch

    def on_admit(self, seq, now: float) -> None:
        self.batch.add(seq.id)  # a sequence seated when its KV landed (a connector) joins the batch running

    def remove(self, seq) -> None:
        super().remove(seq)
        self.batch.discard(seq.id)

    def next_decision(self, now: float) -> NextDecision:
        return UNTIL_ARRIVAL  # the batch drains in arrival order; a new batch needs someone waiting

    def step_stats(self) -> dict[str, float]:
        return {**super().step_stats(), "batch_members_left": len(self.batch)}
