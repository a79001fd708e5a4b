"""The conformance kit's router checks (``servelab check-plugin router=<name>``).

A router only chooses which replica serves a request; it never changes what is computed, so it is
checked without an engine, on synthetic clusters: :class:`RouterScenario` s of replicas (one mixed
pool, or a prefill pool and a decode pool with disjoint indices) of unequal KV pools, and a fixed
sequence of events (a request arrives; in a prefill/decode cluster its prompt is prefilled and it
moves to the decode pool; it finishes). :func:`drive` plays the events against a router, offering
it :class:`ReplicaView` s that count what it placed (``num_outstanding`` and ``outstanding_tokens``
rise with each placement and fall when the request leaves the replica), and checks each answer.

- :func:`router_scenario`: the seeded scenarios, cycling one pool of equal replicas, one pool of
  unequal replicas where only the large ones can hold the long requests, and prefill/decode pools;
  prompts share prefixes, clients come back, some requests carry a ``cache_salt``;
- :func:`scenario_problem`: one scenario, then the same with a fresh router of the same seed (the
  placements must repeat), then its first half alone (the placements must be those of the whole run:
  a router may not look ahead);
- :func:`spread_problem`: :data:`SPREAD_REQUESTS` requests on :data:`SPREAD_REPLICAS` equal, idle
  replicas that can all hold every request.

Each check answers ``(contract, why)`` for the first broken contract, or None; the contracts are
:data:`ROUTER_CONTRACTS` (the kit's ``CONTRACTS`` include them).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from servelab.core.contexts import RouterContext
from servelab.core.interfaces import ReplicaView, Router
from servelab.core.request import Request

SPREAD_REPLICAS, SPREAD_REQUESTS, SPREAD_MAX_SHARE = 4, 64, 0.75
ROUTER_CONTRACTS = {
    "placed once": "route returns exactly one replica index (an int) for each request and stage, and never raises",
    "offered replica": "the index route returns is that of one of the replicas offered",
    "can hold": "route never chooses a replica whose view has can_hold=False",
    "both pools": "offered the prefill pool on arrival and the decode pool after prefill (disjoint indices), "
                  "route answers each stage with a replica of the pool offered",
    "deterministic": "the same scenario twice, each with a fresh router of the same seed, gives the same placements",
    "causal": "the placements of the first requests are the same whether or not later requests follow "
              "(a router may not look ahead)",
    "spreads load": f"offered {SPREAD_REPLICAS} equal, idle replicas that can all hold every request, each placement "
                    f"counted in num_outstanding and none finishing, no replica gets more than "
                    f"{SPREAD_MAX_SHARE:.0%} of {SPREAD_REQUESTS} requests",
    "on_finish": "calling on_finish(request, replica) for every request on every replica it was placed on "
                 "does not raise",
    "behind servelab route": "behind servelab route over two tiny_code replicas, every request (streamed and "
                             "not) is answered, and runs on the replica the router chose",
    "cluster run": "in the simulator's cluster loop (3 colocated replicas; 2 prefill + 2 decode) every request ends "
                   "exactly once and no KV block is left held",
}
RouterFactory = Callable[[RouterContext], Router]  # a fresh router for a cluster (its replicas and seed)
Problem = tuple[str, str]  # (contract, why)

#: The simulated clusters a router runs in after the synthetic ones (``backend=sim``), and their requests.
SIM_CLUSTERS = (("cluster.replicas=3",), ("cluster.prefill_replicas=2", "cluster.decode_replicas=2"))
SIM_CLUSTER_REQUESTS = 40
_MAX_SEQS = 8  # a synthetic replica runs this many requests at once; the rest of its outstanding ones wait


@dataclass(frozen=True)
class Replica:
    """One synthetic replica: its fixed facts (its load is the driver's count)."""

    index: int
    role: str  # "mixed", "prefill" or "decode"
    num_kv_blocks: int
    block_size: int

    @property
    def capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size


@dataclass(frozen=True)
class RouterScenario:
    """Replicas and events: ``("arrive", i)`` (routed to the first pool), ``("prefilled", i)`` (leaves its
    prefill replica, routed to the decode pool) and ``("finish", i)`` (leaves its last replica);
    ``i`` indexes ``requests``."""

    seed: int
    label: str
    replicas: tuple[Replica, ...]
    requests: tuple[Request, ...]
    events: tuple[tuple[str, int], ...]

    @property
    def disaggregated(self) -> bool:
        return any(r.role == "prefill" for r in self.replicas)

    def pool(self, role: str) -> tuple[Replica, ...]:
        return tuple(r for r in self.replicas if r.role == role)

    def first_arrivals(self, k: int) -> RouterScenario:
        """The events before the ``k+1``-th arrival: the first ``k`` requests, as far as they got then."""
        arrivals = [n for n, (what, _) in enumerate(self.events) if what == "arrive"]
        end = arrivals[k] if k < len(arrivals) else len(self.events)
        return RouterScenario(self.seed, self.label, self.replicas, self.requests, self.events[:end])

    def describe(self) -> str:
        pools = ", ".join(f"{r.index}:{r.role}/{r.num_kv_blocks}x{r.block_size}" for r in self.replicas)
        return (f"router scenario seed={self.seed} ({self.label}; replica:role/blocks x block_size {pools}; "
                f"{len(self.requests)} requests; servelab.kit.conformance_router.router_scenario({self.seed}))")


def context_of(scenario: RouterScenario, seed: int) -> RouterContext:
    """What a router of ``scenario``'s cluster is built with: its replicas, idle, and ``seed``."""
    idle = tuple(ReplicaView(r.index, r.role, True, 0, 0, 0, 0, 0.0, r.num_kv_blocks, r.block_size)
                 for r in scenario.replicas)
    return RouterContext(idle, seed)


# ---- scenarios ---------------------------------------------------------------------------------
def router_scenario(seed: int) -> RouterScenario:
    """Scenario ``seed``: ``seed % 3`` picks the layout (equal mixed replicas, unequal mixed replicas,
    prefill/decode pools); the rest is drawn from ``random.Random(seed)``."""
    rng = random.Random(seed)
    block_size = rng.choice((4, 8, 16))
    layout = seed % 3
    if layout == 2:
        n_prefill, n_decode = rng.randint(1, 3), rng.randint(1, 3)
        roles = ["prefill"] * n_prefill + ["decode"] * n_decode
        label = f"prefill/decode pools of {n_prefill} and {n_decode}"
    else:
        roles = ["mixed"] * rng.randint(1, 5)
        label = f"{len(roles)} {'equal' if layout == 0 else 'unequal'} mixed replicas"
    sizes = [64 if layout == 0 else rng.choice((8, 16, 64)) for _ in roles]
    for role in set(roles):  # every pool has a large replica: every request fits somewhere
        sizes[max(i for i, r in enumerate(roles) if r == role)] = 64
    replicas = tuple(Replica(i, role, size, block_size) for i, (role, size) in enumerate(zip(roles, sizes)))
    requests = _requests(rng, block_size, rng.randint(12, 40))
    return RouterScenario(seed, label, replicas, requests, _events(rng, len(requests), layout == 2))


def _requests(rng: random.Random, block_size: int, n: int) -> tuple[Request, ...]:
    """Prompts sharing a few prefixes (some long enough that only a 64-block replica holds them),
    coming-back clients, some salted; the largest needs at most 60 of 64 blocks."""
    prefixes = [tuple(rng.randrange(1, 1000) for _ in range(rng.randint(0, 3) * block_size)) for _ in range(3)]
    requests = []
    for i in range(n):
        long = rng.random() < 0.2
        suffix = rng.randint(1, (40 if long else 4) * block_size)
        prompt = rng.choice(prefixes) + tuple(rng.randrange(1, 1000) for _ in range(suffix))
        requests.append(Request(f"r{i}", prompt, rng.randint(1, 2 * block_size), arrival_time=0.25 * i,
                                client_id=rng.choice((None, "c0", "c1", "c2", "c3")),
                                cache_salt=rng.choice((None, None, None, "tenant-a"))))
    return tuple(requests)


def _events(rng: random.Random, n: int, disaggregated: bool) -> tuple[tuple[str, int], ...]:
    """Arrivals in order; in between, seeded prefill completions and finishes; at the end, every request
    still placed finishes (after its prefill, in a prefill/decode cluster)."""
    events: list[tuple[str, int]] = []
    prefilling: list[int] = []
    decoding: list[int] = []
    for i in range(n):
        events.append(("arrive", i))
        (prefilling if disaggregated else decoding).append(i)
        while prefilling and rng.random() < 0.5:
            j = prefilling.pop(rng.randrange(len(prefilling)))
            events.append(("prefilled", j))
            decoding.append(j)
        while decoding and rng.random() < 0.4:
            events.append(("finish", decoding.pop(rng.randrange(len(decoding)))))
    events += [("prefilled", j) for j in prefilling]
    events += [("finish", j) for j in decoding + prefilling]
    return tuple(events)


def spread_scenario() -> RouterScenario:
    """:data:`SPREAD_REQUESTS` requests of distinct prompts and clients on :data:`SPREAD_REPLICAS`
    equal replicas, none finishing before the last has arrived."""
    replicas = tuple(Replica(i, "mixed", 64, 16) for i in range(SPREAD_REPLICAS))
    requests = tuple(Request(f"r{i}", tuple(range(1000 + 64 * i, 1064 + 64 * i)), 16, arrival_time=0.25 * i,
                             client_id=f"client{i}") for i in range(SPREAD_REQUESTS))
    events = tuple(("arrive", i) for i in range(SPREAD_REQUESTS)) + tuple(("finish", i) for i in range(SPREAD_REQUESTS))
    return RouterScenario(0, f"{SPREAD_REPLICAS} equal idle replicas", replicas, requests, events)


# ---- driving a router --------------------------------------------------------------------------
class _Broken(Exception):
    def __init__(self, contract: str, why: str) -> None:
        super().__init__(why)
        self.contract, self.why = contract, why


def drive(router: Router, scenario: RouterScenario) -> list[tuple[str, int]]:
    """Play ``scenario``'s events against ``router``, checking each answer; the placements in order,
    as ``(request id, replica index)``. Raises :class:`_Broken` at the first broken contract."""
    outstanding = {r.index: [0, 0] for r in scenario.replicas}  # index -> [requests, tokens]
    where: dict[int, int] = {}  # request -> the replica it is on now
    placements = []
    first_pool = "prefill" if scenario.disaggregated else "mixed"
    for what, i in scenario.events:
        request = scenario.requests[i]
        need = request.prompt_len + request.max_tokens
        if what in ("prefilled", "finish"):
            replica = where.pop(i)
            outstanding[replica][0] -= 1
            outstanding[replica][1] -= need
            _finish(router, request, replica)
        if what == "finish":
            continue
        role = first_pool if what == "arrive" else "decode"
        views = [_view(r, need, *outstanding[r.index]) for r in scenario.pool(role)]
        chosen = _placed(router, request, views, role, scenario)
        where[i] = chosen
        outstanding[chosen][0] += 1
        outstanding[chosen][1] += need
        placements.append((request.id, chosen))
    return placements


def _view(replica: Replica, need: int, num_outstanding: int, outstanding_tokens: int) -> ReplicaView:
    running = min(num_outstanding, _MAX_SEQS)
    return ReplicaView(index=replica.index, role=replica.role, can_hold=need <= replica.capacity_tokens,
                       num_outstanding=num_outstanding, outstanding_tokens=outstanding_tokens,
                       num_waiting=num_outstanding - running, num_running=running,
                       kv_utilization=min(1.0, outstanding_tokens / replica.capacity_tokens),
                       num_kv_blocks=replica.num_kv_blocks, block_size=replica.block_size)


def _placed(router: Router, request: Request, views: list[ReplicaView], role: str, scenario: RouterScenario) -> int:
    """``router``'s answer for ``request`` offered ``views``, once checked."""
    stage = {"mixed": "on arrival", "prefill": "on arrival, prefill pool", "decode": "after prefill, decode pool"}[role]
    where = f"request {request.id!r} ({stage}, t={request.arrival_time:g})"
    try:
        answer = router.route(request, list(views), request.arrival_time)
    except Exception as exc:  # any raise breaks the contract
        raise _Broken("placed once", f"route raised {type(exc).__name__}: {exc} for {where}") from exc
    if not isinstance(answer, int) or isinstance(answer, bool):  # what the cluster accepts
        raise _Broken("placed once", f"route returned {answer!r} for {where}, not one replica index (an int)")
    offered = {v.index: v for v in views}
    if answer not in offered:
        if scenario.disaggregated:
            other = [r.index for r in scenario.replicas if r.role != role]
            whose = " (a replica of the other pool)" if answer in other else ""
            raise _Broken("both pools", f"route returned {answer}{whose} for {where}; the {role} pool offered "
                          f"replicas {sorted(offered)}")
        raise _Broken("offered replica", f"route returned {answer} for {where}; offered replicas {sorted(offered)}")
    if not offered[answer].can_hold:
        able = [v.index for v in views if v.can_hold]
        raise _Broken("can hold", f"route chose replica {answer} for {where}, which cannot hold its "
                      f"{request.prompt_len} + {request.max_tokens} tokens "
                      f"({offered[answer].num_kv_blocks} blocks of {offered[answer].block_size}); "
                      f"replicas that can: {able}")
    return int(answer)


def _finish(router: Router, request: Request, replica: int) -> None:
    try:
        router.on_finish(request, replica)
    except Exception as exc:
        raise _Broken("on_finish", f"on_finish({request.id!r}, {replica}) raised {type(exc).__name__}: {exc}") from exc


# ---- the checks --------------------------------------------------------------------------------
def scenario_problem(make: RouterFactory, scenario: RouterScenario) -> Problem | None:
    """The contracts on ``scenario`` (``make``: a fresh router for a context), then the same again with
    another fresh router (deterministic), then only its first half (causal)."""
    context = context_of(scenario, scenario.seed)
    try:
        placements = drive(make(context), scenario)
        again = drive(make(context), scenario)
    except _Broken as exc:
        return exc.contract, f"{exc.why}; {scenario.describe()}"
    if again != placements:
        n = next(n for n, (a, b) in enumerate(zip(placements, again)) if a != b)
        return "deterministic", (f"placement {n + 1} ({placements[n][0]!r}) went to replica {placements[n][1]}, "
                                 f"then to {again[n][1]} with a fresh router of the same seed; {scenario.describe()}")
    k = sum(what == "arrive" for what, _ in scenario.events) // 2
    try:
        first = drive(make(context), scenario.first_arrivals(k))
    except _Broken as exc:
        return exc.contract, f"{exc.why} (the first {k} requests alone); {scenario.describe()}"
    if first != placements[:len(first)]:
        n = next(n for n, (a, b) in enumerate(zip(first, placements)) if a != b)
        return "causal", (f"with only the first {k} requests, {first[n][0]!r} went to replica {first[n][1]}; "
                          f"with every request, to {placements[n][1]}; {scenario.describe()}")
    return None


def spread_problem(make: RouterFactory) -> Problem | None:
    """:func:`spread_scenario`: no replica gets more than :data:`SPREAD_MAX_SHARE` of the requests."""
    scenario = spread_scenario()
    try:
        placements = drive(make(context_of(scenario, 0)), scenario)
    except _Broken as exc:
        return exc.contract, f"{exc.why}; {scenario.describe()}"
    counts = [sum(chosen == r.index for _, chosen in placements) for r in scenario.replicas]
    if max(counts) > SPREAD_MAX_SHARE * SPREAD_REQUESTS:
        return "spreads load", (f"requests per replica {counts} (of {SPREAD_REQUESTS} on {SPREAD_REPLICAS} equal, "
                                f"idle replicas that can all hold every request)")
    return None
