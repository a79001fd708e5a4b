"""The parts of the pages that list or describe plugin kinds, written from the kinds table.

A page marks each such part ``<!-- generated: <block> [<arg>] -->`` ... ``<!-- /generated -->``
(inline inside a sentence, or around whole lines) and ``python scripts/generate_docs.py`` rewrites
what is between the markers from :data:`servelab.core.kinds.KINDS` and what the kit knows: the
hooks table and the imports of ``docs/plugins.md``, the lists of kinds each command takes, what
``check-plugin`` runs per kind (:mod:`servelab.kit.stage_info`), how ``grade`` scores each kind
(:mod:`servelab.kit.grading`'s rules, :mod:`servelab.kit.grade_workloads`), each guide's context
fields, the README's list of guides. ``tests/test_docs_kinds.py`` fails when a page differs from
what this module writes, and :func:`guide_problems` names a kind whose guide is missing, lacks a
generated part, or leaves one of its base class's hooks unnamed: a kind added to the table cannot
go unmentioned.

Blocks (``<block> [<arg>]``):

- ``kinds <which>`` (inline): ``all``, ``check-plugin``, ``no-kit``, ``grade``, ``not-graded``;
- ``hooks-table``, ``imports``, ``check-plugin-table``, ``grade-workloads``, ``grade-rules``,
  ``guides`` (a list of links to every guide);
- ``context <kind>``, ``check-plugin <kind>``, ``grade <kind>``: a guide's reference parts.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from pathlib import Path
from typing import Callable

from servelab import plugin_api
from servelab.core.interfaces import Plugin
from servelab.core.kinds import KINDS, KindSpec
from servelab.kit.grade_workloads import SIM, WORKLOADS, graded_kinds, workloads_for
from servelab.kit.grading import PREDICTOR, score_rule
from servelab.kit.stage_info import DEFAULT_CASES, stage_info

MARKER = re.compile(r"<!-- generated: (?P<block>[\w-]+)(?: (?P<arg>[\w-]+))? -->(?P<body>.*?)<!-- /generated -->",
                    re.S)
#: The parts every guide (``KindSpec.guide``) carries, for its kind.
GUIDE_BLOCKS = ("context", "check-plugin", "grade")
INLINE = ("kinds",)
COMMON = ("Request", "Sequence", "EngineLimits", "ConfigError")  # what every kind reads: one line of the imports


class DocsError(ValueError):
    """A page or a kind that cannot be written (a missing guide, an unknown block)."""


# ---- small helpers --------------------------------------------------------------------------------

def _code(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _link(target: str, page: Path, repo: Path) -> str:
    return os.path.relpath(repo / target, page.parent).replace(os.sep, "/")


def guide_title(spec: KindSpec, repo: Path) -> str:
    """The guide's own heading, in lower case ("write a scheduler"); a missing guide is a DocsError."""
    path = repo / str(spec.guide)
    if not path.is_file():
        raise DocsError(f"kind {spec.name!r}: its guide {spec.guide} does not exist (write it, or set guide=None "
                        "in its KindSpec for a kind without one)")
    first = next((line for line in path.read_text().splitlines() if line.startswith("# ")), f"# {spec.name}")
    return first[2:].strip()[:1].lower() + first[2:].strip()[1:]


def _subclasses_exported(spec: KindSpec) -> list[str]:
    """Classes of ``servelab.plugin_api`` that subclass the kind's base (``QueueScheduler``)."""
    return [n for n in plugin_api.__all__ if inspect.isclass(getattr(plugin_api, n))
            and issubclass(getattr(plugin_api, n), spec.base) and getattr(plugin_api, n) is not spec.base]


