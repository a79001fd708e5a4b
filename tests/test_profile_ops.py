"""``servelab profile-ops``: operator tables measured on this machine (CPU here, the tiny model) load
through servelab.sim.op_tables, at each TP degree the model splits into; a degree it cannot run is one
line and the rest is still profiled (docs/op-tables.md, "Make your own")."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from servelab.cli import profile_ops as po
from servelab.core.errors import ConfigError
from servelab.core.shapes import ModelShape
from servelab.exec import op_bench
from servelab.sim.op_tables import LAYER_OPS, find_op_tables, load_op_tables

REPO = Path(__file__).resolve().parents[1]
# the shipped tiny model, a small grid, few repeats: a couple of seconds
SMALL = ["model=tiny_code", "backend.device=cpu", "profile_ops.tokens=[1,2,4,8]", "profile_ops.repeats=2",
         "profile_ops.warmup=1", "profile_ops.prefill_tokens=[4]", "profile_ops.contexts=[16,32]",
         "profile_ops.decode_batches=[1,2]"]
TINY_CODE_SHAPE = ModelShape(num_layers=4, hidden_size=192, intermediate_size=512, num_heads=6, num_kv_heads=2,
                             head_dim=32, vocab_size=259)


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.read_text().splitlines()))


def test_tables_load_and_are_found(tmp_path):
    result = po.profile_ops([*SMALL, f"hydra.run.dir={tmp_path}/run"], quiet=True)
    folder = tmp_path / "run" / "cpu" / "tiny_code"  # hydra.run.dir / <hardware> / <model>
    assert result["folder"] == folder and result["warnings"] == []
    tables = load_op_tables(folder, shape=TINY_CODE_SHAPE, tp=1, dtype="float32")
    assert find_op_tables("cpu", TINY_CODE_SHAPE, 1, "float32", root=tmp_path / "run").folder == folder.resolve()
    assert tables.tp_degrees == (1,) and tables.allreduce_curve(1) is None
    for name in ("ops.csv", "ops_raw.csv"):  # the medians, repaired and raw: all positive
        rows = _rows(folder / name)
        assert [int(r["tokens"]) for r in rows] == [1, 2, 4, 8]
        assert all(float(r[op]) > 0 for r in rows for op in op_bench.OP_COLUMNS)
    assert all(tables.op_curve(1, op)(8) > 0 for op in LAYER_OPS) and tables.layer_curve(1)(4) > 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["source"]["tool"] == "servelab profile-ops" and manifest["time_unit"] == "us"
    ops = manifest["tables"]["ops"]
    assert ops["repeats"] == 2 and "isotonic" in ops["conversion"]["monotone"]
    assert manifest["shape"]["hidden_size"] == 192 and manifest["dtype"] == "float32"
    attention = _rows(folder / "attention.csv")  # prefill 4 x {4, 16, 32}, decode {1, 2} x {16, 32}
    assert {(r["phase"], r["batch_size"], r["query_len"], r["context_len"]) for r in attention} == {
        ("prefill", "1", "4", "4"), ("prefill", "1", "4", "16"), ("prefill", "1", "4", "32"),
        ("decode", "1", "1", "16"), ("decode", "1", "1", "32"), ("decode", "2", "1", "16"), ("decode", "2", "1", "32")}
    assert all(r["backend"] == "torch" and float(r["attention"]) > 0 and float(r["store_kv"]) > 0 for r in attention)


def test_cli_profiles_each_tp_degree_and_names_the_one_it_cannot(tmp_path):
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "servelab"), "profile-ops", *SMALL,
                           "profile_ops.tp_degrees=[1,2,4]", "profile_ops.attention=false",
                           f"hydra.run.dir={tmp_path}/run"],
                          cwd=tempfile.mkdtemp(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    folder = tmp_path / "run" / "cpu" / "tiny_code"
    assert proc.stdout.strip().splitlines()[-1] == f"results: {folder}"
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "tp=4 not profiled" in warnings[0] and "num_attention_heads=6" in warnings[0] \
        and "splits at tp 1, 2" in warnings[0], proc.stderr
    tables = load_op_tables(folder, shape=TINY_CODE_SHAPE, tp=2)
    assert tables.tp_degrees == (1, 2) and not (folder / "attention.csv").exists()
    rows = _rows(folder / "ops.csv")
    qkv = {int(r["tp"]): float(r["qkv"]) for r in rows if r["tokens"] == "8"}
    assert set(qkv) == {1, 2} and all(v > 0 for v in qkv.values())
    assert find_op_tables("cpu", TINY_CODE_SHAPE, 2, "float32", root=tmp_path / "run") is not None
    assert "time_model=op_profile time_model.path=" in proc.stdout


def test_shards_are_the_column_and_row_parallel_slices():
    from servelab.core.model_spec import load_spec
    from servelab.assemble.executor import model_path

    import torch

    cfg = po.compose_with_run_dir(["model=tiny_code"])[0]
    spec = load_spec(model_path(cfg))
    bench = op_bench.build_layer(spec, 2, torch.float32, torch.device("cpu"), 16)
    attn, mlp = bench.layer.self_attn, bench.layer.mlp
    assert attn.qkv_proj.weight.shape == ((3 + 2 * 1) * 32, 192)  # 3 of 6 query heads, 1 of 2 KV heads
    assert attn.o_proj.weight.shape == (192, 3 * 32)  # row-parallel: k / tp inputs
    assert mlp.gate_up_proj.weight.shape == (2 * 256, 192) and mlp.down_proj.weight.shape == (192, 256)
    calls = op_bench.layer_op_calls(bench, 4)
    with torch.inference_mode():
        assert calls["o"]().shape == (4, 192)  # the partial sum, not all-reduced
        assert calls["act"]().shape == (4, 256)


def test_an_all_reduce_the_machine_cannot_run_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(op_bench, "all_reduce_ranks_here", lambda cuda: 1)  # a machine of one core
    result = po.profile_ops([*SMALL, "profile_ops.tp_degrees=[1,2]", "profile_ops.all_reduce=true",
                             "profile_ops.attention=false"], out=tmp_path, quiet=True)
    assert len(result["warnings"]) == 1
    assert result["warnings"][0].startswith("all-reduce at tp=2 not profiled: it needs 2 CPU cores") \
        and "it can run no tp > 1" in result["warnings"][0]
    assert capsys.readouterr().err.count("warning") == 1
    tables = result["tables"]
    assert tables.tp_degrees == (1, 2) and tables.allreduce_curve(2) is None  # the ops at tp 2 still measured
    assert not (tmp_path / "cpu" / "network").exists()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="gloo all-reduce at tp 2 needs 2 cores")
def test_gloo_all_reduce_at_tp_2(tmp_path):
    result = po.profile_ops(["model=tiny_code", "profile_ops.tokens=[1,4]", "profile_ops.repeats=2",
                             "profile_ops.warmup=1", "profile_ops.tp_degrees=[2]", "profile_ops.all_reduce=true",
                             "profile_ops.all_reduce_max_bytes=4096", "profile_ops.attention=false"],
                            out=tmp_path, quiet=True)
    assert result["warnings"] == [] and result["all_reduce_tp_degrees"] == [2]
    curve = result["tables"].allreduce_curve(2)
    assert curve is not None and curve.x_range == (1024, 4096) and curve(2048) > 0
    net = json.loads((tmp_path / "cpu" / "network" / "manifest.json").read_text())
    assert net["kind"] == "network" and net["tp_degrees"] == [2]


def test_bad_options_are_one_line():
    with pytest.raises(ConfigError, match="profile_ops.nope is not an option"):
        po.parse_options(["nope=1"])
    with pytest.raises(ConfigError, match=r"profile_ops.tp_degrees=\[0\] must be a list of positive integers"):
        po.parse_options(["tp_degrees=[0]"])
    with pytest.raises(ConfigError, match="profile_ops.repeats=0 must be >= 1"):
        po.parse_options(["repeats=0"])
    with pytest.raises(ConfigError, match="tp=3 not profiled: tensor_parallel_size=3 exceeds num_key_value_heads=2"):
        po.profile_ops(["model=tiny_code", "profile_ops.tp_degrees=[3]"], out="unused", quiet=True)
    assert po.parse_options(["tp_degrees=[2,1,2]", "hardware=h200"]).tp_degrees == [1, 2]


def test_grids():
    assert op_bench.token_grid(16) == [1, 2, 3, 4, 6, 8, 12, 16]
    assert op_bench.token_grid(20) == [1, 2, 3, 4, 6, 8, 12, 16, 20]
    assert op_bench.byte_grid(1024, 4096) == [1024, 1536, 2048, 3072, 4096]
    points = op_bench.attention_grid([4, 64], [1, 8], [16, 32], max_kv_tokens=128)
    assert ("prefill", 1, 64, 64) in points and ("prefill", 1, 4, 4) in points
    assert ("decode", 8, 1, 16) in points and ("decode", 8, 1, 32) not in points  # 256 KV tokens > 128


def test_gpu_check_script_dry_run(tmp_path, capsys):
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import gpu_check_ops
    finally:
        sys.path.remove(str(REPO / "experiments"))
    assert gpu_check_ops.main([str(tmp_path), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "all checks passed" in out and (tmp_path / "cpu" / "tiny_code" / "ops.csv").is_file()
    assert "model=llama3_8b" in gpu_check_ops.overrides_for(gpu_check_ops.argparse.Namespace(
        device="cuda", model="llama3_8b", max_tokens=16384, repeats=10, hardware=None))


def test_hardware_name_of_this_gpu(monkeypatch):
    import torch

    for gpu, name in (("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                      ("NVIDIA A100-SXM4-80GB", "a100_80gb"), ("NVIDIA A100-SXM4-40GB", "nvidia_a100_sxm4_40gb"),
                      ("NVIDIA L40S", "l40s")):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, gpu=gpu: gpu)
        assert po.machine_hardware_name(torch.device("cuda", 0)) == name
    assert po.machine_hardware_name(torch.device("cpu")) == "cpu"
