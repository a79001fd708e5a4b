"""``servelab new-plugin``: the generated package installs, registers and passes its own test out
of the box; bad input is one line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from servelab.kit.new_plugin import GRADED_KINDS, new_plugin, render, servelab_version
from servelab.core.registry import KINDS
from servelab.testing import check_plugin

from doc_plugins import register_module_file


def servelab_cli(*args, cwd=None, env_extra=None):
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", "from servelab.cli.main import main; main()", *args],
                          capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def test_a_generated_scheduler_installs_and_passes_its_own_test(tmp_path):
    proc = servelab_cli("new-plugin", "scheduler", "my_policy", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    root = tmp_path / "my_policy"
    pyproject = (root / "pyproject.toml").read_text()
    assert '[project.entry-points.servelab]\nmy_policy = "servelab_my_policy"' in pyproject
    assert f'dependencies = ["servelab>={servelab_version()}"]' in pyproject
    assert (root / "servelab_my_policy" / "__init__.py").is_file() and not (root / "my_policy").exists()
    # Installed as the users do (pip), into a folder of its own: nothing to uninstall.
    site = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(site), str(root)], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "1 passed" in test.stdout


def test_the_generated_readme_offers_grade_for_the_kinds_grade_scores():
    from servelab.kit.grading import GRADED

    assert GRADED_KINDS == tuple(GRADED)
    assert "servelab grade evictor=my_evictor" in render("evictor", "my_evictor")["README.md"]
    assert "servelab grade router=my_router" in render("router", "my_router")["README.md"]
    assert "servelab grade" not in render("drafter", "my_drafter")["README.md"]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_package_needs_this_servelab_or_newer_and_pins_no_torch(kind):
    # An exact pin in a third-party package would replace every user's own servelab and torch build.
    pyproject = render(kind, f"my_{kind}")["pyproject.toml"]
    dependencies = [line for line in pyproject.splitlines() if line.startswith("dependencies")]
    assert dependencies == [f'dependencies = ["servelab>={servelab_version()}"]']
    assert "torch==" not in pyproject and "servelab==" not in pyproject


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_module_is_namespaced_and_the_entry_point_and_test_follow_it(kind):
    name = f"my_{kind}"
    files = render(kind, name)
    assert set(files) == {"pyproject.toml", "README.md", f"servelab_{name}/__init__.py", f"tests/test_{name}.py"}
    assert f'[project.entry-points.servelab]\n{name} = "servelab_{name}"' in files["pyproject.toml"]
    assert f'packages = ["servelab_{name}"]' in files["pyproject.toml"]
    assert f"servelab_{name}/__init__.py" in files["README.md"]
    # what selects it: the kind's config group (an executor is `backend=`)
    assert f"python run.py {KINDS[kind].group}={name} " in files["README.md"]
    assert f"import {name}" not in files[f"tests/test_{name}.py"]  # the test finds it through the entry point


def test_a_name_a_user_module_has_is_free_its_module_is_not(tmp_path):
    # `json` (like a user's `utils`) no longer collides: the package's module is servelab_json.
    root = new_plugin("scheduler", "json", tmp_path / "free")
    assert (root / "servelab_json" / "__init__.py").is_file()
    taken = tmp_path / "site"
    taken.mkdir()
    (taken / "servelab_taken.py").write_text("")
    out = tmp_path / "out"
    out.mkdir()
    proc = servelab_cli("new-plugin", "scheduler", "taken", "--dir", str(out), env_extra={"PYTHONPATH": str(taken)})
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "servelab new-plugin: error: a module named 'servelab_taken' is importable already; the package would "
        "shadow it (or be shadowed): pick another name")
    assert not any(out.iterdir())


@pytest.mark.parametrize("kind", [k for k, spec in KINDS.items() if spec.template])  # executor: the generic one
def test_every_kind_imports_registers_and_starts_the_kit(tmp_path, kind):
    name = f"my_{kind}"
    root = new_plugin(kind, name, tmp_path)
    registry = register_module_file(root / f"servelab_{name}" / "__init__.py", f"servelab_{name}")
    cls = registry.get(kind, name)
    assert cls.Config.__dataclass_fields__  # a typed Config with at least one parameter
    test_text = (root / "tests" / f"test_{name}.py").read_text()
    if kind == "time_model":
        assert f"time_model={name}" in test_text
        return
    assert f'check_plugin("{kind}", "{name}"' in test_text
    report = check_plugin(kind, name, registry=registry, cases=2, real_model=False)
    assert report.ok, report


@pytest.mark.parametrize("args, message", [
    (["nope", "x"], "unknown kind 'nope'; kinds: scheduler, allocator, preemption, drafter, time_model"),
    (["scheduler", "my-policy"], "name 'my-policy' is not a valid Python identifier"),
    (["scheduler", "class"], "name 'class' is not a valid Python identifier"),
    (["scheduler", "fcfs"], "scheduler 'fcfs' exists already"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = servelab_cli("new-plugin", *args, "--dir", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"servelab new-plugin: error: {message}")
    assert not any(tmp_path.iterdir())


def test_an_existing_folder_is_left_alone(tmp_path):
    (tmp_path / "taken").mkdir()
    proc = servelab_cli("new-plugin", "scheduler", "taken", "--dir", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"servelab new-plugin: error: {tmp_path / 'taken'} exists already; remove it or choose another --dir")
    assert not any((tmp_path / "taken").iterdir())