def exchanged_names(spec: KindSpec) -> list[str]:
    """``servelab.plugin_api`` names the kind's hooks take or return (``PreemptionDecision``,
    ``CachedBlock``, ``ReplicaView`` ...), from their annotations."""
    found: list[str] = []
    skip = {spec.base.__name__, spec.context.__name__, "Plugin", *_subclasses_exported(spec), *COMMON}
    for name in hooks(spec):
        member = inspect.getattr_static(spec.base, name)
        func = getattr(member, "fget", None) or getattr(member, "__func__", member)
        annotations = " ".join(str(v) for v in getattr(func, "__annotations__", {}).values())
        for word in re.findall(r"[A-Z]\w+", annotations):
            if word in plugin_api.__all__ and word not in skip and word not in found:
                found.append(word)
    return found


def hooks(spec: KindSpec) -> list[str]:
    """The methods (and properties) a plugin of this kind may implement: the public members its base
    class and its bases (but ``Plugin`` and the standard library's) define."""
    names: list[str] = []
    for cls in spec.base.__mro__:
        if cls is Plugin or cls.__module__ in ("builtins", "abc", "typing"):
            continue
        for name, member in vars(cls).items():
            if name.startswith("_") or name in names:
                continue
            if isinstance(member, (property, classmethod, staticmethod)) or inspect.isfunction(member):
                names.append(name)
    return names


def _type(field: dataclasses.Field) -> str:
    return str(field.type).replace("'", "").replace("typing.", "")


def _cell(text: str) -> str:
    """``text`` inside a Markdown table cell (a ``|`` would end the cell, in code too)."""
    return text.replace("|", "\\|")


def _prose(doc: str | None) -> str:
    """A docstring's first paragraph as one Markdown line (reST ````x```` as ```x```)."""
    first = inspect.cleandoc(doc or "").split("\n\n")[0]
    return " ".join(first.split()).replace("``", "`")


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        return f"`{field.default!r}`"
    if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        return f"`{field.default_factory()!r}`"  # type: ignore[misc]
    return "always given"


# ---- the blocks ----------------------------------------------------------------------------------

def kinds_list(which: str | None, page: Path, repo: Path) -> str:
    from servelab.kit.conformance import kit_kinds  # noqa: PLC0415 - hydra

    graded = graded_kinds()
    names = {"all": list(KINDS), "check-plugin": kit_kinds(), "no-kit": [k for k in KINDS if k not in kit_kinds()],
             "grade": list(graded), "not-graded": [k for k in KINDS if k not in graded]}
    if which not in names:
        raise DocsError(f"kinds {which!r}: not one of {', '.join(names)}")
    return _code(names[which])


def hooks_table(_: str | None, page: Path, repo: Path) -> str:
    lines = ["| kind | selected by (default) | registration hook | subclass / context | what it decides | guide |",
             "|---|---|---|---|---|---|"]
    for spec in KINDS.values():
        bases = " or ".join(_code([spec.base.__name__, *_subclasses_exported(spec)]).split(", "))
        guide = (f"[{guide_title(spec, repo)}]({_link(spec.guide, page, repo)})" if spec.guide
                 else "no guide: the class's docstring")
        summary = spec.summary.replace("|", "\\|")
        lines.append(f"| `{spec.name}` | `{spec.group}=` (`{spec.default}`) | `{spec.hook}` | {bases} / "
                     f"`{spec.context.__name__}` | {summary} | {guide} |")
    return "\n".join(lines)


def imports(_: str | None, page: Path, repo: Path) -> str:
    lines = ["```python", "from servelab.plugin_api import hookimpl  # every plugin module: its registration hook"]
    for spec in KINDS.values():
        names = [spec.base.__name__, *_subclasses_exported(spec), spec.context.__name__, *exchanged_names(spec)]
        lines.append(f"from servelab.plugin_api import {', '.join(names)}  # {spec.group}=")
    lines += [f"from servelab.plugin_api import {', '.join(COMMON)}  # what every kind reads",
              "from servelab.testing import check_plugin, FakeExecutor, KVCheckingExecutor, VirtualClock  # in tests",
              "from servelab.testing import registry_with, compose, fake_stack, run_workload, run_job  # a stack in a test",
              "```"]
    return "\n".join(lines)


