"""KV tiers below the GPU (kv_tiers=..., kv_tier_policy=...): the simulator's tiered store."""

from __future__ import annotations

import json

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

# 70B at TP 4 on a GPU pool far below the chat's working set: the tiers get hits
CHAT = ("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "workload=chat_sessions",
        "workload.num_sessions=24", "workload.session_rate=2.0", "workload.think_time_s=4.0", "num_kv_blocks=1200",
        "logger=none")


def _run(tmp_path, name, *overrides):
    out = tmp_path / name
    run_job(compose(*CHAT, *overrides), out)
    return json.loads((out / "summary.json").read_text()), (out / "requests.jsonl").read_bytes()


def test_a_preset_with_tiers_picks_write_back_unless_a_policy_is_named():
    assert compose(*CHAT, "kv_tiers=host_disk").kv_tier_policy.name == "write_back"
    assert compose(*CHAT, "kv_tiers=host", "kv_tier_policy=none").kv_tier_policy.name == "none"
    assert compose(*CHAT, "kv_tier_policy=write_through", "kv_tiers=host").kv_tier_policy.name == "write_through"
    assert compose(*CHAT).kv_tier_policy.name == "none"  # no tiers: nothing to store


def test_policy_none_is_todays_engine_exactly(tmp_path):
    plain = _run(tmp_path, "plain", "allocator.prefix_caching=true")
    tiers = _run(tmp_path, "none", "kv_tiers=host_disk", "kv_tier_policy=none")
    assert "kv_tiers" not in tiers[0]  # no store was built
    assert tiers[1] == plain[1]
    assert tiers[0] == plain[0]


def test_write_back_spills_evictions_and_loads_them_back(tmp_path):
    summary, _ = _run(tmp_path, "wb", "kv_tiers=host", "kv_tier_policy=write_back")
    host, = summary["kv_tiers"]
    assert host["kind"] == "host" and host["written_bytes"] > 0 and host["hit_blocks"] > 0
    assert 0 < summary["kv_tier_host_hit_rate"] == host["hit_rate"] <= 1
    assert host["read_bytes"] == host["hit_blocks"] * summary["bytes_per_block"]
    assert summary["kv_tier_load_added_s"] + summary["kv_tier_load_hidden_s"] > 0
    assert summary["kv_tier_books_broken"] == 0 and summary["leaked_blocks"] == 0
    assert summary["num_finished"] == summary["num_requests"]


def test_every_prompt_token_is_a_gpu_hit_a_tier_load_or_computed(tmp_path):
    """A request whose prefix a tier loads still counts its GPU prefix hit (the hit rate is not
    lowered by the tier), and nothing is counted twice."""
    summary, records = _run(tmp_path, "wb", "kv_tiers=host", "kv_tier_policy=write_back")
    rows = [json.loads(line) for line in records.decode().splitlines()]
    prompt = sum(r["prompt_len"] for r in rows)
    gpu_hits = sum(r["num_cached_prompt_tokens"] for r in rows)
    loaded = sum(t["hit_blocks"] for t in summary["kv_tiers"]) * summary["block_size"]
    assert loaded > 0 and summary["recomputed_tokens"] == 0
    assert gpu_hits + loaded + summary["prefill_tokens_computed"] == prompt


def test_host_tier_cuts_prefill_against_gpu_only(tmp_path):
    gpu, _ = _run(tmp_path, "gpu", "allocator.prefix_caching=true")
    host, _ = _run(tmp_path, "host", "kv_tiers=host", "kv_tier_policy=write_back")
    assert host["prefill_tokens_computed"] < gpu["prefill_tokens_computed"]


def test_serialised_loads_add_their_whole_time(tmp_path):
    summary, _ = _run(tmp_path, "ser", "kv_tiers=host", "kv_tier_policy=write_back", "kv_tiers.load=serialize",
                      "kv_tiers.tiers.0.read_gb_s=1")
    assert summary["kv_tier_load_added_s"] > 0 and summary["kv_tier_load_hidden_s"] == 0
    split = summary["kv_tier_ttft_split_ms"]
    assert split["load"] > 0 and split["queueing"] >= 0 and split["prefill_and_rest"] > 0
    assert split["queueing"] + split["load"] + split["prefill_and_rest"] == pytest.approx(summary["ttft_ms"]["mean"])


def test_prefetch_moves_serialised_loads_off_the_steps_and_computes_the_same(tmp_path):
    slow = ("kv_tiers=host", "kv_tiers.load=serialize", "kv_tiers.tiers.0.read_gb_s=1")
    plain, _ = _run(tmp_path, "wb", *slow, "kv_tier_policy=write_back")
    early, _ = _run(tmp_path, "pf", *slow, "kv_tier_policy=write_back_prefetch")
    assert plain["kv_tier_prefetch_blocks"] == 0  # write_back never prefetches: its figures as before
    assert early["kv_tier_prefetch_used_blocks"] > 0
    assert early["kv_tier_prefetch_blocks"] == early["kv_tier_prefetch_used_blocks"] + \
        early["kv_tier_prefetch_wasted_blocks"]
    assert early["kv_tier_prefetch_link_s"] > 0
    assert early["kv_tier_load_added_s"] < plain["kv_tier_load_added_s"]
    assert early["prefill_tokens_computed"] == plain["prefill_tokens_computed"]  # the same blocks come back
    assert early["kv_tier_books_broken"] == 0 and early["leaked_blocks"] == 0


