"""A plugin package whose entry point fails to import is isolated: one line names the package, the
entry point and the error; runs that do not select it go on; selecting one of its names fails with it."""

from __future__ import annotations

import logging
import os

import pytest

from test_cli import run_cli
from servelab.core.registry import PluginError, build_registry, check_selection, default_registry, plugin_manager

BROKEN_LINE = ("plugin package servelab-broken 0.3.1 (entry point broken = servelab_broken_xyz.plugin) failed to "
               "import: ModuleNotFoundError: No module named 'servelab_broken_xyz'")


@pytest.fixture
def broken_package(tmp_path, monkeypatch):
    """A distribution on sys.path whose ``servelab`` entry point names a module that does not exist."""
    info = tmp_path / "servelab_broken-0.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: servelab-broken\nVersion: 0.3.1\n")
    (info / "entry_points.txt").write_text("[servelab]\nbroken = servelab_broken_xyz.plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    default_registry.cache_clear()
    yield tmp_path
    default_registry.cache_clear()


def test_a_broken_package_is_one_line_and_the_rest_registers(broken_package):
    registry = build_registry(plugin_manager())
    assert [b.line() for b in registry.broken] == [BROKEN_LINE]
    assert "fcfs" in registry.names("scheduler")
    assert "servelab" in registry.origins[("scheduler", "fcfs")]  # origins still name the distribution
    with pytest.raises(PluginError) as info:
        registry.get("scheduler", "srpt")
    assert "unknown scheduler 'srpt'" in str(info.value) and BROKEN_LINE in str(info.value)


def test_selecting_warns_or_fails_with_the_line(broken_package, caplog):
    with caplog.at_level(logging.WARNING, logger="servelab.core.registry"):
        default_registry()
    assert BROKEN_LINE in caplog.text
    check_selection(["scheduler=fcfs", "allocator=paged", "block_size=16"])  # goes on
    with pytest.raises(PluginError, match="servelab-broken 0.3.1"):
        check_selection(["-m", "preemption=recompute,lazy"])


def test_the_cli_runs_beside_a_broken_package_and_names_it_when_selected(broken_package):
    env = {"PYTHONPATH": os.pathsep.join([str(broken_package), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli("--cfg", "job", "scheduler=fcfs", env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert "name: fcfs" in proc.stdout and BROKEN_LINE in proc.stderr
    proc = run_cli("scheduler=srpt", env_extra=env)
    assert proc.returncode == 2 and BROKEN_LINE in proc.stderr
    assert "Traceback" not in proc.stderr
