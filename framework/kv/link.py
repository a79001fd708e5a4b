"""Pricing a prompt's KV moving from a prefill replica to a decode replica.

A transfer of ``b`` bytes takes ``latency + b / (bandwidth x lanes)``: each GPU of the sending
replica has its own link (NVLink ports on one node; one NIC per GPU between nodes, as on DGX
H100 / A100), and its shard of the KV (its heads) goes to the matching decode GPU, so
``min(TP_prefill, TP_decode)`` links carry it at once. Links are per GPU and direction; a sending
replica's links carry one transfer at a time (first come, first served).

Overlapped (``cluster.overlap_kv_transfer``, as Splitwise and DistServe stream KV layer by layer
while the prefill runs): the stream starts with the prefill, so after the prefill ends only what
the link could not hide remains, and at least the last layer's share. A transfer that waited for
the decode replica's blocks (back-pressure) was not streamed: it starts once they are allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.shapes import HardwareProfile


@dataclass(frozen=True)
class KVLink:
    """The link between two replicas: per-lane bytes/s, a per-transfer latency, parallel lanes."""

    bytes_per_s: float
    latency_s: float
    lanes: int
    kind: str  # "intra_node" | "inter_node"

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / (self.bytes_per_s * self.lanes) if nbytes > 0 else 0.0


def kv_link(sender: HardwareProfile, receiver: HardwareProfile, same_node: bool, lanes: int) -> KVLink:
    """The slower end's link (bandwidth and latency) between two replicas' GPUs."""
    (bw_a, lat_a), (bw_b, lat_b) = sender.kv_link(same_node), receiver.kv_link(same_node)
    return KVLink(min(bw_a, bw_b), max(lat_a, lat_b), max(1, lanes), "intra_node" if same_node else "inter_node")


@dataclass
class Transfer:
    """One prompt's KV on its way: who sends it, when it lands, what it cost."""

    request_id: str
    sender: int
    receiver: int
    nbytes: float
    start_s: float
    done_s: float
    duration_s: float
    exposed_s: float  # time from the prefill's end to the landing (waiting for blocks included)


def schedule_transfer(link: KVLink, nbytes: float, link_free_s: float, prefill_start_s: float, prefill_end_s: float,
                      allocated_s: float, num_layers: int, overlap: bool) -> tuple[float, float, float]:
    """(start, done, duration) of a transfer on a link that is free from ``link_free_s``."""
    duration = link.seconds(nbytes)
    if overlap and allocated_s <= prefill_end_s:
        start = max(prefill_start_s, link_free_s)
        done = max(start + duration, prefill_end_s + duration / max(1, num_layers))
    else:
        start = max(allocated_s, link_free_s)
        done = start + duration
    return start, done, duration
