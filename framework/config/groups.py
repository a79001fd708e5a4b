"""Every group option in Hydra's ConfigStore. Plugin groups (scheduler, allocator, ...) are generated
from the plugin registry and the kinds table: each plugin's ``Config`` dataclass plus its ``name``, so a
pip-installed plugin is selectable as ``scheduler=<name>`` with ``scheduler.<field>=...`` type-checked,
without any file in this repo."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import field
from importlib import resources
from typing import TYPE_CHECKING, Any, List, get_type_hints

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from servelab.core.kinds import KINDS
from servelab.core.registry import Registry, default_registry
from servelab.core.packaged import PACKAGED_CHECKPOINTS, PACKAGED_MODELS
from servelab.config.schema import (KV_TIERS_DEFAULT_POLICY, KVTiersConfig, LoggerConfig, LoggerMode, ModelConfig,
                                   ServelabConfig, kv_tier_presets)
from servelab.config.workloads import (ChatSessionsWorkload, CorpusWorkload, GradeWorkloadConfig, HashIdsWorkload,
                                       JsonlWorkload, PromptsWorkload, SyntheticWorkload, TraceWorkload)

if TYPE_CHECKING:
    from servelab.core.interfaces import Plugin


def plugin_node(cls: type[Plugin]) -> Any:
    """A dataclass instance: the plugin's ``Config`` fields plus ``name`` (what selects it)."""
    node_cls = dataclasses.make_dataclass(
        f"{cls.__name__}Node", [("name", str, field(default=cls.name))], bases=(cls.Config,))
    return node_cls()


def packaged_model_node(name: str) -> dict:
    """``model=tiny_code`` and friends (global, like the catalogue models): the checkpoint's path,
    ``max_model_len`` = its context, and one torch thread (these models gain nothing from a second
    one, and on a shared box a descheduled second thread stalls every op: TPOT 4 ms -> 500 ms)."""
    path = PACKAGED_CHECKPOINTS / name
    try:
        context = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    except (OSError, ValueError, KeyError):
        context = 512
    return {"model": ModelConfig(name=name, path=str(path)), "max_model_len": context,
            "backend": {"num_threads": 1}}


def tiny_moe_config() -> ModelConfig:
    """``model=tiny_moe``: a random Qwen3-MoE as small as ``model=tiny`` (written once to the cache
    folder, like it): 8 experts, 2 per token, every second layer MoE, so dense and MoE layers both run."""
    return ModelConfig(name="tiny_moe", architecture="Qwen3MoeForCausalLM", hidden_size=128, intermediate_size=256,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1,
                       num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, moe_layer_step=2)


def config_yaml_defaults() -> dict[str, str]:
    """``group -> option`` of ``conf/config.yaml``'s defaults list (``optional`` dropped)."""
    import yaml  # noqa: PLC0415 - PyYAML comes with omegaconf

    text = (resources.files("servelab.conf") / "config.yaml").read_text()
    out = {}
    for entry in yaml.safe_load(text)["defaults"]:
        if isinstance(entry, dict):
            (key, value), = entry.items()
            out[key.replace("optional ", "")] = value
    return out


def kind_defaults() -> dict[str, str]:
    """``group -> default plugin`` of every kind: ``conf/config.yaml``'s choice where it names the
    group (its place in the defaults list matters there), else the kind's own default."""
    listed = config_yaml_defaults()
    return {k.group: listed.get(k.group, k.default) for k in KINDS.values()}


def schema() -> type:
    """The config schema: :class:`ServelabConfig` plus one group per plugin kind (typed by the
    option chosen; ``backend`` keeps its shared :class:`BackendConfig` type). Kinds that
    ``conf/config.yaml`` does not list get their default here, in the schema's own defaults list,
    so a kind added to the table is selectable (``<group>=<plugin>``) without editing the YAML."""
    listed = config_yaml_defaults()
    typed = {f.name for f in dataclasses.fields(ServelabConfig)}
    kinds = [k for k in KINDS.values() if k.group not in typed]
    hints = get_type_hints(ServelabConfig)
    fields: list[tuple[str, Any, Any]] = [("defaults", List[Any], field(default_factory=lambda: [
        {k.group: k.default} for k in kinds if k.group not in listed]))]
    fields += [(k.group, Any, field(default=MISSING)) for k in kinds]
    fields += [(f.name, hints[f.name], f) for f in dataclasses.fields(ServelabConfig)]
    return dataclasses.make_dataclass("ServelabSchema", fields)


def kv_tiers_node(tiers: KVTiersConfig) -> dict:
    """A ``kv_tiers=<preset>`` option. Tiers hold prefix-cache blocks, so a preset with tiers turns
    ``allocator.prefix_caching`` on, and it selects :data:`KV_TIERS_DEFAULT_POLICY` (a preset alone would
    otherwise keep the kind's default ``none``, which stores nothing). Hydra lets the command line win:
    ``kv_tiers=host kv_tier_policy=none`` (or any other policy) keeps its choice."""
    if not tiers.tiers:
        return {"kv_tiers": tiers}
    return {"defaults": [{"override /kv_tier_policy": KV_TIERS_DEFAULT_POLICY}],
            "kv_tiers": tiers, "allocator": {"prefix_caching": True}}


def register_configs(registry: Registry | None = None) -> None:
    """Put the schema and every group option into Hydra's ConfigStore (idempotent). A kind's option
    that ``conf/<group>/<name>.yaml`` provides (a preset such as ``backend=sim``) is left to the file."""
    registry = registry or default_registry()
    cs = ConfigStore.instance()
    cs.store(name="servelab_schema", node=schema())
    conf = resources.files("servelab.conf")
    for kind in KINDS.values():
        for name in registry.names(kind.name):
            if not (conf / kind.group / f"{name}.yaml").is_file():
                cs.store(group=kind.group, name=name, node=plugin_node(registry.get(kind.name, name)))
    cs.store(group="model", name="tiny", node=ModelConfig())
    cs.store(group="model", name="tiny_moe", node=tiny_moe_config())
    cs.store(group="model", name="hf", node=ModelConfig(name="hf", path=MISSING))
    for name in PACKAGED_MODELS:
        cs.store(group="model", name=name, node=packaged_model_node(name), package="_global_")
    cs.store(group="workload", name="synthetic", node=SyntheticWorkload)
    cs.store(group="workload", name="jsonl", node=JsonlWorkload)
    cs.store(group="workload", name="trace", node=TraceWorkload)
    cs.store(group="workload", name="hash_ids", node=HashIdsWorkload)
    cs.store(group="workload", name="chat_sessions", node=ChatSessionsWorkload)
    cs.store(group="workload", name="prompts", node=PromptsWorkload)
    cs.store(group="workload", name="corpus", node=CorpusWorkload)
    cs.store(group="workload", name="grade", node=GradeWorkloadConfig)
    for name, tiers in kv_tier_presets().items():
        cs.store(group="kv_tiers", name=name, node=kv_tiers_node(tiers), package="_global_")
    cs.store(group="logger", name="wandb", node=LoggerConfig)
    cs.store(group="logger", name="none", node=LoggerConfig(name="none", mode=LoggerMode.disabled))
