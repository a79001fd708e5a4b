"""The ``servelab new-plugin migration_policy <name>`` skeleton and its test (named by the kinds table)."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

TEMPLATE = Template(_HEAD + '''\
from servelab.plugin_api import Migrate, MigrationPolicy


@dataclass
class ${Class}Config:
    gap: float = 0.25  # move when the fullest replica's KV use exceeds the emptiest one's by this share


class $Class(MigrationPolicy):
    """Moves one request per interval from the replica whose KV pool is fullest to the emptiest, when
    their shares of used blocks differ by more than ``gap``: the source's shortest running request,
    if the target has room for it. Change ``decide`` to make it your policy; run with
    ``backend=sim cluster.replicas=4 migration_policy=$name``."""

    name = "$name"
    Config = ${Class}Config

    def __init__(self, config, context):
        super().__init__(config, context)
        if not 0.0 <= config.gap <= 1.0:
            raise ValueError(f"migration_policy.gap={config.gap} must be in [0, 1]")

    def decide(self, replicas, now):
        candidates = [r for r in replicas if not r.draining]
        if len(candidates) < 2:
            return []

        def used(replica):
            return replica.num_used_blocks / max(1, replica.num_kv_blocks)

        source, target = max(candidates, key=used), min(candidates, key=used)
        if used(source) - used(target) <= self.config.gap:
            return []
        movable = [q for q in source.running if not q.migrating and q.needed_blocks < target.num_free_blocks]
        if not movable:
            return []
        shortest = min(movable, key=lambda q: (q.num_blocks, q.id))
        return [Migrate(shortest.id, target.index)]


@hookimpl
def servelab_register_migration_policies():
    return [$Class]
''')

TEST = Template('''\
"""$name through servelab's conformance kit: simulated clusters (3 replicas, small KV pools, heavy-tailed
outputs; then one replica draining), each run against the same cluster without migration: valid
decisions, tokens equal, every request ends once, a request on one replica at every step, the same
migrations again. A failure names the broken contract and the case."""

from servelab.testing import check_plugin


def test_conformance():
    report = check_plugin("$kind", "$name")
    assert report.ok, report
''')
