"""Load a plugin written out in a docs page and register it beside the built-ins."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from servelab.core.registry import Registry
from servelab.testing import registry_with

DOCS = Path(__file__).resolve().parent.parent / "docs"


def page_code_blocks(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), flags=re.S)


def register_page_plugin(code: str, folder: Path, module_name: str) -> Registry:
    """Import ``code`` as ``module_name``, build a registry of it plus the built-ins, and put its
    configs in Hydra's ConfigStore (so compose() can select it)."""
    path = folder / f"{module_name}.py"
    path.write_text(code)
    return register_module_file(path, module_name)


def register_module_file(path: Path, module_name: str) -> Registry:
    """Import the file ``path`` as ``module_name`` and register it beside the built-ins (registry
    and ConfigStore), as an installed plugin package would be."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return registry_with(module)  # servelab's own plugins + this module, configs composable
