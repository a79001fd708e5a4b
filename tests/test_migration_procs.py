"""Live migration between engine processes, the child's side in one process (issue 45, item 5): the
messages of :mod:`servelab.cluster.procs.migrate_child` between two real engines (``model=tiny``, no
spawn) move a request mid-decode with its KV read from one pool and written into the other (above the
prefix the target had cached), and its tokens equal one engine's; a target without room says no and holds nothing; a request that is not
there is answered ``finished``; the parent's driver (on replicas that are message lists) aborts when the
target has no room or the request ends first, and moves and records a migration that completes. The
spawned cluster is tests/test_cluster_procs_migration.py."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import torch

from servelab.api import compose
from servelab.cluster.migration import MigrationSettings
from servelab.cluster.procs.migration import ProcMigrationDriver
from servelab.cluster.procs.replica import ProcReplica
from servelab.cluster.protocol import ClusterProtocol
from servelab.core.contexts import MigrationPolicyContext
from servelab.core.interfaces import EngineLimits
from servelab.core.migration_policy import Migrate, MigrationPolicy, ReplicaLoad, RequestLoad
from servelab.kv.pd.process import KVPayload
from servelab.cluster.procs.migrate_child import MigrationEndpoint
from servelab.cluster.protocol import continued
from servelab.core.request import Request, Sequence
from servelab.kv.migrate_proc import ProcessMigrationConnector
from servelab.assemble.stack import build_stack

from engine_helpers import drain

REAL = ["model=tiny", "clock=virtual", "time_model=roofline", "hardware=h100", "num_kv_blocks=48",
        "allocator.prefix_caching=true"]


class Outbox(list):
    """The child's pipe to the parent, as a list of what was sent (its gauge reports left out)."""

    def send(self, message) -> None:
        if message[0] != "gauges":
            self.append(message)


def _requests(vocab: int) -> list[Request]:
    rng = random.Random(0)
    return [Request(id=f"r{i}", prompt_token_ids=tuple(rng.randrange(vocab) for _ in range(20 + 9 * i)),
                    max_tokens=24, arrival_time=0.0) for i in range(3)]


def _replica(index: int, *overrides: str):
    stack = build_stack(compose([*REAL, *overrides], logger="none", progress=False),
                        connector=ProcessMigrationConnector())
    outbox = Outbox()
    ended: list = []
    endpoint = MigrationEndpoint(index, stack.engine, stack.engine.connector.bind(stack.executor), outbox)
    stack.engine.end_listeners.append(lambda seq: None if endpoint.silenced(seq) else ended.append(seq))
    return stack, endpoint, outbox, ended


