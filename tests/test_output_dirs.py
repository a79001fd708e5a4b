"""One output option for every command: ``hydra.run.dir=DIR`` (docs/results.md, "Where each command
writes"). run.py gets it from Hydra (tests/test_cli.py); the subcommands compose through the API and
read it with ``compose_with_run_dir``; each prints the path on its last line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servelab.api import command_output_dir, compose_with_run_dir

DATED = r"outputs/{}/\d{{4}}-\d\d-\d\d/\d\d-\d\d-\d\d"


def test_compose_reports_the_run_dir_an_override_sets(tmp_path):
    cfg, run_dir = compose_with_run_dir(["logger=none"])
    assert run_dir is None and "hydra" not in cfg
    cfg, run_dir = compose_with_run_dir(["logger=none", f"hydra.run.dir={tmp_path}/x"])
    assert run_dir == f"{tmp_path}/x" and "hydra" not in cfg
    _, run_dir = compose_with_run_dir([f"hydra.run.dir={tmp_path}/" + "${now:%Y}"])  # resolved as run.py would
    assert re.fullmatch(rf"{tmp_path}/\d{{4}}", run_dir)


def test_the_run_dir_wins_over_the_alias_then_the_default():
    assert command_output_dir("serve", "a", "b") == Path("a")
    assert command_output_dir("serve", None, "b") == Path("b")
    assert re.fullmatch(DATED.format("serve"), command_output_dir("serve").as_posix())


def test_serve_config_records_where_the_results_go(tmp_path):
    from servelab.serve.command import compose_serve_config

    base = ["model=tiny", "logger=none"]
    cfg = compose_serve_config([*base, f"hydra.run.dir={tmp_path}/run", f"serve.output_dir={tmp_path}/alias"])
    assert cfg.serve.output_dir == f"{tmp_path}/run"
    assert compose_serve_config([*base, f"serve.output_dir={tmp_path}/alias"]).serve.output_dir == f"{tmp_path}/alias"
    assert re.fullmatch(DATED.format("serve"), compose_serve_config(base).serve.output_dir)


def test_serve_writes_its_results_into_the_run_dir(tmp_path):
    pytest.importorskip("fastapi", reason="the serve extra (pip install servelab[serve]) is not installed")
    from serve_helpers import start

    server = start(tmp_path / "alias", f"hydra.run.dir={tmp_path}/run")  # start() passes serve.output_dir too
    server.output_dir = tmp_path / "run"
    with server.client() as client:
        assert client.post("/v1/completions", json={"prompt": "def", "max_tokens": 2}).status_code == 200
    assert server.stop() == 0
    assert server.summary()["num_finished"] == 1 and (tmp_path / "run" / "config.yaml").is_file()
    assert not (tmp_path / "alias").exists()
    assert server.output().strip().splitlines()[-1] == f"results: {tmp_path}/run/requests.jsonl, summary.json"


class _FakeProfile:
    source = {"measured_steps": 3, "model": "tiny", "dtype": "float32", "num_threads": 1}
    fit = {"num_steps": 2, "total_s": 0.1, "r2": 1.0, "mean_abs_pct_error": 0.0, "total_time_error": 0.0}

    def save(self, path):
        Path(path).write_text("{}\n")


@pytest.mark.parametrize("extra, where", [
    (["hydra.run.dir=run"], "run/profile.json"),
    (["--out=mine/p.json"], "mine/p.json"),  # the older option: the file itself
    (["--out=mine/p.json", "hydra.run.dir=run"], "run/profile.json"),
    ([], None),  # outputs/profile/<date>/<time>/profile.json
])
def test_profile_writes_into_the_run_dir(tmp_path, monkeypatch, capsys, extra, where):
    from servelab.cli import profile

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profile, "measure_profile", lambda overrides, rounds: _FakeProfile())
    assert profile.profile_main(["model=tiny", *extra]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    written = [p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.json")]
    assert len(written) == 1 and last == f"results: {written[0]}"
    if where:
        assert written == [where]
    else:
        assert re.fullmatch(DATED.format("profile") + "/profile.json", written[0])


def test_grade_writes_its_tables_into_the_run_dir(tmp_path, monkeypatch, capsys):
    from servelab.kit import grading

    row = grading.Row("chat_burst", "priority", 4, 4, 10.0, 1.0, 2.0, 1.0, 2.0, 1.0, 0, 2.0)
    monkeypatch.setattr(grading, "grade", lambda kind, name: grading.Grade(kind, name, [row]))
    monkeypatch.chdir(tmp_path)
    assert grading.main(["scheduler=priority", f"hydra.run.dir={tmp_path}/run"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"results: {tmp_path}/run/grade.md, grade.csv"
    assert (tmp_path / "run" / "grade.md").read_text().startswith("## scheduler=priority")
    assert "chat_burst" in (tmp_path / "run" / "grade.csv").read_text()
    assert grading.main(["scheduler=priority"]) == 0  # default: a dated folder under outputs/grade
    (folder,) = {p.parent for p in (tmp_path / "outputs").rglob("grade.md")}
    assert re.fullmatch(DATED.format("grade"), folder.relative_to(tmp_path).as_posix())
    with pytest.raises(grading.ServelabError, match="expected <kind>=<name>"):
        grading.main([f"hydra.run.dir={tmp_path}/x"])
