"""The prefix-cache reproductions (experiments/prefix_cache/) run end to end at a tiny size, and
their results say what the README tables are made of."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent.parent / "experiments" / "prefix_cache"


def _script(name: str):
    sys.path.insert(0, str(HERE))
    try:
        spec = importlib.util.spec_from_file_location(f"prefix_cache_{name}", HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(HERE))


@pytest.mark.slow
def test_eviction_and_admission_run_and_keep_tokens(tmp_path):
    small = ["--fractions", "1.0", "0.02", "--mooncake-requests", "40", "--chat-sessions", "12",
             "--real-requests", "10", "--real-blocks", "120", "--out", str(tmp_path)]
    eviction = _script("eviction").main(["--evictors", "lru", "arc", *small])
    for workload in eviction["sim"].values():
        full = [r for r in workload["rows"] if r["fraction"] == 1.0]
        assert len({r["hit_rate"] for r in full}) == 1  # nothing evicted: every evictor equal
        assert all(r["hit_rate"] <= workload["ideal_hit_rate"] + 1e-9 for r in workload["rows"])
    assert all(r["tokens_equal_to_lru"] and r["leaked_blocks"] == 0 for r in eviction["real"]["rows"].values())
    admission = _script("admission").main(small)
    assert all(r["tokens_equal_to_fcfs"] for r in admission["real"]["rows"].values())
    saved = json.loads((tmp_path / "admission" / "results.json").read_text())
    assert {r["stack"] for r in saved["sim"]["mooncake"]["rows"]} == {"fcfs", "lpm", "lpm + group_by_prefix"}
    assert (tmp_path / "eviction" / "eviction.png").is_file() and (tmp_path / "admission" / "section.md").is_file()


@pytest.mark.slow
def test_block_size_runs_auto_and_records_its_choice(tmp_path):
    res = _script("block_size").main(["--sizes", "16", "auto", "--trace-requests", "30", "--short-requests", "60",
                                      "--chat-sessions", "6", "--out", str(tmp_path)])
    for workload in res["sim"].values():
        auto = next(r for r in workload["rows"] if r["size"] == "auto")
        assert auto["block_size"] in (8, 16, 32, 64, 128) and "block_size=auto ->" in auto["auto_reason"]
