"""Plugin kinds are data: a kind added by a package (one KindSpec, its base class, its context and
its contracts, nothing else) is selectable from run.py, listed by --help, checked by check-plugin
and scaffolded by new-plugin; every kind is built as ``Plugin(config, context)``; a plugin written
to the 0.1 constructor still runs, through an adapter that warns once."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from servelab.core.kinds import BUILTIN_KINDS, KINDS, build_context, build_order, instantiate
from servelab.plugin_api import AllocatorContext, EngineLimits, QueueScheduler, SchedulerContext, StepCostModel

REPO = Path(__file__).resolve().parents[1]

TOY_PACKAGE = '''
"""A third-party package that adds a plugin kind, ``toy``, and two plugins of it."""
from dataclasses import dataclass
from pathlib import Path

from servelab.plugin_api import BlockAllocator, EngineLimits, KindSpec, Plugin, hookimpl
from servelab.testing import FakeExecutor, VirtualClock


@dataclass(frozen=True)
class ToyContext:
    limits: EngineLimits
    allocator: BlockAllocator  # a field named like a kind: that kind's plugin, built first


class Toy(Plugin):
    """The kind's base class."""
    context_type = ToyContext


@dataclass
class LoudConfig:
    path: str = ""


class Plain(Toy):
    name = "plain"


class Loud(Toy):
    name = "loud"
    Config = LoudConfig

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.path:  # proves the run built it, with its context filled
            Path(config.path).write_text(f"{context.limits.block_size} {type(context.allocator).name}")


def check(run):
    run.report.notes.append("toy stage ran")
    cls = run.registry.get("toy", run.name)
    assert issubclass(cls, Toy)


KIND = KindSpec("toy", Toy, "servelab_register_toys", ToyContext, "plain", "a kind made in a test",
                checks=("toykind:check",))


class FakeBackend(FakeExecutor):
    """A third-party executor: servelab's test double, selected as backend=fake."""
    name = "fake"

    def __init__(self, config, context):
        super().__init__(VirtualClock(), num_kv_blocks=context.num_kv_blocks or 256, vocab_size=4096)


@hookimpl
def servelab_register_executors():
    return [FakeBackend]


@hookimpl
def servelab_register_kinds():
    return [KIND]


@hookimpl
def servelab_register_toys():
    return [Plain, Loud]
