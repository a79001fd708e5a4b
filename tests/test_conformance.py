"""The conformance kit (servelab.testing.check_plugin, ``servelab check-plugin``): every built-in
passes it, and deliberately broken plugins are caught with the broken contract named and a
reproducing scenario printed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from conftest import REPO
from servelab.kit.conformance_cases import make_scenario
from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import SpeculativeDrafter
from servelab.plugins.allocators.paged import PagedAllocator
from servelab.plugins.preemption.recompute import RecomputePreemption
from servelab.core.registry import build_registry, default_registry
from servelab.core.request import Sequence, Status
from servelab.engine.scheduling import QueueScheduler
from servelab.testing import check_plugin, servelab_plugin_manager

CASES = 5  # per built-in: a few seconds per kind (CI); servelab check-plugin runs 50 by default
REAL_MODEL = {"scheduler": "priority", "allocator": "contiguous", "preemption": "swap", "drafter": "ngram",
              "length_predictor": "oracle", "evictor": "arc"}


@pytest.mark.parametrize("kind", ["scheduler", "allocator", "preemption", "drafter", "length_predictor", "evictor"])
def test_every_builtin_passes(kind):
    for name in default_registry().names(kind):
        overrides = ("model=tiny_code",) if name == "learned" else ()  # trained for that checkpoint only
        report = check_plugin(kind, name, cases=CASES, real_model=name == REAL_MODEL[kind], overrides=overrides)
        assert report.ok, str(report)
        assert report.cases == (0 if name == "draft_model" else CASES)


# ---- deliberately broken plugins -------------------------------------------------------------
class OverBudget(QueueScheduler):
    """Plans with twice the step's token budget."""

    name = "over_budget"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = dataclasses.replace(self.limits, max_num_batched_tokens=2 * self.limits.max_num_batched_tokens)


class ExtraSeats(QueueScheduler):
    """Seats two more sequences than max_num_seqs."""

    name = "extra_seats"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = dataclasses.replace(self.limits, max_num_seqs=self.limits.max_num_seqs + 2)


class _TrustingAllocator:
    """Says yes to a one-token allocation without making room (everything else passes through)."""

    def __init__(self, real) -> None:
        self._real = real

    def allocate_slots(self, seq, n):
        return True if n == 1 else self._real.allocate_slots(seq, n)

    def __getattr__(self, name):
        return getattr(self._real, name)


class NoDecodeBlocks(QueueScheduler):
    """Forgets to allocate blocks for decodes."""

    name = "no_decode_blocks"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.allocator = _TrustingAllocator(self.allocator)


class WrongVictim(RecomputePreemption):
    """Returns a copy of a candidate, not one of the candidates."""

    name = "wrong_victim"

    def select_victim(self, candidates):
        return Sequence(candidates[-1].request)


class LeakyPaged(PagedAllocator):
    """free() of a finished sequence forgets its last block."""

    name = "leaky"

    def free(self, seq) -> None:
        table = self.tables.get(seq.id)
        if table and seq.status is Status.FINISHED:
            self.tables[seq.id] = table[:-1]
        super().free(seq)


class KeepsAbortedWaiting(QueueScheduler):
    """abort() only drops running sequences: an aborted waiting request stays queued."""

    name = "keeps_aborted_waiting"

    def abort(self, seq) -> None:
        self.remove(seq)


class LeaksOnAbort(PagedAllocator):
    """free() of an aborted sequence keeps its blocks."""

    name = "leaks_on_abort"

    def free(self, seq) -> None:
        if seq.status is not Status.ABORTED:
            super().free(seq)


class OutOfVocab(SpeculativeDrafter):
    """Drafts an id past every vocabulary."""

    name = "out_of_vocab"

    @property
    def num_speculative_tokens(self) -> int:
        return 2

    def propose(self, seqs, k):
        return [[10**6] * k for _ in seqs]


class CountsProposals(SpeculativeDrafter):
    """Drafts the last token again and counts its proposals per sequence; never forgets one."""

    name = "counts_proposals"

    def __init__(self, config, limits) -> None:
        super().__init__(config, limits)
        self.proposals: dict[str, int] = {}

    @property
    def num_speculative_tokens(self) -> int:
        return 2

    def propose(self, seqs, k):
        for seq in seqs:
            self.proposals[seq.id] = self.proposals.get(seq.id, 0) + 1
        return [[seq.token_ids[-1]] * k for seq in seqs]