def _stage_rows(spec: KindSpec) -> list[str]:
    rows = []
    for stage in spec.checks:
        info = stage_info(stage)
        notes = [info.when] if info.when else []
        if info.real_model:
            notes.append("skipped by `--no-real-model`")
        runs = info.runs + (f" ({'; '.join(notes)})" if notes else "")
        rows.append(f"| {info.title} | {runs} | {'yes' if info.uses_cases else 'no'} | {info.what} |")
    return rows


def check_plugin_table(_: str | None, page: Path, repo: Path) -> str:
    lines = ["| kind | stages, in order (runs each) | `--cases` sets |", "|---|---|---|"]
    for spec in KINDS.values():
        if not spec.checks:
            lines.append(f"| `{spec.name}` | no kit: `check-plugin {spec.name}=...` is refused | |")
            continue
        stages = "; ".join(f"{stage_info(s).title} ({stage_info(s).runs})" for s in spec.checks)
        uses = [stage_info(s).title for s in spec.checks if stage_info(s).uses_cases]
        lines.append(f"| `{spec.name}` | {stages} | {', '.join(uses) if uses else 'nothing (fixed runs only)'} |")
    return "\n".join(lines)


def check_plugin_kind(kind: str | None, page: Path, repo: Path) -> str:
    spec = _spec(kind)
    if not spec.checks:
        return (f"`{spec.name}` has no conformance kit: `servelab check-plugin {spec.name}=<name>` is refused "
                "naming the kinds that have one. Test it with your own tests (the guide's example shows how).")
    uses = any(stage_info(s).uses_cases for s in spec.checks)
    cases = (f"`--cases N` (default {DEFAULT_CASES}; `check_plugin(..., cases=N)` defaults to 20) sizes the stages "
             "marked yes, the others are fixed runs" if uses else "`--cases` changes nothing for this kind: every "
             "stage is a fixed run")
    lines = [f"`servelab check-plugin {spec.name}=<name>` runs these stages in order, each only while the earlier "
             f"ones passed; {cases}. `--seed S` moves the random ones; overrides after the plugin go into every run.",
             "", "| stage | runs | `--cases` | checks |", "|---|---|---|---|", *_stage_rows(spec)]
    return "\n".join(lines)


def _formula(kind: str) -> str:
    rule = score_rule(kind)
    reference = graded_kinds()[kind]
    ratios = [f"{t.label} / {reference}'s" if t.higher else f"{reference}'s {t.label} / {t.label}"
              for t in rule.terms]
    if len(ratios) == 1:
        return f"score = {ratios[0]}"
    return f"score = ({' x '.join(f'({r})' for r in ratios)})^(1/{len(ratios)})"


def grade_kind(kind: str | None, page: Path, repo: Path) -> str:
    spec = _spec(kind)
    graded = graded_kinds()
    if spec.name not in graded:
        return (f"`servelab grade {spec.name}=<name>` is refused: a {spec.name.replace('_', ' ')} is not graded "
                f"(the kinds `grade` takes: {kinds_list('grade', page, repo)}).")
    workloads = workloads_for(spec.name)
    names = ", ".join(f"`{w.name}` ({w.about})" for w in workloads)
    lines = [f"`servelab grade {spec.name}=<name>` runs {names} in the simulator ({', '.join(f'`{o}`' for o in SIM)},"
             f" the virtual clock) for the plugin and every built-in {spec.name.replace('_', ' ')}, the other kinds "
             "the default stack's. Per workload:", "", f"    {_formula(spec.name)}", "",
             "where goodput is requests meeting every SLO they have per second"
             + (", of the scored clients only on a workload that names them (`fairness_flood`: `steady`)"
                if any(w.scored_clients for w in workloads) else "")
             + "".join(f", {t.label} is {t.about}" for t in score_rule(spec.name).terms if t.about)
             + "; a term whose figure is 0 or missing leaves the score undefined (`-`). The overall score is the "
             "geometric mean over the workloads (undefined if any is)."]
    if spec.name == "scheduler":
        lines[-1] += (f" A scheduler that needs predictions (`needs_length_predictor`) is graded with "
                      f"`{PREDICTOR}`.")
    presets = ", ".join(f"`experiment=grade_{w.name}`" for w in workloads)
    lines[-1] += f" One workload as a run of its own: {presets} plus `{spec.group}=<name>`."
    return "\n".join(lines)


