"""The README and the pages under docs/ stay true, cheaply (no model runs):

- the README is a short guide (<= 200 lines) that keeps CI's two Quickstart commands verbatim;
- every relative Markdown link of the README, docs/*.md and experiments/README.md resolves (file and,
  for a Markdown target, the #anchor);
- every ``python run.py ...`` / ``servelab ...`` command with overrides shown in a code block of the
  README or docs/*.md composes with ``servelab.api.compose``;
- every dotted ``servelab.x.y`` name in those pages imports, and so does every ``from servelab... import``
  of their Python blocks; the plugins the write-a-* guides build import only ``servelab.plugin_api``.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import shlex
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [README, *DOCS, REPO / "experiments" / "README.md"]
QUICKSTART = ("bash scripts/dev.sh run", "bash scripts/dev.sh test")  # .ci/run runs the second one

# Plugins that exist only in a guide or in examples/ (their own tests compose them after registering).
PAGE_PLUGINS = {"spf", "spf_bounded", "my_policy", "watermark_paged", "cheapest", "adaptive_repeat", "linear", "prompt_ratio",
                "deepest_first", "least_kv", "keep_roots", "remote_store", "hot_spread", "sticky_lfu"}
# Old flat import paths docs/plugins.md names as such (they import, with a DeprecationWarning).
OLD_PATHS = {"servelab.interfaces", "servelab.scheduling", "servelab.testing"}
# Subcommands whose arguments are not Hydra overrides (paths, plugin names, kinds).
NOT_OVERRIDES = {"compare", "report", "check-plugin", "new-plugin", "grade"}
# Flags that take the next argument as their value (`servelab serve --port 8001`, `run.py --cfg job`).
VALUE_FLAGS = {"--host", "--port", "--api-key", "--cfg", "--package", "-p"}

FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
DOTTED = re.compile(r"\bservelab(?:\.[A-Za-z_]\w*)+")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


def _blocks(page: Path, *langs: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if not langs or lang in langs]


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", _prose(page), flags=re.M)}


# --- the README ---------------------------------------------------------------------------------

def test_readme_is_a_short_guide():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move reference material to docs/"
    long = [n for n, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README.md lines over 120 characters: {long}"


def test_readme_keeps_the_quickstart_commands():
    text = README.read_text()
    quickstart = text[text.index("## Quickstart"):]
    quickstart = quickstart[:quickstart.index("\n## ", 1)]
    for command in QUICKSTART:
        assert re.search(rf"^{re.escape(command)}(\s|$)", quickstart, flags=re.M), \
            f"the Quickstart lost `{command}` (CI runs it; keep it verbatim)"


@pytest.mark.skipif(not (REPO / ".venv" / ".servelab-installed").is_file()
                    or (REPO / "pyproject.toml").stat().st_mtime > (REPO / ".venv" / ".servelab-installed").stat().st_mtime,
                    reason="scripts/dev.sh would set up .venv first (run it once)")
@pytest.mark.parametrize("marker, slow_selected", [((), False), (("-m", "slow"), True)])
def test_the_test_command_leaves_slow_tests_out_unless_asked(marker, slow_selected):
    """CI's command (docs/testing.md): the slow tests, each with a fast twin, only when a -m asks."""
    done = subprocess.run(["bash", "scripts/dev.sh", "test", "--co", "-q", "-n", "0", *marker,
                           "tests/test_cluster_experiment.py", "tests/test_docs_pages.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("test_cluster_experiment.py::test_routers_section" in done.stdout) is slow_selected
    assert ("test_docs_pages.py::test_readme_is_a_short_guide" in done.stdout) is not slow_selected


def test_readme_indexes_every_docs_page():
    text = README.read_text()
    missing = [f"docs/{p.name}" for p in DOCS if f"](docs/{p.name})" not in text]
    assert not missing, f"pages missing from the README's docs index: {missing}"


# --- links --------------------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


# --- commands -----------------------------------------------------------------------------------

def _commands(page: Path) -> list[str]:
    """Shell commands of the page's code blocks (continuations joined, `a && b` split)."""
    commands = []
    for block in _blocks(page, "bash", "sh", "shell", ""):
        for line in block.replace("\\\n", " ").splitlines():
            commands += [part.strip() for part in line.split("&&")]
    return commands


def _overrides(command: str) -> list[str] | None:
    """The Hydra overrides of a ``python run.py`` / ``servelab`` / ``scripts/dev.sh run`` command,
    or None for a command that takes none (another program, ``--help``, ``servelab compare``...)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return None
    while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):  # SERVELAB_API_KEY=secret servelab ...
        words = words[1:]
    words = [w for w in words if w not in ("&", "|")]
    if words[:2] == ["python", "run.py"] or words[:2] == [".venv/bin/python", "run.py"]:
        args = words[2:]
    elif words[:1] == ["servelab"]:
        args = words[1:]
    elif words[:3] == ["bash", "scripts/dev.sh", "run"]:
        args = words[3:]
    else:
        return None
    if args[:1] == ["route"]:  # servelab route's aliases: replicas=N, backends=[...]
        args = [f"route.{a}" if a.startswith(("replicas=", "backends=")) else a for a in args]
    if args[:1] and not args[0].startswith("-") and "=" not in args[0]:  # a subcommand
        if args[0] in NOT_OVERRIDES:
            return None
        args = args[1:]
    if any(a in ("--help", "-h", "--hydra-help", "--info") for a in args):
        return None
    multirun = "-m" in args or "--multirun" in args
    overrides, skip_next = [], False
    for arg in args:
        if skip_next:
            skip_next = False
        elif arg in VALUE_FLAGS:
            skip_next = True
        elif arg.startswith("-"):
            continue  # -m, --out=PATH, --rounds=3
        else:
            key, _, value = arg.partition("=")
            if multirun and "," in value and not value.startswith("["):
                value = value.split(",")[0]  # a sweep: its first value stands for the rest
            overrides.append(f"{key}={value}")
    return overrides


def _shown_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in [README, *DOCS]:
        for command in _commands(page):
            overrides = _overrides(command)
            if overrides is None:
                continue
            if any(o.split("=", 1)[1] in PAGE_PLUGINS for o in overrides if "." not in o.split("=")[0]):
                continue  # a guide's own plugin: its test registers and composes it
            found.append((_rel(page), command, overrides))
    return found


def test_the_pages_show_commands():
    pages = {page for page, _, _ in _shown_commands()}
    assert {"README.md", "docs/configuration.md", "docs/simulator.md", "docs/sweeps.md"} <= pages


def test_every_command_shown_composes(monkeypatch):
    from servelab import api

    api.register_configs()  # once: compose() re-stores every config each call (0.15 s), same result
    monkeypatch.setattr(api, "register_configs", lambda *args, **kwargs: None)
    failures, seen = [], set()
    for page, command, overrides in _shown_commands():
        if tuple(overrides) in seen:
            continue
        seen.add(tuple(overrides))
        try:
            api.compose(overrides)
        except Exception as exc:  # noqa: BLE001 - collect them all
            failures.append(f"{page}: `{command}`\n    {type(exc).__name__}: {str(exc).splitlines()[0]}")
    assert not failures, "commands that no longer compose:\n" + "\n".join(failures)


def test_overrides_parser():
    assert _overrides("python run.py -m scheduler=fcfs,slo_aware block_size=8  # a sweep") == \
        ["scheduler=fcfs", "block_size=8"]
    assert _overrides("SERVELAB_API_KEY=k servelab serve --host 0.0.0.0 --port 8001 max_num_seqs=4 &") == \
        ["max_num_seqs=4"]
    assert _overrides("servelab profile --out=p.json backend.num_threads=1") == ["backend.num_threads=1"]
    assert _overrides("python run.py --cfg job") == []
    assert _overrides("servelab compare multirun/x") is None
    assert _overrides("python experiments/x/analyze.py") is None


# --- module names -------------------------------------------------------------------------------

def _resolves(dotted: str) -> str | None:
    """None when ``dotted`` is a module, or a module followed by attributes, reached without a
    deprecation warning; else what is wrong."""
    parts = dotted.split(".")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                continue
            try:
                for attr in parts[i:]:
                    obj = getattr(obj, attr)
            except AttributeError:
                return f"no attribute {attr!r} in {'.'.join(parts[:i])}"
            break
        else:
            return "no such module"
    deprecated = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                  and "servelab" in str(w.message)]
    if deprecated and dotted not in OLD_PATHS:
        return f"deprecated: {deprecated[0]}"
    return None


def test_every_servelab_name_imports():
    names = {}
    for page in PAGES:
        for name in DOTTED.findall(page.read_text()):
            names.setdefault(name.rstrip("."), _rel(page))
    broken = sorted(f"{name} ({page}): {_resolves(name)}" for name, page in names.items() if _resolves(name))
    assert not broken, f"names in the docs that do not import: {broken}"


def _servelab_imports(code: str) -> list[tuple[str, str]]:
    tree = ast.parse(code)
    pairs = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "servelab":
            pairs += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            pairs += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "servelab"]
    return pairs


def test_every_python_import_in_the_pages_resolves():
    broken = []
    for page in PAGES:
        for code in _blocks(page, "python"):
            for module, name in _servelab_imports(code):
                problem = _resolves(f"{module}.{name}" if name else module)
                if problem:
                    broken.append(f"{_rel(page)}: from {module} import {name}: {problem}")
    assert not broken, f"imports in the docs that fail: {broken}"


def test_guide_plugins_import_only_the_plugin_api():
    offenders = []
    for page in (REPO / "docs").glob("write-*.md"):
        for code in _blocks(page, "python"):
            if "@hookimpl" not in code:
                continue
            modules = {module for module, _ in _servelab_imports(code)}
            if modules - {"servelab.plugin_api"}:
                offenders.append(f"{page.name}: {sorted(modules)}")
    assert not offenders, f"a guide's plugin imports past servelab.plugin_api: {offenders}"
