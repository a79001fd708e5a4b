"""The ``servelab new-plugin expert_cache <name>`` skeleton (named by the kinds table)."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

TEMPLATE = Template(_HEAD + '''\
import numpy as np

from servelab.plugin_api import ConfigError, ExpertCache, top_slots


@dataclass
class ${Class}Config:
    window: int = 8  # steps of routing the score remembers


class $Class(ExpertCache):
    """Windowed frequency: keep the experts with the most tokens over the last ``window`` steps, of those
    on the GPU (no prefetch: an expert not resident is loaded only when routed to). Change :meth:`keep`
    to make it your cache (an expert it keeps that is neither resident nor routed this step is
    prefetched); run with ``backend=sim model=qwen3_30b_a3b hardware=h100 sim.moe.routing_skew=1.2
    expert_cache=$name sim.moe.expert_cache_slots=64``."""

    name = "$name"
    Config = ${Class}Config

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.window < 1:
            raise ConfigError(f"expert_cache.window={config.window} must be >= 1")
        # context: num_experts, num_moe_layers, expert_parallel_size, experts_per_rank, cache_slots
        self._recent = np.zeros((config.window, *context.shape), dtype=np.int64)
        self._step = 0

    def keep(self, resident, touched):
        self._recent[self._step % self.config.window] = touched
        self._step += 1
        score = self._recent.sum(axis=0)
        return top_slots(score, self.context.cache_slots, allowed=resident | (touched > 0))


@hookimpl
def servelab_register_expert_caches():
    return [$Class]
''')

TEST = Template('''\
"""$name through servelab's conformance kit: routing steps through the simulator's expert-cache pricing on
small layouts (capacity never exceeded, every routed expert resident or loaded, the same sets again), then
two short simulator runs of qwen3_30b_a3b with half its experts offloaded. A failure names the broken
contract and the case."""

from servelab.testing import check_plugin


def test_conformance():
    report = check_plugin("$kind", "$name")
    assert report.ok, report
''')
