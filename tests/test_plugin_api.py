"""The plugin facade and the old flat import paths a published plugin may still use."""

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


def test_every_public_name_resolves():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert api.QueueScheduler.__module__ == "servelab.engine.scheduling"
    with pytest.raises(AttributeError):
        api.no_such_name  # noqa: B018


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

        from servelab.core.registry import build_registry, plugin_manager
        from servelab.core.request import Request
        from servelab.kit.testing import FakeExecutor, VirtualClock
        from servelab.plugins import builtin
        from servelab.api import compose
        from servelab.run.config import register_configs
        from servelab.run.stack import build_stack
        pm = plugin_manager(load_entry_points=False)
        pm.register(builtin)
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
