"""The ``engine`` group's schema: which serving engine the simulator prices (``engine=servelab``,
``vllm_v0``, ``vllm_v1``, ``sglang``; the presets are ``conf/engine/*.yaml``, docs/simulator.md "Engines").

A preset is global: besides its own ``engine.*`` block (the host time model, ``overlap``, citations)
it sets the keys that engine's defaults decide (``chunked_prefill``, ``max_num_batched_tokens``,
``max_num_seqs``, ``sim.cuda_graphs`` and its sizes, ``sim.all_reduce``, ``allocator.prefix_caching``,
the ``frontend``). Those keys stay overrides on top of it: ``engine=vllm_v1 max_num_seqs=64``.

Two resolvers let a preset state an engine's hardware-dependent default as that engine computes it:
``${servelab_max:a,b}`` and ``${servelab_vllm_large_gpu:<memory_gb>,<name>,<if large>,<else>}``
(vLLM V1's ``EngineArgs.get_batch_defaults``: a device of >= 70 GiB that is not an A100).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Dict

from omegaconf import OmegaConf

from servelab.core.engine_host import EngineHost
from servelab.core.errors import ConfigError

GIB = 2**30


class HostSource(enum.Enum):
    """``engine.host.source``: ``time_model`` = the time model's own host term (the measured host
    tables, or the calibrated roofline's fit of them); ``engine`` = the preset's terms below."""

    time_model = "time_model"
    engine = "engine"


@dataclass
class EngineHostConfig:
    """The engine's host (CPU) time per step: ``per_step_us + per_seq_us x sequences +
    per_token_us x scheduled tokens`` (``source=engine``)."""

    source: HostSource = HostSource.time_model
    per_step_us: float = 0.0
    per_seq_us: float = 0.0
    per_token_us: float = 0.0


@dataclass
class EngineConfig:
    """``engine``: the engine a simulated run prices. ``overlap``: the host prepares the next step
    while the GPU runs this one (a step takes ``max(gpu, host)``). ``cites``: the source of each
    value the preset sets (key -> citation), printed by docs and the fidelity report."""

    name: str = "servelab"
    versions: str = ""  # the engine versions the preset describes
    host: EngineHostConfig = field(default_factory=EngineHostConfig)
    overlap: bool = False
    cites: Dict[str, str] = field(default_factory=dict)


def vllm_large_gpu(memory_gb, name, large, small):
    """vLLM V1's batch defaults rule (``EngineArgs.get_batch_defaults``): ``large`` on a device of
    at least 70 GiB whose name does not contain ``a100``, else ``small``."""
    return large if float(memory_gb) * 1e9 >= 70 * GIB and "a100" not in str(name).lower() else small


OmegaConf.register_new_resolver("servelab_max", lambda *xs: max(int(x) for x in xs), replace=True)
OmegaConf.register_new_resolver("servelab_vllm_large_gpu", vllm_large_gpu, replace=True)


def engine_host(node) -> EngineHost:
    """The ``engine`` config node as the time model reads it (:class:`servelab.core.engine_host.EngineHost`)."""
    host = node.host
    source = getattr(host.source, "value", host.source)
    try:
        return EngineHost(source=str(source), per_step_s=float(host.per_step_us) * 1e-6,
                          per_seq_s=float(host.per_seq_us) * 1e-6, per_token_s=float(host.per_token_us) * 1e-6,
                          overlap=bool(node.overlap), engine=str(node.name))
    except ValueError as exc:
        raise ConfigError(f"engine={node.name}: {exc}") from None


def engine_summary(node) -> dict:
    """What ``summary.json`` states about the engine a run priced (``engine``)."""
    return {"name": str(node.name), "versions": str(node.versions), "host": engine_host(node).describe()}


def engine_label(node) -> str:
    """The banner's words: ``vllm_v1 (vLLM 0.8 and later (V1 engine core); host 430 us + 1.13 us/seq, not
    overlapped)``, ``servelab (host: the time model's term, added to each step)``."""
    host = engine_host(node)
    if host.source == "engine":
        terms = [f"{host.per_step_s * 1e6:g} us"]
        if host.per_seq_s:
            terms.append(f"{host.per_seq_s * 1e6:g} us/seq")
        if host.per_token_s:
            terms.append(f"{host.per_token_s * 1e6:g} us/token")
        what = "host " + " + ".join(terms)
    else:
        what = "host: the time model's term"
    what += ", overlapped with the GPU step" if host.overlap else ", added to each step"
    versions = f"{node.versions}; " if node.versions and node.name != "servelab" else ""
    return f"{node.name} ({versions}{what})"
