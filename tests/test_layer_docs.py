"""The layer line the README and ``servelab``'s docstring show is the one the import contract
(``[tool.importlinter]`` in pyproject.toml) enforces, and every package the README's "Where things
live" table could name is in it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _contract_layers() -> list[set[str]]:
    """Bottom to top, each layer a set of sibling names."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (layers,) = [c["layers"] for c in pyproject["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    return [{name.strip() for name in layer.split("|")} for layer in reversed(layers)]


def _shown_layers(text: str, arrow: str, quote: str) -> list[set[str]]:
    """The layer line in ``text``: the ``arrow``-joined run of ``quote``d names (``|`` between siblings)."""
    name = rf"{quote}\w+{quote}(?: \([^)]*\))?"
    line = re.search(rf"{name}(?:\s*(?:{re.escape(arrow)}|\|)\s*{name})+", text)
    assert line, f"no layer line joined by {arrow!r}"
    flat = re.sub(r"\([^)]*\)", "", line.group(0))  # "``core`` (the plugin contract, no torch)"
    return [set(re.findall(rf"{quote}(\w+){quote}", part)) for part in flat.split(arrow)]


def test_the_readme_shows_the_contracts_layers():
    readme = (REPO / "README.md").read_text()
    where = readme[readme.index("## Where things live"):]
    assert _shown_layers(where, "←", "`") == _contract_layers()


def test_the_package_docstring_shows_the_contracts_layers():
    import servelab

    assert _shown_layers(servelab.__doc__, "<-", "``") == _contract_layers()


def test_the_readme_table_names_every_sub_package_of_framework():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## Where things live"):readme.index("## Documentation")]
    for init in sorted((REPO / "framework").glob("*/__init__.py")):
        assert f"`framework/{init.parent.name}/" in table, f"framework/{init.parent.name}/ is not in Where things live"