class _Ledger:
    def __init__(self) -> None:
        self.admitted: list = []


class RemembersEveryone(QueueScheduler):
    """FCFS that also files every sequence it is given in a ledger (an object it holds), for good."""

    name = "remembers_everyone"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = _Ledger()

    def add(self, seq) -> None:
        self.ledger.admitted.append(seq)
        super().add(seq)


class NotesIds(PagedAllocator):
    """Notes the id of every sequence it allocates for, and never drops the note (free() forgets it)."""

    name = "notes_ids"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen_ids: set[str] = set()

    def allocate_slots(self, seq, n):
        self.seen_ids.add(seq.id)
        return super().allocate_slots(seq, n)


@dataclasses.dataclass
class UnboundedConfig:
    max_wait_s: float = 1.0  # promised, then ignored


class IgnoresItsBound(QueueScheduler):
    """Shortest prompt first; declares a starvation bound and never applies it."""

    name = "ignores_its_bound"
    Config = UnboundedConfig

    def waiting_key(self):
        return lambda seq: (seq.prompt_len, seq.arrival_s)


class SeatsForDeadlines(QueueScheduler):
    """Seats two sequences more than max_num_seqs while a request with a tight TTFT target waits: a
    fault only requests with SLOs bring out."""

    name = "seats_for_deadlines"

    def schedule(self, now):
        limits = self.limits
        if any(seq.request.ttft_slo_ms is not None and seq.request.ttft_slo_ms < 100 for seq in self.waiting):
            self.limits = dataclasses.replace(limits, max_num_seqs=limits.max_num_seqs + 2)
        try:
            return super().schedule(now)
        finally:
            self.limits = limits


class _Broken:
    @hookimpl
    def servelab_register_schedulers(self):
        return [OverBudget, ExtraSeats, NoDecodeBlocks, IgnoresItsBound, KeepsAbortedWaiting, RemembersEveryone,
                SeatsForDeadlines]

    @hookimpl
    def servelab_register_preemption_policies(self):
        return [WrongVictim]

    @hookimpl
    def servelab_register_allocators(self):
        return [LeakyPaged, LeaksOnAbort, NotesIds]

    @hookimpl
    def servelab_register_drafters(self):
        return [OutOfVocab, CountsProposals]


@pytest.fixture(scope="module")
def registry():
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(_Broken())
    return build_registry(pm)


@pytest.mark.parametrize("kind, name, contract", [
    ("scheduler", "over_budget", "budget"),
    ("scheduler", "extra_seats", "seats"),
    ("scheduler", "no_decode_blocks", "blocks allocated"),
    ("preemption", "wrong_victim", "victim among candidates"),
    ("allocator", "leaky", "leaked blocks"),
    ("drafter", "out_of_vocab", "drafts"),
    ("scheduler", "keeps_aborted_waiting", "abort"),
    ("allocator", "leaks_on_abort", "abort"),
    ("drafter", "counts_proposals", "state left behind"),
    ("scheduler", "remembers_everyone", "state left behind"),
    ("allocator", "notes_ids", "state left behind"),
])
def test_a_broken_plugin_is_caught_naming_the_contract(registry, kind, name, contract):
    report = check_plugin(kind, name, registry=registry, cases=12, real_model=False, max_failures=1)
    assert not report.ok and report.contracts_broken == [contract], str(report)
    text = str(report)
    assert f"{kind}={name}: FAIL" in text and f"contract broken: {contract}" in text
    assert "reproduce: seed=" in text and f"{kind}={name}" in text and "Request('r" in text
    scenario = report.failures[0].scenario  # shrunk: requests dropped while the contract still breaks
    assert len(scenario.requests) <= len(make_scenario(scenario.seed, kind, name).requests)


