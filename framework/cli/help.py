"""``servelab --help`` / ``python run.py --help [overrides]``: the usage page with the values a run uses.

:func:`servelab.cli.usage.usage_text` lists every group, option and typed field with the schema's
defaults. A run composes more than the schema: a group option sets keys of its own (``model=tiny_code``
sets ``max_model_len`` to its context and ``backend.num_threads=1``; a checkpoint's shape is its
``config.json``'s, not the fields' defaults). So the page is completed from the composed config
(``conf/config.yaml`` plus any overrides after ``--help``): each group's header names the option
the run selects, a shared-schema group (model, backend, hardware) gets a ``this run`` line with the
values that differ from the fields' defaults (and a checkpoint's shape from its ``config.json``), and
each top-level key shows the composed value, with the schema default beside it where they differ.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from servelab.cli.usage import usage_text
import servelab.config as C
from servelab.config.checkpoint import SHAPE_FIELDS, checkpoint_shape

_SCHEMAS = {"model": C.ModelConfig, "backend": C.BackendConfig, "hardware": C.HardwareConfig}
_GROUP_HEADER = re.compile(r"^(\w+)  \((default|this run): ([^)]*)\)(.*)$")  # the rest: the kind's summary
_TOP_KEY = re.compile(r"^  (\w+): (.+?) = (.*)$")
_ROLE = re.compile(r":(?:func|mod|class|meth|attr|data|obj):`~?([^`]+)`")  # :func:`servelab.x.y` -> servelab.x.y
_LITERAL = re.compile(r"``([^`]+)``")


def plain_doc(text: str | None) -> str:
    """A reST docstring as plain text for a terminal (a subcommand's ``--help``): ````x```` and
    ``:func:`x``` become ``x``, a paragraph-ending ``::`` becomes ``:``, the common indentation goes."""
    import inspect  # noqa: PLC0415

    text = inspect.cleandoc(text or "")
    text = _ROLE.sub(r"\1", _LITERAL.sub(r"\1", text))
    return re.sub(r"(?<=\S)::(?=\s*$)", ":", re.sub(r"\s+::$", "", text, flags=re.M), flags=re.M)


def _text(value) -> str:
    value = getattr(value, "value", value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def _schema_default(cls, name: str):
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                return f.default_factory()  # type: ignore[misc]
            return "???"
    return "???"


def this_run_line(group: str, cfg: DictConfig) -> str | None:
    """``  this run (model=tiny_code): path=..., ...; shape from its config.json: ...`` for a
    shared-schema group: the composed values that differ from the fields' defaults."""
    node = cfg.get(group)
    if node is None:
        return None
    values = cast("dict[str, Any]", OmegaConf.to_container(node, resolve=False))  # a group's node is a mapping
    schema = _SCHEMAS[group]
    shape = checkpoint_shape(values["path"]) if group == "model" and values.get("path") else None
    changed = [f"{k}={_text(v)}" for k, v in values.items()
               if k != "name" and not (shape and k in (*SHAPE_FIELDS, "architecture", *shape))
               and _text(v) != _text(_schema_default(schema, k))]
    text = ", ".join(changed) or "the fields' defaults"
    if shape:
        text += "; shape from its config.json (the shape fields above do not apply): " + ", ".join(
            f"{k}={_text(v)}" for k, v in shape.items())
    return f"  this run ({group}={values.get('name')}): {text}"


def complete_usage(text: str, cfg: DictConfig, overridden: bool = False) -> str:
    """``text`` (the usage page) with the values of ``cfg`` (the composed config) filled in."""
    out: list[str] = []
    section = None
    for line in text.splitlines():
        header = _GROUP_HEADER.match(line)
        if header:
            section = header.group(1)
            option = OmegaConf.select(cfg, f"{section}.name", default=None)
            if option is not None:
                line = f"{section}  ({'this run' if overridden else 'default'}: {option}){header.group(4)}"
            out.append(line)
            continue
        if line == "top-level keys":
            section = "top-level"
            out.append("top-level keys  (the value a run uses, then the schema's default where it differs)")
            continue
        if not line:
            section = None if section != "top-level" else section
        if section in _SCHEMAS and line.startswith("  fields: "):
            out.append(line)
            extra = this_run_line(section, cfg)
            if extra:
                out.append(extra)
            continue
        top = _TOP_KEY.match(line) if section == "top-level" else None
        if top and top.group(1) in cfg and not OmegaConf.is_dict(cfg[top.group(1)]):
            key, type_name, default = top.groups()
            value = _text(OmegaConf.select(cfg, key))
            line = f"  {key}: {type_name} = {value}" + (f"  (schema default {default})" if value != default else "")
        out.append(line)
    return "\n".join(out) + "\n"


def help_text(overrides: list[str] | None = None) -> str:
    """The usage page completed with the config ``python run.py <overrides>`` composes."""
    text = usage_text()
    overrides = [o for o in (overrides or []) if not o.startswith("-")]
    try:
        from servelab.api import compose  # noqa: PLC0415 - Hydra's compose API

        cfg = compose(overrides)
    except Exception as exc:  # noqa: BLE001 - a bad override: still show the page, saying why values are missing
        first = C.config_error_message(exc)
        return text + f"\n(the values a run uses are not shown: composing {' '.join(overrides)} failed: {first})\n"
    return complete_usage(text, cfg, overridden=bool(overrides))