def test_requests_queued_for_gpu_blocks_are_prefetched_and_their_staging_is_released(tmp_path):
    from servelab.kv.tiers import store as kv_tier_store

    queued = []

    class Counting(kv_tier_store.TieredKVConnector):
        def prefetch_queued(self):
            before = self.prefetched_blocks
            super().prefetch_queued()
            queued.append(self.prefetched_blocks - before)

    cfg = compose(*CHAT, "workload.session_rate=20", "num_kv_blocks=300", "kv_tiers=host",
                  "kv_tier_policy=write_back_prefetch", "kv_tier_policy.max_staged=64")
    stack = build_stack(cfg)
    stack.engine.connector.__class__ = Counting
    summary = run_job(cfg, tmp_path / "busy", stack=stack).summary
    assert sum(queued) > 0  # prefetched while the requests waited in the queue, not only at admission
    assert summary["kv_tier_prefetch_used_blocks"] > 0 and summary["kv_tier_prefetch_wasted_blocks"] >= 0
    assert summary["kv_tier_prefetch_blocks"] > 64  # staged blocks no request wants any more free their room
    assert summary["kv_tier_books_broken"] == 0 and summary["leaked_blocks"] == 0
    assert summary["num_finished"] == summary["num_requests"]


def test_max_staged_bounds_the_prefetch_and_zero_is_refused(tmp_path):
    pf = ("kv_tiers=host", "kv_tiers.load=serialize", "kv_tier_policy=write_back_prefetch")
    capped, _ = _run(tmp_path, "cap", *pf, "kv_tier_policy.max_staged=1")
    full, _ = _run(tmp_path, "full", *pf)
    assert 0 < capped["kv_tier_prefetch_blocks"] < full["kv_tier_prefetch_blocks"]
    with pytest.raises(ConfigError, match="max_staged"):
        build_stack(compose(*CHAT, "kv_tiers=host", "kv_tier_policy=write_back_prefetch",
                            "kv_tier_policy.max_staged=0"))


def test_a_small_host_tier_demotes_to_disk(tmp_path):
    summary, _ = _run(tmp_path, "disk", "kv_tiers=host_disk", "kv_tier_policy=write_through",
                      "kv_tiers.tiers.0.capacity_gib=0.5")
    host, disk = summary["kv_tiers"]
    assert host["max_held_blocks"] <= host["capacity_blocks"] < host["written_bytes"] // summary["bytes_per_block"]
    assert disk["written_bytes"] > 0 and host["dropped_blocks"] == 0


@pytest.mark.parametrize("overrides, words", [
    (("kv_tiers=host", "kv_tiers.tiers.0.capacity_gib=0.0001"), "kv_tiers.tiers.0.capacity_gib=0.0001: below one"),
    (("kv_tiers=host", "kv_tiers.tiers.0.shared=true"), "kv_tiers.tiers.0.shared=true"),
    (("kv_tiers=none",), "kv_tier_policy=write_back stores KV below the GPU but kv_tiers has no tier"),
    (("kv_tiers=host", "allocator.prefix_caching=false"), "allocator.prefix_caching=true"),
])
def test_bad_tier_config_is_one_line(overrides, words):
    cfg = compose(*CHAT, "kv_tier_policy=write_back", *overrides)
    with pytest.raises(ConfigError) as err:
        build_stack(cfg)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_real_engine_over_ranks_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="one worker in this process") as err:
        build_stack(compose("kv_tiers=host", "kv_tier_policy=write_back", "model=tiny", "backend=tp",
                            "tensor_parallel_size=2", "num_kv_blocks=32"))
    assert "\n" not in str(err.value)


def test_the_banner_and_the_summary_table_show_the_tiers(tmp_path):
    from rich.console import Console

    from servelab.results.banner import banner_lines
    from servelab.results.report import print_summary

    cfg = compose(*CHAT, "kv_tiers=host_disk", "kv_tiers.tiers.0.capacity_gib=0.5")
    stack = build_stack(cfg)
    rows = dict(banner_lines(cfg, stack, tmp_path, "off"))
    assert rows["KV tiers"].startswith("kv_tier_policy=write_back over host ") and "disk " in rows["KV tiers"]
    summary = run_job(cfg, tmp_path / "run", stack=stack).summary
    console = Console(record=True, width=120)
    print_summary(summary, str(tmp_path), console)
    text = console.export_text()
    host, disk = summary["kv_tiers"]
    stored = host["written_bytes"] // summary["bytes_per_block"]
    assert "kv_tiers.host hit / loaded / stored" in text and f"/ {host['hit_blocks']:,} / {stored:,}" in text
    assert "kv_tier_hit_rate" in text and "kv_tier_load_added_s / hidden_s" in text
    unused = compose(*CHAT, "kv_tiers=host", "kv_tier_policy=none")
    line = dict(banner_lines(unused, build_stack(unused), tmp_path, "off"))["KV tiers"]
    assert line == "kv_tier_policy=none stores nothing: the host tier stays unused (kv_tiers=host)"
