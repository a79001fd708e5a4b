"""The plugin facade (``servelab.plugin_api``: the contract only, eager and torch-free), the testing
facade (``servelab.testing``) and the old import paths a published plugin may still use."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import servelab.plugin_api as api

OLD_STYLE_PLUGIN = '''
from dataclasses import dataclass

from servelab import hookimpl
from servelab.interfaces import BlockAllocator
from servelab.request import Sequence
from servelab.scheduling import QueueScheduler


class LongestFirst(QueueScheduler):
    """Written against servelab 0.1's flat modules."""

    name = "old_longest_first"

    @dataclass
    class Config:
        pass

    def waiting_key(self):
        return lambda seq: -seq.prompt_len


@hookimpl
def servelab_register_schedulers():
    return [LongestFirst]
'''


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter (nothing imported yet); its stdout."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd="/",
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_every_public_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert api.QueueScheduler.__module__ == "servelab.engine.scheduling"
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018


@pytest.mark.parametrize("facade", ["servelab.plugin_api", "servelab.time_model_api"])
def test_the_plugin_facades_are_eager_and_load_no_torch_hydra_or_omegaconf(facade):
    """Importing the contract loads every name at once (asking for each loads no further module)
    and none of the heavy packages a plugin module need not pay for."""
    out = _fresh(f"""
        import sys
        import {facade} as facade
        loaded = set(sys.modules)
        for name in facade.__all__:
            getattr(facade, name)
        print(sorted(set(sys.modules) - loaded), sorted(m for m in ("torch", "hydra", "omegaconf") if m in sys.modules))
    """)
    assert out == "[] []", out


def test_the_contract_hands_out_no_test_doubles_or_runners():
    """They are servelab.testing's: asking plugin_api for one names the new home (an AttributeError, so
    ``hasattr`` is False; an ImportError from ``from ... import``), and it imports nothing (plugin_api
    never reaches up into the testing layer)."""
    assert not set(api.MOVED_TO_TESTING) & set(api.__all__)
    for name in api.MOVED_TO_TESTING:
        with pytest.raises(AttributeError, match=rf"moved to servelab.testing .*from servelab.testing import {name}"):
            getattr(api, name)
        assert not hasattr(api, name) and getattr(api, name, None) is None
    assert not hasattr(api, "no_such_name")
    out = _fresh("""
        import sys
        try:
            from servelab.plugin_api import FakeExecutor
        except ImportError as exc:
            print(exc)
        print("torch" in sys.modules, "servelab.testing" in sys.modules, "servelab.kit.testing" in sys.modules)
    """)
    assert "servelab.plugin_api.FakeExecutor moved to servelab.testing" in out, out
    assert out.endswith("False False False"), out


def test_testing_has_the_doubles_the_kit_and_a_stack_on_them():
    import servelab.testing as testing
    from servelab.kit.conformance import check_plugin
    from servelab.kit.testing import FakeExecutor

    for name in testing.__all__:
        assert getattr(testing, name) is not None, name
    assert testing.check_plugin is check_plugin and testing.FakeExecutor is FakeExecutor
    registry = testing.registry_with()  # the built-ins alone
    cfg = testing.compose(["scheduler=fcfs", "max_num_seqs=2"], logger="none")
    engine = testing.fake_stack(cfg, registry, num_kv_blocks=32).engine
    testing.run_workload(engine, [api.Request(f"r{i}", tuple(range(1, 9)), max_tokens=3) for i in range(3)])
    assert all(len(s.output_token_ids) == 3 for s in engine.sequences.values())
    assert engine.clock.now() > 0 and engine.allocator.leaked_blocks() == 0


def test_a_plugin_on_the_old_import_paths_loads_with_a_deprecation_warning_and_runs(tmp_path):
    """Runs in a fresh interpreter: the old modules must not already be imported (a warning is
    given once per old module, when it is first imported)."""
    (tmp_path / "old_plugin.py").write_text(OLD_STYLE_PLUGIN)
    script = textwrap.dedent('''
        import warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import old_plugin
        moved = sorted(str(w.message).split()[0] for w in caught if issubclass(w.category, DeprecationWarning))
        print("warned:", moved)
        from servelab.core.interfaces import Scheduler
        from servelab.engine.scheduling import QueueScheduler
        assert issubclass(old_plugin.LongestFirst, QueueScheduler) and issubclass(old_plugin.LongestFirst, Scheduler)

        from servelab.core.registry import build_registry
        from servelab.core.request import Request
        from servelab.kit.testing import FakeExecutor, VirtualClock
        from servelab.testing import servelab_plugin_manager
        from servelab.api import compose
        from servelab.config import register_configs
        from servelab.assemble.stack import build_stack
        pm = servelab_plugin_manager()  # the built-in policies and executors
        pm.register(old_plugin)
        registry = build_registry(pm)
        register_configs(registry)
        clock = VirtualClock()
        cfg = compose(["scheduler=old_longest_first"], logger="none")
        engine = build_stack(cfg, registry, executor=FakeExecutor(clock, num_kv_blocks=64), clock=clock).engine
        for i, n in enumerate((4, 12, 8)):
            engine.add_request(Request(f"r{i}", tuple(range(1, n + 1)), 2))
        first = engine.step()
        print("first:", [rid for rid, _ in first.scheduled])
        while engine.has_unfinished():
            engine.step()
    ''')
    out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "warned: ['servelab.interfaces', 'servelab.request', 'servelab.scheduling']" in out.stdout
    assert "first: ['r1', 'r2', 'r0']" in out.stdout  # the old-style plugin really ran


def test_the_guides_import_only_the_facades():
    """Every servelab import in a Python block of docs/write-*.md (the plugins and their tests) is from
    servelab.plugin_api, servelab.testing or, for a time model, servelab.time_model_api."""
    import ast
    import re
    from pathlib import Path

    facades = {"servelab.plugin_api", "servelab.testing", "servelab.time_model_api"}
    found, offenders = set(), []
    for page in sorted((Path(__file__).resolve().parents[1] / "docs").glob("write-*.md")):
        for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S):
            for node in ast.walk(ast.parse(block)):
                names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                         else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
                for name in names:
                    if name == "servelab" or name.startswith("servelab."):
                        found.add(name)
                        if name not in facades:
                            offenders.append(f"{page.name}: {name}")
    assert not offenders, offenders
    assert {"servelab.plugin_api", "servelab.testing"} <= found