def grade_workloads(_: str | None, page: Path, repo: Path) -> str:
    lines = ["| workload | grades | runs under (after the common settings) | traffic | as a run |", "|---|---|---|---|---|"]
    for w in WORKLOADS:
        scored = f"; scored on client {_code(w.scored_clients)}" if w.scored_clients else ""
        lines.append(f"| `{w.name}` | {_code(w.kinds)} | {_code(w.overrides)} | {w.about}{scored} "
                     f"(`workload=grade workload.grade={w.requests.__name__}`) | `experiment=grade_{w.name}` |")
    return "\n".join(lines)


def grade_rules(_: str | None, page: Path, repo: Path) -> str:
    return "\n".join(f"- `{kind}` against `{reference}`: `{_formula(kind)}`" for kind, reference in graded_kinds().items())


def context(kind: str | None, page: Path, repo: Path) -> str:
    spec = _spec(kind)
    cls = spec.context
    doc = _prose(cls.__doc__)
    lines = [f"Built as `{spec.base.__name__}(config, context)`, `context` a frozen `{cls.__name__}` "
             f"(`from servelab.plugin_api import {cls.__name__}`; also `self.context`): {doc}", "",
             "| field | type | default |", "|---|---|---|"]
    nested: list[str] = []
    for f in dataclasses.fields(cls):
        lines.append(f"| `{f.name}` | `{_cell(_type(f))}` | {_cell(_default(f))} |")
        for word in re.findall(r"[A-Z]\w+", _type(f)):
            inner = getattr(plugin_api, word, None)
            # a frozen dataclass the context holds (its fields), or a read-only view (its methods: ``*View``)
            if (word in plugin_api.__all__ and (dataclasses.is_dataclass(inner) or word.endswith("View"))
                    and word not in nested):
                nested.append(word)
    props = [n for n, v in vars(cls).items() if isinstance(v, property)]
    if props:
        lines += ["", f"Also (properties): {_code(props)}."]
    for word in nested:
        inner = getattr(plugin_api, word)
        if dataclasses.is_dataclass(inner):
            lines += ["", f"`{word}` (frozen, `servelab.plugin_api`): "
                      + ", ".join(f"`{f.name}: {_type(f)}`" for f in dataclasses.fields(inner)) + "."]
        else:  # a view the plugin calls: its methods and what each answers
            lines += ["", f"`{word}` (read-only, `servelab.plugin_api`): {_prose(inner.__doc__)}", ""]
            lines += [f"- `{name}{_signature(member)}`: {_prose(member.__doc__)}" for name, member in vars(inner).items()
                      if not name.startswith("_") and inspect.isfunction(member)]
    return "\n".join(lines)


def _signature(func) -> str:
    """``(tier: int) -> int``: the method's parameters but ``self``, with their annotations as written."""
    def text(annotation) -> str:  # a string under ``from __future__ import annotations``
        return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))

    sig = inspect.signature(func)
    params = ", ".join(p.name + ("" if p.annotation is p.empty else f": {text(p.annotation)}")
                       for p in sig.parameters.values() if p.name != "self")
    ret = sig.return_annotation
    return f"({params})" + ("" if ret is sig.empty else f" -> {text(ret)}")