@pytest.mark.parametrize("kind, name, attribute", [
    ("drafter", "counts_proposals", "self.proposals"),
    ("scheduler", "remembers_everyone", "self.ledger.admitted"),  # one level down, Sequence objects
    ("allocator", "notes_ids", "self.seen_ids"),
])
def test_state_left_behind_names_the_plugin_and_the_attribute(registry, kind, name, attribute):
    report = check_plugin(kind, name, registry=registry, cases=3, real_model=False, max_failures=1)
    assert report.contracts_broken == ["state left behind"], str(report)
    message = report.failures[0].message
    assert f"{kind} plugin {name!r} still holds ended sequence 'r" in message
    assert f"in {attribute} (" in message
    hook = {"drafter": "forget()", "scheduler": "remove()/abort()", "allocator": "free()"}[kind]
    assert message.endswith(hook)


def test_the_real_model_check_catches_a_leak(registry):
    report = check_plugin("allocator", "leaky", registry=registry, cases=0)
    assert report.contracts_broken == ["leaked blocks"] and "real model" in str(report)


def _check_plugin_cli(*args):
    return subprocess.run([sys.executable, str(REPO / "run.py"), "check-plugin", *args], capture_output=True,
                          text=True, timeout=300)


def test_the_cli_exits_0_only_when_it_passes():
    proc = _check_plugin_cli("scheduler=fcfs", "--cases", "3", "--no-real-model")
    assert proc.returncode == 0 and "scheduler=fcfs: PASS (3 random scenarios)" in proc.stdout, proc.stderr
    proc = _check_plugin_cli("scheduler=nope", "--cases", "1")
    assert proc.returncode == 2 and "unknown scheduler 'nope'" in proc.stderr


def test_an_ignored_starvation_bound_is_caught(registry):
    report = check_plugin("scheduler", "ignores_its_bound", registry=registry, cases=2, real_model=False)
    assert report.contracts_broken == ["starvation bound"], str(report)
    assert "the long request waited" in str(report)


def test_the_kits_fast_compose_gives_what_hydra_composes():
    """The scenario's scalar keys are set on a cached composition of the rest: the same config."""
    from omegaconf import OmegaConf

    from servelab.api import compose
    from servelab.kit.conformance import _compose, merge_overrides

    for seed, kind, name in ((0, None, None), (3, None, None), (5, "evictor", "lru"), (7, "allocator", "contiguous")):
        overrides = merge_overrides(("model=tiny",), make_scenario(seed, kind, name).overrides)
        fast = OmegaConf.to_container(_compose(overrides), resolve=True)
        full = compose([*overrides, "workload=synthetic"], logger="none", progress=False)
        assert fast == OmegaConf.to_container(full, resolve=True), overrides


# ---- mixed SLO classes ------------------------------------------------------------------------
def test_the_mixed_slo_scenarios_are_caught_breaking_a_contract_only_slos_bring_out(registry):
    """With no random scenario at all, the fixed mixed-SLO ones find a fault that shows only while a
    request with a tight target waits."""
    report = check_plugin("scheduler", "seats_for_deadlines", registry=registry, cases=0, real_model=False)
    assert report.contracts_broken == ["seats"], str(report)
    assert "mixed SLO classes (the kit's fixed scenario 0)" in str(report) and "Request('tight-" in str(report)


def test_the_mixed_slo_scenarios_exercise_a_deadline_aware_order():
    """The scenarios make slo_aware (deadlines, late requests) and priority (the classes' priorities)
    start requests in another order than fcfs, under preemption, and slo_aware meet more targets."""
    from servelab.kit.conformance import _run
    from servelab.kit.conformance_slo_mix import SLO_MIX_SEEDS, slo_mix_scenario

    preempted = 0
    for seed in SLO_MIX_SEEDS:
        runs = {}
        for name in ("fcfs", "slo_aware", "priority"):
            scenario = slo_mix_scenario(seed, name)
            _, result = _run(scenario.overrides, scenario.num_blocks, scenario.num_swap_blocks, scenario.requests,
                             default_registry(), checked=False)
            started = sorted(result.requests, key=lambda r: r["arrival_s"] * 1e3 + r["queue_ms"])
            runs[name] = ([r["id"] for r in started], result.summary)
        assert runs["slo_aware"][0] != runs["fcfs"][0] and runs["priority"][0] != runs["fcfs"][0]
        assert runs["slo_aware"][1]["slo_attainment"] > runs["fcfs"][1]["slo_attainment"]
        assert {r.slo_class for r in slo_mix_scenario(seed, "fcfs").requests} == {"tight", "loose", "none"}
        preempted += runs["fcfs"][1]["num_preemptions"]
    assert preempted > 0
