"""One-line config errors: :func:`config_error_message` turns Hydra's and OmegaConf's errors into one
line against the schema (the closest key names, a group's options), and :func:`check_known_keys`
refuses a ``+key=value`` the schema does not have."""

from __future__ import annotations

import dataclasses
import difflib
import re
from typing import Any, get_type_hints

from hydra.core.config_store import ConfigStore
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import DictConfig, ListConfig, OmegaConf

from servelab.core.errors import ConfigError
from servelab.core.kinds import KINDS
from servelab.config.schema import ServelabConfig


# --- one-line config errors -------------------------------------------------------------------------

_MAX_LISTED = 16  # keys of a node listed in full when no name is close; more: point at servelab --help
_COULD_NOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")
_MERGING = re.compile(r"Error merging override (.+)")
_PARSING = re.compile(r"Error parsing override '(.*)'")


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _option_label(group: str, cls: Any) -> str:
    """``scheduler=fcfs`` for a group option's dataclass (its ``name`` default), else ``group``."""
    name = next((f.default for f in dataclasses.fields(cls) if f.name == "name"), None) \
        if dataclasses.is_dataclass(cls) else None
    return f"{group}={name}" if isinstance(name, str) and name and group else group


def _option_keys(group: str) -> dict[str, list[str]]:
    """``option -> its keys`` of config group ``group`` as Hydra's ConfigStore holds it (typed
    options; YAML presets and options that set keys of other groups are left out)."""
    options = ConfigStore.instance().repo.get(group)
    if not isinstance(options, dict):
        return {}
    return {name[:-5]: [str(k) for k in entry.node.keys()] for name, entry in options.items()
            if name.endswith(".yaml") and getattr(entry, "package", None) is None
            and OmegaConf.is_dict(getattr(entry, "node", None))}


def _schema_keys(cls: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key of the schema: the nested dataclass fields of :class:`ServelabConfig` and
    the keys of each group's typed options (the candidates for a key misplaced in the tree)."""
    cls = cls or ServelabConfig
    keys: list[str] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            keys += _schema_keys(tp, f"{prefix}{f.name}.")
        elif f.name != "name":
            keys.append(prefix + f.name)
    if not prefix:
        for group in ("workload", *(k.group for k in KINDS.values())):
            keys += [f"{group}.{key}" for names in _option_keys(group).values() for key in names if key != "name"]
    return list(dict.fromkeys(keys))


def unknown_key_message(key: str, node_type: Any) -> str:
    """``unknown key 'x'; did you mean 'y'?`` for ``key`` (a dotted path) under a node of
    ``node_type``: the closest field names there (difflib), else the other options of its group
    that have the field, else the closest keys anywhere in the schema, else the node's keys. Never
    a ``+key`` hint: a key outside the schema is read by nothing."""
    parent, _, leaf = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    names = [n for n in _field_names(node_type) if n != "defaults"]
    close = [prefix + c for c in difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)]
    message = f"unknown key '{key}'"
    group = parent if parent and "." not in parent else ""
    here = _option_label(group, node_type) or parent or "this entry"  # an item of a list (workload.clients)
    others = [o for o, keys in _option_keys(group).items() if leaf in keys] if group else []
    if not close and others:
        return (f"{message}: {here} has no {leaf}; " + ", ".join(f"{group}={o}" for o in others)
                + (" has" if len(others) == 1 else " have") + " it")
    if not close and not parent.startswith("hydra"):
        everywhere = _schema_keys()
        by_leaf = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in everywhere], n=3, cutoff=0.75)
        close = [k for k in everywhere if k.rpartition(".")[2] in by_leaf][:3]
    if close:
        return message + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    if names == ["name"]:
        return f"{message}: {here} has no settings"
    if names and len(names) <= _MAX_LISTED:
        return f"{message}; the keys of {here}: {', '.join(n for n in names if n != 'name')}"
    return f"{message} (servelab --help lists every key)"


def unknown_keys(cfg: Any, path: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, the type of its node)`` of every key of ``cfg`` (a composed config) that its
    node's dataclass does not declare: a ``+key=value`` override outside the schema, which Hydra
    adds and nothing reads. ``hydra`` and untyped nodes are not checked."""
    found: list[tuple[str, Any]] = []
    if isinstance(cfg, DictConfig):
        node_type = OmegaConf.get_type(cfg)
        fields = set(_field_names(node_type)) if dataclasses.is_dataclass(node_type) else None
        for key in map(str, cfg.keys()):
            if key == "hydra" and not path:
                continue
            name = f"{path}.{key}" if path else key
            if fields is not None and key not in fields:
                found.append((name, node_type))
                continue
            child = cfg._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)) and not child._is_missing() and not child._is_none():
                found += unknown_keys(child, name)
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            item = cfg._get_node(i)
            if isinstance(item, (DictConfig, ListConfig)) and not item._is_none():
                found += unknown_keys(item, f"{path}[{i}]")
    return found


def check_known_keys(cfg: Any) -> None:
    """Raise :class:`~servelab.core.errors.ConfigError` naming the first key of ``cfg`` outside the
    schema (see :func:`unknown_keys`) and the closest names."""
    found = unknown_keys(cfg)
    if found:
        key, node_type = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(unknown_key_message(key, node_type) + more)


def config_error_message(exc: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised composing a config: an unknown key with the
    closest names, an unknown group option with the options, a bad value naming the override, an
    override that does not parse. Anything else: its first line (and its cause's)."""
    cause = exc.__cause__
    text = str(exc)
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, option = str(exc.missing_cfg_file).rpartition("/")
        options = sorted(exc.options)
        close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
        hint = f" did you mean '{close[0]}'?" if close else ""
        return f"unknown {group} option '{option}';{hint} options: {', '.join(options)}"
    if isinstance(exc, OverrideParseException):
        match = _PARSING.search(text)
        what = f"'{match.group(1)}'" if match else ""
        reason = text.splitlines()[1].strip() if len(text.splitlines()) > 1 else ""
        return f"cannot parse the override {what}: {reason} (overrides are key=value)".replace(" : ", ": ")
    full_key = getattr(cause, "full_key", None)
    override = _COULD_NOT_OVERRIDE.search(text)
    if full_key and override and "not in" in str(cause):
        message = unknown_key_message(full_key, getattr(cause, "object_type", None))
        if override.group(1) != full_key:
            message = message.replace(f"'{full_key}'", f"'{full_key}' (in '{override.group(1)}')", 1)
        return message
    merging = _MERGING.search(text)
    if merging and cause is not None:
        return f"{merging.group(1).strip()}: {_first_line(str(cause))}"
    line = _first_line(text) or type(exc).__name__
    if cause is not None and _first_line(str(cause)) and _first_line(str(cause)) not in line:
        line += f": {_first_line(str(cause))}"
    return line