def guides(_: str | None, page: Path, repo: Path) -> str:
    items = [f"[{spec.name.replace('_', ' ')}]({_link(spec.guide, page, repo)})" for spec in KINDS.values() if spec.guide]
    lines: list[str] = []
    for item in items:  # whole links per line, lines within the pages' 120 characters (indentation included)
        item += "," if item is not items[-1] else "."
        if lines and len(lines[-1]) + 1 + len(item) <= 112:
            lines[-1] += " " + item
        else:
            lines.append(item)
    return "\n".join(lines)


def _spec(kind: str | None) -> KindSpec:
    if kind not in KINDS:
        raise DocsError(f"kind {kind!r} is not in the kinds table ({', '.join(KINDS)})")
    return KINDS[kind]


BLOCKS: dict[str, Callable[[str | None, Path, Path], str]] = {
    "kinds": kinds_list, "hooks-table": hooks_table, "imports": imports, "check-plugin-table": check_plugin_table,
    "grade-workloads": grade_workloads, "grade-rules": grade_rules, "guides": guides,
    "context": context, "check-plugin": check_plugin_kind, "grade": grade_kind}


# ---- pages ---------------------------------------------------------------------------------------

def pages(repo: Path) -> list[Path]:
    """The pages that may hold generated parts: the README and every page under docs/."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def render(page: Path, repo: Path) -> str:
    """``page``'s text with every generated part written afresh."""
    text = page.read_text()

    def write(match: re.Match) -> str:
        block, arg = match["block"], match["arg"]
        if block not in BLOCKS:
            raise DocsError(f"{page.relative_to(repo)}: unknown generated block {block!r} (blocks: {', '.join(BLOCKS)})")
        body = BLOCKS[block](arg, page, repo)
        head = f"<!-- generated: {block}{f' {arg}' if arg else ''} -->"
        if block in INLINE:
            return f"{head}{body}<!-- /generated -->"
        line_start = text.rfind("\n", 0, match.start()) + 1
        indent = text[line_start:match.start()]  # a part inside a list item keeps the item's indentation
        indent = indent if not indent.strip() else ""
        body = "\n".join(indent + line if line else line for line in body.split("\n"))
        return f"{head}\n{body}\n{indent}<!-- /generated -->"

    return MARKER.sub(write, text)


def stale_pages(repo: Path) -> list[str]:
    """The pages whose generated parts differ from what :func:`render` writes."""
    return [str(p.relative_to(repo)) for p in pages(repo) if render(p, repo) != p.read_text()]


def guide_problems(repo: Path) -> list[str]:
    """Why a kind's guide falls short: missing (a kind with ``guide=None`` has none to check), a
    generated part of :data:`GUIDE_BLOCKS` missing, a hook of its base class never named."""
    problems = []
    for spec in KINDS.values():
        if spec.guide is None:
            continue
        path = repo / spec.guide
        if not path.is_file():
            problems.append(f"kind {spec.name!r}: its guide {spec.guide} does not exist (write it, or set guide=None "
                            "in its KindSpec)")
            continue
        text = path.read_text()
        have = {(m["block"], m["arg"]) for m in MARKER.finditer(text)}
        for block in GUIDE_BLOCKS:
            if (block, spec.name) not in have:
                problems.append(f"{spec.guide}: no `<!-- generated: {block} {spec.name} -->` part (add the markers "
                                "and run python scripts/generate_docs.py)")
        unnamed = [h for h in hooks(spec) if not re.search(rf"`(?:[\w.]+\.)?{h}\b", text)]
        if unnamed:
            problems.append(f"{spec.guide}: {spec.base.__name__}'s hooks {', '.join(unnamed)} are never named: say "
                            "what each does and when it is called (or that a plugin does not override it)")
    return problems


def write_all(repo: Path) -> list[Path]:
    """Rewrite every page whose generated parts are stale; the pages written."""
    written = []
    for page in pages(repo):
        text = render(page, repo)
        if text != page.read_text():
            page.write_text(text)
            written.append(page)
    return written
