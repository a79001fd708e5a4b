"""``kv_connector`` is a kind (issue 44, item 2): selected by ``kv_connector=<name>`` from the kinds
table, ``kv_tiers=host`` its shorthand for ``tiers``, clusters build their hand-off through it, and
``multi`` composes several, so a prefill/decode replica can have a host tier and engine processes
their own tiers (tokens equal one engine's); a third-party connector plugs in by entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from servelab.api import LLM, compose
from servelab.assemble.stack import build_stack
from servelab.cluster.simulated import continued
from servelab.core.contexts import KVClusterLink, KVConnectorContext
from servelab.core.errors import ConfigError
from servelab.core.kinds import KINDS, build_order
from servelab.core.kv_connector import KVConnector
from servelab.core.request import Request
from servelab.kit.kv_connector_template import BODY
from servelab.kv.connectors import find_part, parts
from servelab.kv.pd.local import LocalKVConnector, LocalKVLink
from servelab.kv.tiers.store import TieredKVConnector
from servelab.plugins.kv_connectors.multi import MultiConnector

REPO = Path(__file__).resolve().parent.parent
SIM = ["backend=sim", "model=tiny_code", "logger=none", "progress=false"]
REAL = ["model=tiny", "clock=virtual", "time_model=roofline", "hardware=h100", "logger=none", "progress=false"]
TIERS = ["kv_tiers=host", "kv_tier_policy=write_through"]


def test_the_kind_is_a_row_of_the_table_built_after_what_its_context_names():
    spec = KINDS["kv_connector"]
    assert (spec.group, spec.default, spec.context) == ("kv_connector", "none", KVConnectorContext)
    order = [k.name for k in build_order()]
    assert order.index("allocator") < order.index("kv_connector") < order.index("scheduler")
    assert order.index("kv_tier_policy") < order.index("kv_connector")


def test_none_builds_no_connector_and_kv_tiers_is_the_shorthand_for_tiers():
    assert build_stack(compose(SIM)).engine.connector is None  # today's engine, fast-forward included
    store = build_stack(compose([*SIM, *TIERS])).engine.connector
    assert isinstance(store, TieredKVConnector)
    again = build_stack(compose([*SIM, *TIERS, "kv_connector=tiers"])).engine.connector
    assert isinstance(again, TieredKVConnector)  # selected and shorthand: one store, not two
    multi = build_stack(compose([*SIM, *TIERS, "kv_connector=multi", "kv_connector.connectors=[tiers]"]))
    assert isinstance(multi.engine.connector, MultiConnector)
    assert [type(p) for p in parts(multi.engine.connector)] == [TieredKVConnector]


@pytest.mark.parametrize("overrides, message", [
    # the options as a set: a plugin another test registered (ConfigStore is process-wide) may sit among them
    (["kv_connector=nope"], r"unknown kv_connector option 'nope';.* options: (?=.*\bmulti\b)(?=.*\bnone\b)"
                            r"(?=.*\bpd_local\b)(?=.*\bpd_process\b)"),
    (["kv_connector=tiers"], "kv_connector=tiers holds KV in tiers below the GPU and kv_tiers has none"),
    (["kv_connector=pd_sim"], "kv_connector=pd_sim hands a prompt's KV from a prefill replica"),
    (["kv_connector=multi"], "kv_connector=multi composes connectors: list them"),
])
def test_bad_selections_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        build_stack(compose([*SIM, *overrides]))
    assert "\n" not in str(err.value)


def test_an_unknown_connector_on_the_command_line_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, str(REPO / "run.py"), *SIM, "kv_connector=nope",
                           f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, WANDB_MODE="disabled"))
    assert done.returncode == 2
    assert "unknown kv_connector option 'nope'" in done.stderr and len(done.stderr.strip().splitlines()) == 1


class _Fake(KVConnector):
    def __init__(self, match: int, keeps: bool) -> None:
        self.match, self.keeps, self.loads, self.finished, self.sent = match, keeps, [], [], set()

    def get_num_new_matched_tokens(self, seq, num_computed_tokens):
        return self.match, False

    def update_state_after_alloc(self, seq, block_ids, num_external_tokens):
        self.loads.append((seq.id, num_external_tokens))

    def request_finished(self, seq, block_ids):
        self.finished.append(seq.id)
        return self.keeps

    def get_finished(self):
        sent, self.sent = self.sent, set()
        return sent, set()


def test_multi_loads_from_the_first_match_saves_to_all_and_frees_once_every_keeper_sent():
    from servelab.core.request import Sequence

    miss, hit, later = _Fake(0, keeps=True), _Fake(8, keeps=True), _Fake(16, keeps=False)
    multi = MultiConnector(MultiConnector.Config(), KVConnectorContext(), connectors=[miss, hit, later])
    seq = Sequence(Request("r", tuple(range(40)), 4))
    assert multi.get_num_new_matched_tokens(seq, 0) == (8, False)  # the first that matches, not the largest
    multi.update_state_after_alloc(seq, [0, 1, 2], 8)
    assert (miss.loads, hit.loads, later.loads) == ([], [("r", 8)], [])
    assert multi.request_finished(seq, [0, 1, 2]) is True
    assert miss.finished == hit.finished == later.finished == ["r"]  # saves go to every part
    miss.sent.add("r")
    assert multi.get_finished() == (set(), set())  # one keeper still reads the blocks
    hit.sent.add("r")
    assert multi.get_finished() == ({"r"}, set())


def _drain(engine) -> None:
    for _ in range(3000):
        if not engine.has_unfinished():
            engine.poll_connector()
            return
        if engine.step() is None:
            engine.sleep(0.001)
    raise AssertionError("no progress")


def _chats(vocab: int) -> list[Request]:
    """Prompts sharing a 3-block prefix, each after a long unrelated one that pushes it out of a small GPU pool."""
    shared = tuple((7 * j) % (vocab - 1) + 1 for j in range(48))
    out = []
    for i in range(4):
        flush = tuple((31 * i + 5 * j) % (vocab - 1) + 1 for j in range(350))
        out.append(Request(f"f{i}", flush, 2))
        out.append(Request(f"r{i}", shared + tuple((13 * i + j) % (vocab - 1) + 1 for j in range(4 + 3 * i)), 6 + i))
    return out


@pytest.mark.slow
def test_in_process_prefill_decode_with_host_tiers_on_both_sides_gives_one_engines_tokens():
    one = build_stack(compose(REAL))
    requests = _chats(one.executor.spec.vocab_size)
    ref = [one.engine.add_request(r, 0.0) for r in requests]
    _drain(one.engine)

    link = LocalKVLink()
    small = ["num_kv_blocks=24", *TIERS]  # a pool the prompts do not all fit: tiers store, then the GPU evicts
    prefill = build_stack(compose([*REAL, *small]), cluster=KVClusterLink(0, "prefill", link, "pd_local"))
    decode = build_stack(compose([*REAL, *small]), cluster=KVClusterLink(1, "decode", link, "pd_local"))
    for stack in (prefill, decode):  # the hand-off first (it owns the handed-off prompt), then the tier
        assert [type(p) for p in parts(stack.engine.connector)] == [LocalKVConnector, TieredKVConnector]
    for r in requests:  # one at a time: each prompt after the first loads the shared prefix from the host tier
        pseq = prefill.engine.add_request(replace(r, max_tokens=1), 0.0)
        _drain(prefill.engine)
        decode.engine.add_sequence(continued(pseq, r))
        _drain(decode.engine)
        prefill.engine.poll_connector()

    got = {s.id: list(s.output_token_ids) for s in decode.engine.sequences.values()}
    assert got == {s.id: list(s.output_token_ids) for s in ref}
    assert decode.engine.totals.prefill_tokens == 0  # every prompt came over the hand-off
    assert find_part(prefill.engine.connector, TieredKVConnector).hit_blocks[0] > 0  # the host tier served
    assert find_part(decode.engine.connector, TieredKVConnector).written_blocks[0] > 0  # and stored on decode
    assert prefill.engine.allocator.leaked_blocks() == decode.engine.allocator.leaked_blocks() == 0
    assert not link.held


def test_a_simulated_prefill_decode_cluster_with_host_tiers_runs_every_request(tmp_path):
    chat = [*SIM, "workload=chat_sessions", "workload.num_sessions=8", "workload.session_rate=4.0",
            "workload.think_time_s=1.0", "workload.num_system_prompts=2", "workload.system_prompt_len.min=32",
            "workload.system_prompt_len.max=96", "workload.user_len.max=48", "workload.output_len.max=32",
            "workload.turns.min=2", "workload.turns.max=3", "num_kv_blocks=40", "cluster.prefill_replicas=1",
            "cluster.decode_replicas=2"]
    LLM([*chat, *TIERS]).run(tmp_path / "tiers")
    LLM(chat).run(tmp_path / "plain")
    tiers, plain = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("tiers", "plain"))
    assert tiers["num_finished"] == plain["num_finished"] == tiers["num_requests"]
    assert tiers["num_kv_transfers"] == plain["num_kv_transfers"] > 0 and tiers["leaked_blocks"] == 0
    prefill = tiers["per_replica"][0]
    assert prefill["role"] == "prefill" and prefill["kv_tier_hit_rate"] > 0  # later turns load from the host
    assert all("kv_tier_hit_rate" in p for p in tiers["per_replica"])


def _tokens(out: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in map(json.loads, (out / "requests.jsonl").open())}


@pytest.mark.slow
def test_engine_processes_with_their_own_tiers_give_one_engines_tokens(tmp_path):
    small = ["model=tiny_code", "workload.num_requests=6", "workload.rate=50", "workload.max_tokens=16",
             "logger=none", "progress=false"]
    LLM(small).run(tmp_path / "one")
    disk = [*small, "kv_tiers=host_disk", "kv_tier_policy=write_back", f"kv_tiers.disk_dir={tmp_path / 'tier'}"]
    LLM([*disk, "cluster.replicas=2"]).run(tmp_path / "two")
    LLM([*small, *TIERS, "cluster.prefill_replicas=1", "cluster.decode_replicas=1"]).run(tmp_path / "pd")
    assert _tokens(tmp_path / "two") == _tokens(tmp_path / "one") == _tokens(tmp_path / "pd")
    for run in ("two", "pd"):
        summary = json.loads((tmp_path / run / "summary.json").read_text())
        assert summary["leaked_blocks"] == 0 and all("kv_tier_hit_rate" in p for p in summary["per_replica"])


def test_the_guide_shows_the_new_plugin_skeleton():
    page = (REPO / "docs" / "write-a-kv-connector.md").read_text()
    from string import Template

    assert Template(BODY).substitute(Class="RemoteStore", name="remote_store") in page


@pytest.fixture(scope="module")
def store_package(tmp_path_factory) -> Path:
    """``servelab new-plugin kv_connector shelf``'s package, with installed metadata (an entry point of
    the ``servelab`` group) as pip would leave it: a third party's remote store, servelab untouched."""
    root = tmp_path_factory.mktemp("shelf")
    made = subprocess.run([sys.executable, str(REPO / "run.py"), "new-plugin", "kv_connector", "shelf", "--dir",
                           str(root)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    site = root / "site"
    site.mkdir()
    (site / "servelab_shelf").symlink_to(root / "shelf" / "servelab_shelf")
    info = site / "servelab_shelf-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: servelab-shelf\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[servelab]\nshelf = servelab_shelf\n")
    return site


def _servelab(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
               WANDB_MODE="disabled")
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_a_third_party_store_from_an_entry_point_is_selected_and_passes_the_kit(store_package, tmp_path):
    check = _servelab(store_package, "check-plugin", "kv_connector=shelf")
    assert check.returncode == 0, check.stdout + check.stderr[-2000:]
    assert "kv_connector=shelf: PASS" in check.stdout
    assert "real model (model=tiny, greedy): 0 prompt tokens" not in check.stdout  # it did load

    outs = {}
    for label, extra in (("shelf", ["kv_connector=shelf"]), ("none", [])):
        done = _servelab(store_package, "model=tiny_code", "workload=chat_sessions", "workload.num_sessions=3",
                         "workload.system_prompt_len.min=32", "workload.system_prompt_len.max=64",
                         "workload.user_len.max=32", "workload.turns.min=2", "workload.turns.max=2",
                         "workload.session_rate=20", "workload.think_time_s=0.2",
                         "workload.output_len.max=8", "logger=none", "progress=false", *extra,
                         f"hydra.run.dir={tmp_path / label}")
        assert done.returncode == 0, done.stderr[-2000:]
        outs[label] = _tokens(tmp_path / label)
    assert outs["shelf"] == outs["none"]
    summary = json.loads((tmp_path / "shelf" / "summary.json").read_text())
    assert summary["prefill_tokens_computed"] < json.loads(
        (tmp_path / "none" / "summary.json").read_text())["prefill_tokens_computed"]  # later turns loaded


def test_the_kit_catches_a_store_that_loads_without_copying_the_bytes(tmp_path):
    from servelab.kit.kv_connector_template import TEMPLATE
    from servelab.testing import check_plugin, registry_with
    import importlib.util

    code = TEMPLATE.substitute(Class="Forgetful", name="forgetful", doc="a store that forgets to copy",
                               group="kv_connector", guide="docs/write-a-kv-connector.md")
    code = code.replace("                pool.data[:, :, block].copy_(data)\n", "                pass\n")
    path = tmp_path / "servelab_forgetful.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("servelab_forgetful", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    report = check_plugin("kv_connector", "forgetful", registry=registry_with(module))
    assert report.contracts_broken == ["outputs"], report
