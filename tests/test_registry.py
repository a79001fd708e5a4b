"""Plugin discovery through pluggy + entry points, and its start-up checks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import Scheduler
from servelab.core.registry import PluginError, Registry, build_registry, default_registry, plugin_manager
from servelab.engine.scheduling import QueueScheduler


def test_builtins_come_through_the_entry_point():
    registry = default_registry()
    assert "fcfs" in registry.names("scheduler")
    assert "paged" in registry.names("allocator")
    assert "recompute" in registry.names("preemption")
    assert "none" in registry.names("drafter")
    assert "servelab" in registry.origins[("scheduler", "fcfs")]  # the distribution it came from


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(PluginError, match=r"unknown scheduler 'nope'; registered schedulers: .*fcfs"):
        default_registry().get("scheduler", "nope")


class _Mine(QueueScheduler):
    name = "mine"


def _pm_with(*plugins):
    pm = plugin_manager(load_entry_points=False)
    for i, plugin in enumerate(plugins):
        pm.register(plugin, name=f"test-plugin-{i}")
    return pm


def test_duplicate_names_are_rejected_naming_both_origins():
    class A:
        @hookimpl
        def servelab_register_schedulers(self):
            return [_Mine]

    with pytest.raises(PluginError, match=r"duplicate scheduler name 'mine': registered by test-plugin-\d and again by test-plugin-\d"):
        build_registry(_pm_with(A(), A()))


def test_wrong_base_class_is_rejected():
    class NotAScheduler:
        name = "bad"

    class A:
        @hookimpl
        def servelab_register_schedulers(self):
            return [NotAScheduler]

    with pytest.raises(PluginError, match="not a subclass of servelab.core.interfaces.Scheduler"):
        build_registry(_pm_with(A()))


def test_config_must_be_a_dataclass_and_name_an_identifier():
    class BadConfig(QueueScheduler):
        name = "badcfg"
        Config = dict

    class NoName(QueueScheduler):
        name = "has space"

    registry = Registry()
    with pytest.raises(PluginError, match="Config that is not a dataclass"):
        registry.add("scheduler", BadConfig, "here")
    with pytest.raises(PluginError, match="needs a `name` that is an identifier"):
        registry.add("scheduler", NoName, "here")


def test_typed_plugin_config_reaches_the_instance():
    @dataclass
    class Cfg:
        depth: int = 3

    class Typed(QueueScheduler):
        name = "typed"
        Config = Cfg

    registry = Registry()
    registry.add("scheduler", Typed, "here")
    assert issubclass(registry.get("scheduler", "typed"), Scheduler)
