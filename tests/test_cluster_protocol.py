"""The cluster protocol on its own (no engine, no clock): placement, the prefill->decode hand-off as a
move at the first token, the per-request placement record and the router's books; and that its three
drivers share it (every ReplicaView and every router built in one place)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from servelab.cluster.protocol import ClusterProtocol, Gauges, ReplicaRecord
from servelab.core.contexts import RouterContext
from servelab.core.interfaces import RouterError
from servelab.core.request import Request, Sequence, Status
from servelab.plugins.routers.least_outstanding import LeastOutstandingRouter

REPO = Path(__file__).resolve().parents[1]


@dataclass
class FakeReplica(ReplicaRecord):
    """A replica holding ``capacity`` tokens, context ``max_len``."""

    capacity: int = 1000
    max_len: int = 512

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        need = request.prompt_len + request.max_tokens if tokens is None else tokens
        return request.prompt_len < self.max_len and need <= self.capacity

    def context_length(self) -> int:
        return self.max_len

    def kv_pool(self) -> tuple[int, int]:
        return self.capacity // 16, 16


def protocol(*roles: str, capacity: int = 1000) -> ClusterProtocol[FakeReplica]:
    replicas = [FakeReplica(i, role=role, capacity=capacity) for i, role in enumerate(roles)]
    router = LeastOutstandingRouter(LeastOutstandingRouter.Config(), RouterContext(tuple(r.view(True) for r in replicas)))
    return ClusterProtocol(replicas, router)


def ran(request: Request, tokens: int, t: float) -> Sequence:
    """``request`` computed on a replica: ``tokens`` output tokens, ended at its length at ``t``."""
    seq = Sequence(request, arrival_s=0.0)
    seq.first_scheduled_time = 0.0
    for i in range(tokens):
        seq.append_token(7 + i, t)
    seq.finish("length", t)
    return seq


def test_colocated_placement_is_recorded_counted_and_ended():
    cluster = protocol("mixed", "mixed")
    first, second = Request("a", (1,) * 10, 5), Request("b", (1,) * 20, 5)
    (r0, asked0), (r1, _) = cluster.arrive(first, 0.0), cluster.arrive(second, 0.0)
    assert asked0 is first and {r0.index, r1.index} == {0, 1}  # least outstanding spreads them
    assert cluster.placements["a"].phase == "mixed" and not cluster.placements["a"].handed_on
    view = r0.view(True)
    assert (view.num_outstanding, view.outstanding_tokens, view.num_kv_blocks) == (1, 15, 62)
    final = cluster.ended(r0, ran(first, 5, 1.0))
    assert final.id == "a" and "a" not in cluster.placements
    assert (r0.num_outstanding, r0.prompt_tokens, r0.output_tokens) == (0, 10, 5)


def test_the_hand_off_moves_the_request_at_its_first_token_and_keeps_the_record():
    cluster = protocol("prefill", "decode", "decode")
    request = Request("r", (1,) * 30, 8)
    p, asked = cluster.arrive(request, 0.0)
    assert p.role == "prefill" and asked.max_tokens == 1  # its prompt and first token
    assert cluster.placements["r"].phase == "prefill"
    pseq = ran(asked, 1, 2.0)
    assert cluster.continues(pseq)
    assert cluster.prefill_ended(p, pseq, continues=True) is None
    assert cluster.placements["r"].phase == "prefilled" and p.num_outstanding == 0 and p.output_tokens == 1
    d, dseq = cluster.hand_off(pseq, 2.0)
    placement = cluster.placements["r"]
    assert (placement.replica, placement.phase, placement.came_from) == (d.index, "decode", (p.index,))
    assert placement.handed_on and placement.seq is dseq
    assert dseq.request is request and dseq.output_token_ids == [7] and dseq.token_times == [2.0]
    cluster.prompt_received(d, request, cached_tokens=16)
    for token in range(7):
        dseq.append_token(token, 3.0)
    dseq.finish("length", 3.0)
    cluster.ended(d, dseq)
    # the prompt counted once, where it was received; the first token on the prefill replica
    assert (d.prompt_tokens, d.cached_prompt_tokens, d.output_tokens) == (30, 16, 7)
    assert (p.prompt_tokens, p.output_tokens) == (30, 1) and not cluster.placements


def test_a_migration_is_the_hand_offs_move_at_a_later_token_and_counts_each_token_where_it_was_made():
    cluster = protocol("mixed", "mixed", "mixed")
    request = Request("m", (1,) * 20, 10)
    source, _ = cluster.arrive(request, 0.0)
    seq = Sequence(request, arrival_s=0.0)
    for token in range(4):  # 4 tokens on the source, then it moves, twice
        seq.append_token(token, 1.0)
    first = cluster.replicas[(source.index + 1) % 3]
    moved = cluster.migrate(seq, first)
    placement = cluster.placements["m"]
    assert (placement.replica, placement.phase, placement.came_from) == (first.index, "mixed", (source.index,))
    assert placement.seq is moved and placement.arrived_outputs == 4 and moved.output_token_ids == [0, 1, 2, 3]
    assert (source.num_outstanding, source.prompt_tokens, source.output_tokens) == (0, 20, 4)
    moved.append_token(9, 2.0)
    back = cluster.migrate(moved, source)  # back where it started
    assert cluster.placements["m"].came_from == (source.index, first.index)
    for token in range(5):
        back.append_token(token, 3.0)
    back.finish("length", 3.0)
    cluster.ended(source, back)
    assert (first.prompt_tokens, first.output_tokens, source.output_tokens) == (0, 1, 9)
    assert sum(r.output_tokens for r in cluster.replicas) == 10 and not cluster.placements
    assert all(r.num_outstanding == 0 for r in cluster.replicas)


def test_a_request_that_stops_at_its_first_token_or_cannot_fit_a_decode_replica_ends_as_its_record():
    cluster = protocol("prefill", "decode")
    short = Request("s", (1,) * 10, 1)
    p, asked = cluster.arrive(short, 0.0)
    pseq = ran(asked, 1, 1.0)
    assert not cluster.continues(pseq)  # it asked for one token
    final = cluster.prefill_ended(p, pseq, continues=False)
    assert final is not None and final.request is short and final.status is Status.FINISHED
    assert not cluster.placements
    too_long = Request("l", (1,) * 600, 4)  # over every decode replica's context: the decode replica rejects it
    r, asked = cluster.arrive(too_long, 0.0)
    assert r.role == "decode" and asked is too_long and cluster.placements["l"].phase == "decode"


def test_a_router_that_misplaces_is_a_router_error_and_an_excluded_replica_is_offered_as_full():
    cluster = protocol("mixed", "mixed")
    request = Request("x", (1,) * 10, 5)
    assert cluster.route(request, cluster.mixed, 0.0, exclude={0}) is cluster.replicas[1]
    assert cluster.route(request, cluster.mixed, 0.0, exclude={0, 1}) is None
    cluster.router.route = lambda request, views, now: 0  # type: ignore[method-assign]
    with pytest.raises(RouterError, match="placed request 'x' on replica 0, which cannot hold it"):
        cluster.route(request, cluster.mixed, 0.0, exclude={0})


def test_views_take_the_router_counts_and_the_reported_gauges():
    r = FakeReplica(3, role="decode", tensor_parallel_size=2)
    r.place(Request("a", (1,) * 10, 6))
    r.gauges = Gauges(num_waiting=4, num_running=2, kv_utilization=0.5)
    view = r.view(False)
    assert (view.index, view.role, view.can_hold, view.tensor_parallel_size) == (3, "decode", False, 2)
    assert (view.num_outstanding, view.outstanding_tokens) == (1, 16)
    assert (view.num_waiting, view.num_running, view.kv_utilization) == (4, 2, 0.5)
    with pytest.raises(ValueError, match="replica role 'both'"):
        FakeReplica(0, role="both")


def test_a_view_is_made_again_only_when_what_it_shows_changed():
    r = FakeReplica(0)
    first = r.view(True)
    assert r.view(True) is first  # nothing changed: the same (immutable) view
    r.place(Request("a", (1,) * 10, 6))
    placed = r.view(True)
    assert placed is not first and placed.num_outstanding == 1
    assert r.view(False).can_hold is False and r.view(True) == placed
    r.gauges = Gauges(num_waiting=1)
    assert r.view(True).num_waiting == 1
    r.end(Request("a", (1,) * 10, 6))
    assert (r.view(True).num_outstanding, r.view(True).outstanding_tokens) == (0, 0)


def test_three_drivers_one_protocol():
    """Every ReplicaView of a running cluster and every router plugin are made in one place: the
    protocol's view builder and the kinds-table router builder (the conformance kit's synthetic
    clusters aside)."""
    from servelab.cluster.procs.replica import ProcReplica
    from servelab.cluster.replica import Replica
    from servelab.serve.route.backends import Backend

    assert all(issubclass(cls, ReplicaRecord) for cls in (Replica, ProcReplica, Backend))
    def places(call: str) -> list[str]:
        return sorted(str(path.relative_to(REPO)) for path in (REPO / "framework").rglob("*.py")
                      if re.search(r"(?<![\w.])" + re.escape(call), path.read_text())
                      and not path.name.startswith("conformance"))

    assert places("ReplicaView(") == ["framework/cluster/protocol.py"]
    assert places("RouterContext(") == []  # built by the kinds table (servelab.cluster.router.build_router)


def test_a_disaggregated_cluster_is_identical_with_and_without_fast_forward():
    from servelab.core.registry import default_registry
    from servelab.kit.conformance_fast_forward import run_both_ways

    overrides = ("backend=sim", "hardware=h100", "model=llama3_8b", "max_model_len=2048", "cluster.prefill_replicas=2",
                 "cluster.decode_replicas=2", "router=least_outstanding", "workload.num_requests=60",
                 "workload.rate=30")
    difference, _, _ = run_both_ways(overrides, default_registry())
    assert difference is None, difference
