"""The pages cannot drift from the kinds table (``servelab.core.kinds.KINDS``):

- every list of kinds on the pages (README, docs/*.md) is generated (``servelab.kit.kind_docs``,
  ``python scripts/generate_docs.py``) and up to date, and so are the grade presets
  (``conf/experiment/grade_*.yaml``);
- no page lists kinds by hand outside a generated part (except the groups table of
  docs/configuration.md, checked below against the table and the registry);
- every kind with a guide has one, with its generated context fields, what ``check-plugin`` runs and how
  ``grade`` scores it, names every hook of its base class, and writes ``servelab ...`` rather than
  ``python run.py ...`` (which an installed user does not have);
- a kind added to the table (as the kv-door helper's ``kv_connector`` will be) makes these fail until
  its guide and the pages say so.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from conftest import REPO
from servelab.core.interfaces import Plugin
from servelab.core.kinds import KINDS, KindSpec
from servelab.kit import kind_docs
from servelab.kit.grade_presets import stale_presets
from servelab.kit.stage_info import StageInfo, UndescribedStage, stage_info

GENERATE = "run `python scripts/generate_docs.py`"


def test_every_generated_part_is_up_to_date():
    stale = kind_docs.stale_pages(REPO)
    assert not stale, f"pages whose kind lists or kind reference differ from the kinds table: {stale}; {GENERATE}"


def test_the_grade_presets_are_up_to_date():
    stale = stale_presets(REPO)
    assert not stale, f"grade presets that differ from servelab.kit.grade_workloads: {stale}; {GENERATE}"


def test_every_guide_states_its_kind():
    problems = kind_docs.guide_problems(REPO)
    assert not problems, "\n".join(problems)


def test_every_stage_a_kind_names_is_described():
    for spec in KINDS.values():
        for stage in spec.checks:
            assert isinstance(stage_info(stage), StageInfo)


# ---- no hand-written list of kinds ----------------------------------------------------------------

def _mentions() -> tuple[re.Pattern, re.Pattern, dict[str, str]]:
    forms = {}
    for k in KINDS.values():
        for form in {k.name, k.group, k.hook, k.base.__name__, k.context.__name__}:
            forms[form] = k.name
    for k in KINDS.values():
        if k.guide:
            forms[Path(k.guide).name] = k.name
    names = "|".join(sorted(map(re.escape, forms), key=len, reverse=True))
    code = re.compile(rf"`({names})(?:=[^`]*)?`")
    link = re.compile(rf"\]\((?:[\w./-]*/)?({names})[)#]")
    return code, link, forms


def _kinds_in(text: str) -> set[str]:
    code, link, forms = _mentions()
    return {forms[m[1]] for m in code.finditer(text)} | {forms[m[1]] for m in link.finditer(text)}


CHECKED = "<!-- checked: config-groups -->"  # a table tests/test_docs_kinds.py checks row by row


def hand_written_kind_lists(page: Path) -> list[str]:
    """Paragraphs (a table: its first column, or one row) outside the generated parts that name four or
    more kinds: a list of kinds written by hand, which a new kind would not join."""
    text = kind_docs.MARKER.sub("", page.read_text())
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith(CHECKED):
            continue
        rows = [line for line in para.strip().splitlines() if line.startswith("|")]
        if rows and len(rows) == len(para.strip().splitlines()):
            kinds = max([set().union(*(_kinds_in(r.split("|")[1]) for r in rows)), *(_kinds_in(r) for r in rows)],
                        key=len)
        else:
            kinds = _kinds_in(para)
        if len(kinds) >= 4:
            where = page.relative_to(REPO) if page.is_relative_to(REPO) else page.name
            found.append(f"{where}: {sorted(kinds)} in {' '.join(para.split())[:100]!r}")
    return found


def test_no_page_lists_kinds_by_hand():
    found = [f for page in kind_docs.pages(REPO) for f in hand_written_kind_lists(page)]
    assert not found, ("lists of kinds written by hand (generate them: <!-- generated: kinds all --> ..., "
                       "servelab.kit.kind_docs; or link to docs/plugins.md):\n" + "\n".join(found))


def test_the_list_check_finds_a_hand_written_list(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Swap one with `scheduler=`, `allocator=`, `preemption=` or `drafter=`.\n\nOne `router` here.\n\n"
                    "| a | b |\n|---|---|\n| `scheduler` | x |\n| `evictor` | x |\n| `router` | x |\n| `drafter` | x |\n\n"
                    "<!-- generated: kinds all -->`scheduler`, `allocator`, `evictor`, `router`<!-- /generated -->\n")
    found = hand_written_kind_lists(page)
    assert len(found) == 2 and "drafter" in found[0] and "'router'" in found[1], found


def test_the_configuration_groups_table_has_every_kind_and_its_builtins():
    """docs/configuration.md's groups table (hand-written: it has notable fields) has a row per kind's
    group, each listing every built-in of that kind, default first."""
    from servelab.core.registry import default_registry

    text = (REPO / "docs" / "configuration.md").read_text()
    table = text[text.index(CHECKED):].split("\n\n")[0]
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `([\w/]+)` \| ([^|]*(?:\\\|[^|]*)*) \|", table, re.M)}
    registry = default_registry()
    for spec in KINDS.values():
        assert spec.group in rows, f"docs/configuration.md's groups table has no row for `{spec.group}`"
        cell = rows[spec.group]
        builtins = [n for n in registry.names(spec.name)
                    if registry.get(spec.name, n).__module__.startswith(("servelab.plugins.", "servelab.exec.",
                                                                         "servelab.sim."))]
        missing = [n for n in builtins if f"`{n}`" not in cell]
        assert not missing, f"docs/configuration.md: `{spec.group}` row lacks {missing}"
        assert cell.startswith(f"`{spec.default}` (default"), f"`{spec.group}` row: the default {spec.default} first"


# ---- the guides ----------------------------------------------------------------------------------

def _guides() -> list[KindSpec]:
    return [spec for spec in KINDS.values() if spec.guide]


@pytest.mark.parametrize("spec", _guides(), ids=lambda s: s.name)
def test_the_guides_context_part_lists_every_field_of_the_context(spec):
    text = (REPO / spec.guide).read_text()
    part = next(m["body"] for m in kind_docs.MARKER.finditer(text) if (m["block"], m["arg"]) == ("context", spec.name))
    for field in dataclasses.fields(spec.context):
        assert f"| `{field.name}` |" in part, f"{spec.guide}: context field {field.name!r} missing"


@pytest.mark.parametrize("spec", _guides(), ids=lambda s: s.name)
def test_the_guides_write_servelab_not_python_run_py(spec):
    text = (REPO / spec.guide).read_text()
    assert "python run.py" not in text, f"{spec.guide}: write `servelab <overrides>` (installed users have no run.py)"


# ---- a kind added to the table --------------------------------------------------------------------

class _Widget(Plugin):
    """A kind nobody wrote pages for."""

    def spin(self) -> None:
        """A hook."""


@dataclasses.dataclass(frozen=True)
class _WidgetContext:
    size: int = 0


@pytest.fixture
def widget_kind(monkeypatch):
    def add(guide: str | None, checks: tuple[str, ...] = ()) -> KindSpec:
        spec = KindSpec("widget", _Widget, "servelab_register_widgets", _WidgetContext, "plain", "what a widget does",
                        checks=checks, guide=guide)
        monkeypatch.setitem(KINDS, "widget", spec)
        return spec
    return add


def test_a_new_kind_without_its_guide_fails_naming_it(widget_kind):
    widget_kind("docs/write-a-widget.md")
    assert any("kind 'widget': its guide docs/write-a-widget.md does not exist" in p
               for p in kind_docs.guide_problems(REPO))
    with pytest.raises(kind_docs.DocsError, match="kind 'widget': its guide docs/write-a-widget.md does not exist"):
        kind_docs.stale_pages(REPO)  # the hooks table links every guide


def test_a_new_kind_without_a_guide_still_joins_every_list(widget_kind):
    widget_kind(None)
    assert not any("widget" in p for p in kind_docs.guide_problems(REPO))
    assert "docs/plugins.md" in kind_docs.stale_pages(REPO)
    rendered = kind_docs.render(REPO / "docs" / "plugins.md", REPO)
    assert "`widget`, `executor`" not in rendered and "`executor`, `widget`" in rendered  # the kinds lists
    assert "| `widget` | `widget=` (`plain`) | `servelab_register_widgets` |" in rendered  # the hooks table


def test_a_new_kinds_guide_needs_its_parts_and_its_hooks(widget_kind, tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "write-a-widget.md").write_text("# Write a widget\n\nNothing yet.\n")
    widget_kind("docs/write-a-widget.md")
    problems = [p for p in kind_docs.guide_problems(tmp_path) if "widget" in p]
    assert any("no `<!-- generated: context widget -->` part" in p for p in problems), problems
    assert any("hooks spin are never named" in p for p in problems), problems


def test_a_stage_without_a_description_is_named(widget_kind):
    widget_kind(None, checks=("servelab.kit.stage_info:nothing_here",))
    with pytest.raises(UndescribedStage, match="conformance stage 'servelab.kit.stage_info:nothing_here' has no "
                                               "StageInfo"):
        kind_docs.stale_pages(REPO)


# ---- the command lines' own help ------------------------------------------------------------------

def test_servelab_help_lists_every_kind(widget_kind):
    """``servelab --help`` is built from the table: a kind added to it is listed with its summary."""
    from servelab.cli.usage import usage_text

    widget_kind(None)
    text = usage_text()
    for spec in KINDS.values():
        assert f"{spec.group}  (default: " in text and spec.summary in text, spec.name


@pytest.mark.parametrize("command, which", [("servelab.kit.conformance", "check-plugin"),
                                            ("servelab.kit.new_plugin", "all"), ("servelab.kit.grading", "grade")])
def test_each_commands_help_lists_its_kinds(command, which, capsys):
    import importlib

    with pytest.raises(SystemExit):
        importlib.import_module(command).main(["--help"])
    listed = " ".join(capsys.readouterr().out.split())
    kinds = kind_docs.kinds_list(which, REPO / "README.md", REPO).replace("`", "")
    assert kinds in listed, f"{command} --help does not list {kinds}"
