"""The CPU-side logic of experiments/gpu_check_tp.py (the GPU run itself needs CUDA devices)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_check_tp", REPO / "experiments" / "gpu_check_tp.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sizes_that_do_not_fit_the_visible_gpus_are_skipped_with_a_reason(script):
    assert script.plan_sizes([1, 2], "cuda", 2) == ([1, 2], {})
    sizes, skipped = script.plan_sizes([1, 2, 4], "cuda", 1)
    assert sizes == [1] and set(skipped) == {2, 4}
    assert skipped[2] == "needs 2 CUDA devices (one per rank) but 1 is visible"
    assert script.plan_sizes([1, 2], "cpu", 0) == ([1, 2], {})


def test_token_mismatches_names_differing_and_missing_requests(script):
    ref = {"a": [1, 2], "b": [3]}
    assert script.token_mismatches(ref, dict(ref)) == []
    assert script.token_mismatches(ref, {"a": [1, 2], "b": [4], "c": [5]}) == ["b", "c"]


def test_dry_run_on_cpu_reports_throughput_and_skips(script, capsys, tmp_path):
    code = script.main(["--device", "cpu", "--preset", "tiny", "--sizes", "1", "--num-requests", "2",
                        "--max-tokens", "4", "--prompt-len", "16", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "reference" in out and (tmp_path / "tp1" / "summary.json").is_file()
    with pytest.raises(SystemExit):
        script.main(["--device", "cpu", "--sizes", "2"])


def test_no_cuda_device_is_reported_not_crashed(script, capsys, monkeypatch):
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: False)
    assert script.main(["--device", "cuda"]) == 1
    assert "no CUDA device visible" in capsys.readouterr().out
