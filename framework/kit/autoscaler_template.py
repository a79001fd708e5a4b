"""The ``servelab new-plugin autoscaler <name>`` skeleton and its test (named by the kinds table)."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

TEMPLATE = Template(_HEAD + '''\
from servelab.plugin_api import Autoscaler, ScaleDown, ScaleUp


@dataclass
class ${Class}Config:
    queue_high: float = 2.0  # mean queued requests per serving replica above which one replica starts
    idle_s: float = 20.0  # retire a replica after the cluster had nothing queued for this long


class $Class(Autoscaler):
    """Starts one replica when the serving replicas queue more than ``queue_high`` requests each on
    average, and retires the emptiest one once nothing was queued anywhere for ``idle_s``. Change
    ``decide`` to make it your autoscaler; run with
    ``backend=sim cluster.replicas=1 cluster.max_replicas=4 autoscaler=$name``."""

    name = "$name"
    Config = ${Class}Config

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.queue_high < 0 or config.idle_s < 0:
            raise ValueError("autoscaler.queue_high and autoscaler.idle_s must be >= 0")
        self.quiet_since = 0.0

    def decide(self, view, now):
        serving = view.serving
        if view.num_starting or len(serving) < len(view.replicas):
            return []  # a cold start or a drain under way: wait for it
        queued = sum(r.num_waiting for r in serving)
        if queued:
            self.quiet_since = now
        if queued / len(serving) > self.config.queue_high and view.num_held < view.max_replicas:
            return [ScaleUp(1)]
        if now - self.quiet_since >= self.config.idle_s and view.num_target > view.min_replicas and len(serving) > 1:
            emptiest = min(serving, key=lambda r: (r.num_running, -r.index))
            self.quiet_since = now
            return [ScaleDown(emptiest.index)]
        return []


@hookimpl
def servelab_register_autoscalers():
    return [$Class]
''')

TEST = Template('''\
"""$name through servelab's conformance kit: simulated clusters (1 replica that may grow to 3, small
KV pools, heavy-tailed outputs; then the same with migration_policy=drain), each run against one replica
without autoscaling: valid decisions, tokens equal, every request ends once, within min/max replicas,
the same scaling again. A failure names the broken contract and the case."""

from servelab.testing import check_plugin


def test_conformance():
    report = check_plugin("$kind", "$name")
    assert report.ok, report
''')
