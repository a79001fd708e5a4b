"""The wheel carries all of servelab: every sub-package (a folder with an ``__init__.py`` under
``framework/``, ``plugins/``, ``kernels/``, ``conf/``), every module, and the package data.

``[tool.setuptools] packages`` is a hand-written list (setuptools cannot derive it under the
renamed roots), so a new sub-package left out of it would silently vanish from the wheel; the
first test says which, without building anything; the second builds the wheel and looks inside."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
SKIP = shutil.ignore_patterns(".venv", ".git", "outputs", "multirun", "wandb", "__pycache__", "*.egg-info", "build",
                              ".pytest_cache", ".mypy_cache", ".ruff_cache")


def _roots() -> dict[str, Path]:
    return {name: REPO / folder for name, folder in SETUPTOOLS["package-dir"].items()}


def _packages_on_disk() -> dict[str, Path]:
    """{package name: folder} for every folder with an ``__init__.py`` under a mapped root."""
    found: dict[str, Path] = {}
    for name, root in _roots().items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            if any(part.startswith(".") or part == "__pycache__" for part in rel.parts):
                continue
            found[".".join([name, *rel.parts])] = init.parent
    return found


def _expected_files() -> set[str]:
    """Wheel paths of every module of every package, and of every file the package-data globs match."""
    names: set[str] = set()
    for package, folder in _packages_on_disk().items():
        prefix = package.replace(".", "/")
        names |= {f"{prefix}/{py.name}" for py in folder.glob("*.py")}
        for pattern in SETUPTOOLS.get("package-data", {}).get(package, []):
            names |= {f"{prefix}/{f.relative_to(folder).as_posix()}" for f in folder.glob(pattern) if f.is_file()}
    return names


def test_every_sub_package_is_listed_and_every_listed_package_exists():
    on_disk, listed = set(_packages_on_disk()), set(SETUPTOOLS["packages"])
    assert not on_disk - listed, ("folders with an __init__.py that [tool.setuptools] packages in pyproject.toml "
                                  f"does not list (they would be missing from the wheel): {sorted(on_disk - listed)}")
    assert not listed - on_disk, f"listed in [tool.setuptools] packages but no such folder: {sorted(listed - on_disk)}"
    assert len(listed) == len(SETUPTOOLS["packages"]), "a package is listed twice"


def test_the_package_data_is_there_to_ship():
    expected = _expected_files()
    for must in ("servelab/conf/config.yaml", "servelab/data/traces/README.md"):
        assert must in expected, must
    assert any(n.startswith("servelab/checkpoints/") and n.endswith(".safetensors") for n in expected)
    assert any(n.startswith("servelab/data/op_tables/") and n.endswith(".csv") for n in expected)


def test_the_built_wheel_carries_every_sub_package_module_and_data_file(tmp_path):
    """About 5 s on 2 cores: pip builds the wheel from a copy of the checkout, without build isolation."""
    src = tmp_path / "src"  # build from a copy: no build/ or egg-info left in the checkout
    shutil.copytree(REPO, src, ignore=SKIP)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    names = set(zipfile.ZipFile(next((tmp_path / "dist").glob("servelab-*.whl"))).namelist())
    packages = {package.replace(".", "/") for package in _packages_on_disk()}
    assert not {f"{p}/__init__.py" for p in packages} - names, "sub-packages missing from the wheel"
    missing = _expected_files() - names
    assert not missing, f"{len(missing)} modules or data files missing from the wheel, e.g. {sorted(missing)[:10]}"
    # nothing of the repository's top leaks in as a package of its own
    assert {n.split("/")[0] for n in names if not n.startswith("servelab-")} == {"servelab"}, sorted(
        {n.split("/")[0] for n in names})
