"""KV tiers on the real engine (model=tiny, float32 on CPU): the host tier is a second block pool,
the disk tier memory-mapped files; a hit below the GPU copies the blocks back, and the tokens equal
a run without tiers."""

from __future__ import annotations

import functools
import json

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

# chats whose turns repeat the conversation, over a GPU pool that cannot keep them: the tiers serve
CHATS = ("model=tiny", "clock=virtual", "time_model=roofline", "hardware=h100", "num_kv_blocks=24", "block_size=8",
         "workload=chat_sessions", "workload.num_sessions=6", "workload.session_rate=4.0", "workload.think_time_s=2.0",
         "workload.num_system_prompts=2", "workload.system_prompt_len.min=16", "workload.system_prompt_len.max=48",
         "workload.user_len.max=24", "workload.output_len.max=12", "workload.turns.min=2", "workload.turns.max=3",
         "max_model_len=256", "logger=none", "progress=false")


def _blocks_gib(n: int) -> float:
    return n * _bytes_per_block() / 2**30


@functools.cache
def _bytes_per_block() -> int:
    return build_stack(compose(*CHATS)).executor.bytes_per_block


def _tokens(tmp_path, name, *overrides):
    out = tmp_path / name
    result = run_job(compose(*CHATS, *overrides), out)
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return {r["id"]: r["output_token_ids"] for r in lines}, result.summary


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _tokens(tmp_path_factory.mktemp("plain"), "plain", "allocator.prefix_caching=true")[0]


def test_a_host_tier_hit_copies_blocks_back_and_tokens_equal_a_run_without_tiers(tmp_path, plain):
    host, summary = _tokens(tmp_path, "host", "kv_tiers=host", "kv_tier_policy=write_back")
    assert summary["kv_tier_host_hit_rate"] > 0
    assert host == plain


def test_a_disk_tier_holds_real_bytes_in_its_file_and_tokens_equal_a_run_without_tiers(tmp_path, plain):
    small = _blocks_gib(6)  # the host tier overflows into the disk tier
    disk, summary = _tokens(tmp_path, "disk", "kv_tiers=host_disk", "kv_tier_policy=write_through",
                            f"kv_tiers.tiers.0.capacity_gib={small}", f"kv_tiers.tiers.1.capacity_gib={_blocks_gib(400)}",
                            f"kv_tiers.disk_dir={tmp_path / 'tier_files'}")
    assert summary["kv_tier_disk_hit_rate"] > 0
    assert summary["kv_tier_disk_read_bytes"] > 0  # read back from the file
    assert not (tmp_path / "tier_files").exists()  # the run's end removed its files (and the folder it made)
    assert disk == plain


def test_a_disk_tier_goes_under_the_run_folder_unless_told_otherwise_and_is_removed_at_the_end(tmp_path):
    _, summary = _tokens(tmp_path, "run", "kv_tiers=host_disk", "kv_tier_policy=write_through",
                         f"kv_tiers.tiers.0.capacity_gib={_blocks_gib(6)}",
                         f"kv_tiers.tiers.1.capacity_gib={_blocks_gib(400)}")
    assert summary["kv_tier_disk_written_bytes"] > 0
    assert (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / "kv_tier_disk").exists()
    stack = build_stack(compose(*CHATS, "kv_tiers=host_disk", "kv_tier_policy=write_back"))  # no run folder
    folder = stack.engine.connector.pools.paths[0].parent  # a temporary folder of its own
    assert folder.is_dir()
    stack.executor.shutdown()
    assert not folder.exists()


def test_a_disk_tier_needs_a_writable_folder(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match="kv_tiers.disk_dir=.*not writable") as err:
        build_stack(compose(*CHATS, "kv_tiers=host_disk", "kv_tier_policy=write_back",
                            f"kv_tiers.tiers.1.capacity_gib={_blocks_gib(8)}", f"kv_tiers.disk_dir={blocker / 'sub'}"))
    assert "\n" not in str(err.value)


def test_prefetched_blocks_come_back_with_the_same_tokens(tmp_path, plain):
    early, summary = _tokens(tmp_path, "prefetch", "kv_tiers=host", "kv_tier_policy=write_back_prefetch")
    assert summary["kv_tier_prefetch_used_blocks"] > 0
    assert early == plain