'''


@pytest.fixture(scope="module")
def toy_path(tmp_path_factory) -> Path:
    """A folder holding the package ``toykind`` and its installed metadata (an entry point of the
    ``servelab`` group), as pip would leave them."""
    root = tmp_path_factory.mktemp("toykind")
    (root / "toykind.py").write_text(textwrap.dedent(TOY_PACKAGE))
    info = root / "toykind-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toykind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[servelab]\ntoykind = toykind\n")
    return root


def _servelab(toy_path: Path, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(toy_path), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_kind_from_a_package_reaches_run_help_check_plugin_and_new_plugin(toy_path, tmp_path):
    marker = tmp_path / "built.txt"
    run = _servelab(toy_path, "toy=loud", f"toy.path={marker}", "backend=sim", "model=llama3_8b", "logger=none",
                    "workload.num_requests=5", f"hydra.run.dir={tmp_path / 'run'}")
    assert run.returncode == 0, run.stderr[-2000:]
    assert marker.read_text() == "16 paged"  # built by the stack, its context filled from the run

    text = _servelab(toy_path, "--help").stdout
    assert "toy  (default: plain)  - a kind made in a test" in text
    assert "  loud: path: str = " in text

    check = _servelab(toy_path, "check-plugin", "toy=loud")
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    assert "toy=loud: PASS" in check.stdout and "toy stage ran" in check.stdout

    made = _servelab(toy_path, "new-plugin", "toy", "my_toy", "--dir", str(tmp_path))
    assert made.returncode == 0, made.stderr[-2000:]
    module = (tmp_path / "my_toy" / "servelab_my_toy" / "__init__.py").read_text()
    assert "from toykind import Toy" in module and "def servelab_register_toys():" in module
    compile(module, "servelab_my_toy/__init__.py", "exec")


def test_a_third_party_executor_runs_a_workload(toy_path, tmp_path):
    run = _servelab(toy_path, "backend=fake", "model=tiny", "workload=synthetic", "workload.num_requests=4",
                    "logger=none", f"hydra.run.dir={tmp_path}")
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == 4


def test_every_built_in_kind_is_one_row_with_a_frozen_context():
    assert [k.name for k in BUILTIN_KINDS] == list(KINDS)[:len(BUILTIN_KINDS)]
    for kind in BUILTIN_KINDS:
        assert kind.context.__dataclass_params__.frozen, kind.name
        assert kind.base.context_type is kind.context, kind.name


def test_contexts_decide_the_build_order():
    order = [k.name for k in build_order("engine")]
    for before, after in [("evictor", "allocator"), ("allocator", "preemption"), ("preemption", "scheduler"),
                          ("length_predictor", "scheduler"), ("allocator", "drafter")]:
        assert order.index(before) < order.index(after)


def test_a_context_names_the_field_the_run_does_not_provide():
    with pytest.raises(Exception, match="needs 'allocator'"):
        build_context(KINDS["preemption"], {"limits": None, "cost_model": None})


LIMITS = EngineLimits(block_size=4, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64, chunked_prefill=True)


class OldStyle(QueueScheduler):
    """A scheduler written to 0.1's constructor (what the guides of the last release showed)."""

    name = "old_style"

    def __init__(self, config, limits, allocator, preemption, cost_model) -> None:
        super().__init__(config, limits, allocator, preemption, cost_model)
        self.seen_limits = limits


def test_an_old_signature_plugin_runs_through_the_adapter_with_one_warning():
    from servelab.plugins.allocators.paged import PagedAllocator
    from servelab.plugins.preemption.recompute import RecomputePreemption

    allocator = PagedAllocator(PagedAllocator.Config(), AllocatorContext(8, 4, LIMITS))
    cost = StepCostModel()
    preemption = RecomputePreemption(RecomputePreemption.Config(), dataclasses.replace(
        KINDS["preemption"].context(LIMITS, allocator, cost)))
    context = SchedulerContext(LIMITS, allocator, preemption, cost, length_predictor=None, connector=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = instantiate(KINDS["scheduler"], OldStyle, OldStyle.Config(), context)
        second = instantiate(KINDS["scheduler"], OldStyle, OldStyle.Config(), context)
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    assert len(messages) == 1, messages
    assert "'old_style'" in messages[0] and "__init__(self, config, context: SchedulerContext)" in messages[0]
    for scheduler in (first, second):
        assert scheduler.context is context and scheduler.seen_limits is LIMITS
        assert scheduler.allocator is allocator and scheduler.preemption is preemption


def test_the_example_package_still_loads_and_runs(tmp_path):
    """examples/servelab-spf was written to the 0.1 guides: it still loads and schedules."""
    sys.path.insert(0, str(REPO / "examples" / "servelab-spf"))
    try:
        import servelab_spf
    finally:
        sys.path.pop(0)
    from servelab.plugins.allocators.paged import PagedAllocator
    from servelab.plugins.preemption.recompute import RecomputePreemption

    allocator = PagedAllocator(PagedAllocator.Config(), AllocatorContext(8, 4, LIMITS))
    cost = StepCostModel()
    preemption = RecomputePreemption(RecomputePreemption.Config(), KINDS["preemption"].context(LIMITS, allocator, cost))
    cls = servelab_spf.ShortestPromptFirst
    scheduler = instantiate(KINDS["scheduler"], cls, cls.Config(), SchedulerContext(LIMITS, allocator, preemption, cost))
    assert scheduler.limits is LIMITS