def test_a_request_moves_mid_decode_with_its_kv_and_gives_one_engines_tokens():
    one = build_stack(compose(REAL, logger="none", progress=False))
    requests = _requests(one.executor.spec.vocab_size)
    ref = {r.id: one.engine.add_request(r, 0.0) for r in requests}
    drain(one.engine)

    a, ea, box_a, ended_a = _replica(0)
    b, eb, box_b, ended_b = _replica(1)
    b.engine.add_request(replace(requests[2], id="warm", max_tokens=1), 0.0)  # its prompt's blocks cached there
    drain(b.engine)
    warm_prefill = b.engine.totals.prefill_tokens
    for r in requests:
        a.engine.add_request(r, 0.0)
    moving, request = a.engine.sequences["r2"], requests[2]
    while moving.num_output_tokens < 3:
        a.engine.step()
    ea.handle(("mig_read", "r2", 0, False))  # stage 0: all it computed, while it keeps running
    kind, _, rid, start, payload, reason = box_a.pop()
    assert (kind, rid, start, reason, payload.num_tokens) == ("mig_kv", "r2", 0, None, moving.num_computed_tokens)
    eb.handle(("mig_hold", request, 0, payload, payload.num_tokens))
    assert box_b.pop() == ("mig_held", 1, "r2", True)
    assert b.engine.allocator.num_used_blocks() == -(-payload.num_tokens // b.limits.block_size)  # held for it
    assert eb.incoming["r2"][0].num_computed_tokens == 32  # two of its blocks were cached there
    a.engine.step()
    a.engine.step()  # it decodes on while its KV is on its way
    copied = payload.num_tokens
    ea.handle(("mig_read", "r2", copied, True))  # stop-and-copy
    kind, _, rid, seq, start, last, _ = box_a.pop()
    assert (kind, rid, start) == ("mig_stopped", "r2", copied) and last.num_tokens == 2
    assert "r2" not in a.engine.sequences and not ended_a  # stopped here, not ended
    eb.handle(("mig_seq", continued(seq, request), start, last))
    assert b.engine.allocator.num_used_blocks() == 0  # the shadow's blocks went: the continuation takes its own
    drain(b.engine)
    drain(a.engine)
    assert box_b[0][:3] == ("mig_landed", 1, "r2")
    assert b.engine.totals.prefill_tokens == warm_prefill  # it decodes on at once: its KV came with it
    got = {s.id: list(s.output_token_ids) for s in (*ended_a, *ended_b) if s.id != "warm"}
    assert got == {i: list(s.output_token_ids) for i, s in ref.items()}
    assert a.engine.allocator.leaked_blocks() == 0 and b.engine.allocator.leaked_blocks() == 0


def test_a_target_without_room_says_no_and_holds_nothing():
    a, ea, box_a, _ = _replica(0)
    b, eb, box_b, _ = _replica(1, "num_kv_blocks=2")
    request = _requests(a.executor.spec.vocab_size)[2]  # 38 prompt tokens: three blocks
    a.engine.add_request(request, 0.0)
    while a.engine.sequences[request.id].num_output_tokens < 2:
        a.engine.step()
    ea.handle(("mig_read", request.id, 0, False))
    payload = box_a.pop()[4]
    eb.handle(("mig_hold", request, 0, payload, payload.num_tokens))
    assert box_b.pop() == ("mig_held", 1, request.id, False)
    assert b.engine.allocator.num_used_blocks() == 0 and not eb.incoming
    assert a.engine.sequences[request.id].status.value == "running"  # it goes on where it was


def test_a_request_that_is_not_there_is_answered_finished():
    a, ea, box_a, _ = _replica(0)
    ea.handle(("mig_read", "nobody", 0, True))
    assert box_a == [("mig_kv", 0, "nobody", 0, None, "finished")]
    assert not ea.handle(("add", None, 0.0, False))  # not a migration's message


# ---- the parent's side: the driver's books, on replicas that are message lists -------------------
class Inbox(list):
    def put(self, message) -> None:
        self.append(message)


class MoveToZero(MigrationPolicy):
    name = "move_to_zero"

    def decide(self, replicas, now):
        return [Migrate(q.id, 0) for q in replicas[1].running if not q.migrating]


def _parent():
    limits = EngineLimits(block_size=16, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512,
                          chunked_prefill=True)
    replicas = [ProcReplica(i, None, Inbox(), None, limits=limits, num_kv_blocks=32) for i in range(2)]
    cluster = SimpleNamespace(replicas=replicas, t0=0.0)
    cluster.protocol = ClusterProtocol(replicas, SimpleNamespace(on_finish=lambda request, index: None))
    driver = ProcMigrationDriver(cluster, MoveToZero(MoveToZero.Config(), MigrationPolicyContext(2, 0.1)), MigrationSettings(interval_s=0.1))
    request = Request(id="q", prompt_token_ids=tuple(range(40)), max_tokens=20)
    cluster.protocol.place(replicas[1], request)
    replicas[1].load = ReplicaLoad(1, "mixed", 32, 16, 3, 29, (RequestLoad("q", 1, 40, 2, 20, 3, 3),))
    return driver, replicas, request


def _payload(n: int) -> KVPayload:
    return KVPayload(n, torch.zeros(1, 2, n, 1, 4), None, 0.0, 0.0)


def test_the_parent_aborts_a_migration_when_the_target_has_no_room_or_the_request_ends():
    driver, (r0, r1), request = _parent()
    driver.tick(0.1)
    assert r1.inbox.pop() == ("mig_read", "q", 0, False) and driver.loads()[1].running[0].migrating
    driver.kv(r1, "q", 0, _payload(41), None)  # three blocks: another stage follows
    assert r0.inbox.pop()[:3] == ("mig_hold", request, 0)
    driver.held(r0, "q", False)
    assert not driver.active and driver.sums.aborted == {"target full": 1} and not r1.inbox
    driver.tick(0.2)  # asked again: it moves again
    driver.kv(r1, "q", 0, _payload(41), None)
    driver.held(r0, "q", True)
    assert r1.inbox.pop() == ("mig_read", "q", 41, False)
    driver.kv(r1, "q", 41, _payload(2), None)  # one block: the next read stops it
    driver.held(r0, "q", True)
    assert r1.inbox.pop() == ("mig_read", "q", 43, True)
    driver.ended(r1, "q")  # it ended on its source before the stop
    assert r0.inbox.pop() == ("mig_drop", "q") and driver.sums.aborted["finished"] == 1
    driver.kv(r1, "q", 43, None, "finished")  # the source's answer to the stop, about a migration gone: ignored
    assert not driver.active and driver.sums.done == []


def test_the_parent_moves_the_request_at_the_stop_and_records_the_migration_when_it_lands():
    driver, (r0, r1), request = _parent()
    driver.tick(0.1)
    driver.kv(r1, "q", 0, _payload(41), None)
    driver.held(r0, "q", True)
    driver.kv(r1, "q", 41, _payload(1), None)
    driver.held(r0, "q", True)
    stopped = Sequence(request)
    for token in (5, 6, 7):
        stopped.append_token(token, 0.3)
    driver.stopped(r1, "q", stopped, 42, _payload(1), 0.35)
    kind, moved, start, _ = r0.inbox[-1]
    assert (kind, moved.output_token_ids, start) == ("mig_seq", [5, 6, 7], 42)
    assert driver.protocol.placements["q"].replica == 0 and driver.loads()[1].running == ()  # on one replica
    driver.landed(r0, "q", 0.4)
    (m,) = driver.sums.done
    assert (m.source, m.target, m.num_tokens, m.num_stages, m.stop_s, m.land_s) == (1, 0, 43, 2, 0.35, 0.4)
    assert m.nbytes == _payload(43).nbytes and not driver.active
