"""``servelab --help``: servelab's own usage page (Hydra's generic one stays at ``--hydra-help``).

Built from what a run can actually select: every config group with its options (the plugin
registry, the typed options in Hydra's ConfigStore, the YAML presets in ``conf/``) and, for each
option, its fields with types and defaults, so a plugin installed from pip shows up too.
"""

from __future__ import annotations

import dataclasses
import enum
import typing
from importlib import resources
from typing import get_type_hints

import yaml

import servelab.config as C
from servelab.cli.subcommands import commands_help
from servelab.core.kinds import KINDS
from servelab.core.registry import default_registry

# non-plugin groups: option -> its dataclass (the typed schema the option composes into)
_TYPED: dict[str, dict[str, type]] = {
    "workload": {"corpus": C.CorpusWorkload, "synthetic": C.SyntheticWorkload, "jsonl": C.JsonlWorkload,
                 "prompts": C.PromptsWorkload, "trace": C.TraceWorkload, "hash_ids": C.HashIdsWorkload,
                 "chat_sessions": C.ChatSessionsWorkload, "grade": C.GradeWorkloadConfig},
    "model": {"tiny": C.ModelConfig},
    "hardware": {},
    "logger": {"wandb": C.LoggerConfig},
}
_PRESET_GROUPS = ("model", "backend", "hardware", "time_model", "allocator", "experiment")
_SHARED_SCHEMA = {"model": C.ModelConfig, "backend": C.BackendConfig, "hardware": C.HardwareConfig}
_SKIP = {"name"}


def _type_name(tp) -> str:
    """``int``, ``float | None``, ``one|of|these`` for an enum, ``list[str]``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is typing.Union:
        return " | ".join(map(_type_name, args)) + (" | None" if len(args) < len(typing.get_args(tp)) else "")
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "|".join(m.value for m in tp)
    if typing.get_origin(tp) is list:
        return f"list[{', '.join(map(_type_name, args))}]"
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def field_type(f: dataclasses.Field, hints: dict) -> str:
    """The type a user may give ``f``: its ``help_type`` metadata where the annotation is wider than
    the values allowed (``block_size: Any`` takes ``int | auto``), else the annotation."""
    return f.metadata.get("help_type") or _type_name(hints.get(f.name, f.type))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "???"
    if dataclasses.is_dataclass(value):
        return "{...}"
    value = getattr(value, "value", value)
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def fields_line(cls) -> str:
    """``field: type = default, ...`` of a dataclass (``name`` left out: it is the option)."""
    try:
        hints = get_type_hints(cls)
    except Exception:  # noqa: BLE001 - an unresolvable annotation: show it as written
        hints = {}
    parts = [f"{f.name}: {field_type(f, hints)} = {_default(f)}"
             for f in dataclasses.fields(cls) if f.name not in _SKIP]
    return ", ".join(parts) or "(no fields)"


def _presets(group: str) -> list[str]:
    try:
        folder = resources.files("servelab.conf") / group
        return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))
    except (FileNotFoundError, NotADirectoryError, ModuleNotFoundError):
        return []


def _defaults() -> dict[str, str]:
    return {**C.config_yaml_defaults(), **C.kind_defaults()}


def usage_text() -> str:
    registry = default_registry()
    defaults = _defaults()
    lines = [
        "usage: servelab [key=value ...]            run one job (python run.py is the same)",
        "       servelab -m key=a,b [key=c,d ...]   a Hydra multirun (every combination)",
        "       servelab --cfg job [key=value ...]  print the composed config",
        "       servelab <command> [args ...]       a subcommand (the commands below)",
        "       servelab --hydra-help               Hydra's own flags",
        "",
        *commands_help(),
        "",
        "Select an option with group=option; set its fields with group.field=value. Fields are typed:",
        "a wrong key or type fails at start-up naming it. Metrics: docs/metrics.md.",
        "",
    ]
    kinds = {k.group: k for k in KINDS.values()}
    listed = [g for g in C.config_yaml_defaults() if g in kinds or g in _TYPED]  # the defaults list's order
    for group in (*listed, *(g for g in (*kinds, *_TYPED) if g not in listed)):
        default = defaults.get(group)
        kind = kinds.get(group)
        lines.append(f"{group}  (default: {default})" + (f"  - {kind.summary}" if kind else ""))
        options: dict[str, str] = {}
        if kind is not None:
            for name in registry.names(kind.name):
                options[name] = fields_line(registry.get(kind.name, name).Config)
        for name, cls in _TYPED.get(group, {}).items():
            options[name] = fields_line(cls)
        if group in _SHARED_SCHEMA:
            lines.append(f"  fields: {fields_line(_SHARED_SCHEMA[group])}")
        for name in _presets(group):
            options.setdefault(name, f"preset conf/{group}/{name}.yaml" + (
                "" if group in _SHARED_SCHEMA else f" (fields as {_presets_base(group, name)})"))
        if group == "model":
            options.setdefault("hf", "model.path=<HF checkpoint dir> (required)")
            for name in C.PACKAGED_MODELS:
                options.setdefault(name, "trained checkpoint shipped in the package")
        if group == "logger":
            options.setdefault("none", "no logging")
        for name, text in options.items():
            if group in _SHARED_SCHEMA and text.startswith(fields_line(_SHARED_SCHEMA[group])):
                text = "(the fields above)"
            lines.append(f"  {name}: {text}")
        lines.append("")
    lines.append("experiment  (presets, last in the defaults: override the rest)")
    lines.append("  " + ", ".join(_presets("experiment")))
    lines.append("")
    groups = {*kinds, *_TYPED}
    top = [f for f in dataclasses.fields(C.ServelabConfig) if f.name not in groups]
    hints = get_type_hints(C.ServelabConfig)
    lines.append("top-level keys")
    for f in top:
        value = _default(f)
        if value == "{...}":
            value = "{" + fields_line(hints[f.name]) + "}"
        lines.append(f"  {f.name}: {field_type(f, hints)} = {value}")
    return "\n".join(lines) + "\n"


def _presets_base(group: str, name: str) -> str:
    text = (resources.files("servelab.conf") / group / f"{name}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    base = next((d for d in data.get("defaults", []) if isinstance(d, str) and d != "_self_"), None)
    return base or "its YAML"
