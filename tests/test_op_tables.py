"""servelab.sim.op_tables: the shipped measured operator tables (Vidur's public profiles) load and
validate, curves interpolate monotonically, bad tables fail with one line naming file, line and column."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

import servelab
from servelab.core.errors import ConfigError
from servelab.core.shapes import ModelShape
from servelab.sim.op_tables import (FORMAT, LAYER_OPS, PACKAGED_OP_TABLES, Curve, available_op_tables,
                                    find_op_tables, isotonic, load_op_tables)

REPO = Path(__file__).resolve().parents[1]
SHIPPED = {("a100_80gb", "llama2_7b"), ("a100_80gb", "llama2_70b"), ("a100_80gb", "llama3_8b"),
           ("a100_80gb", "llama3_70b"), ("h100", "llama2_7b"), ("h100", "llama2_70b")}


def catalogue_shape(name: str) -> ModelShape:
    m = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())["model"]
    return ModelShape(m["num_hidden_layers"], m["hidden_size"], m["intermediate_size"], m["num_attention_heads"],
                      m["num_key_value_heads"], m["hidden_size"] // m["num_attention_heads"], m["vocab_size"])


# ---- the shipped tables ----------------------------------------------------------------------

def test_shipped_tables_load_and_validate():
    rows = available_op_tables()
    assert {(r["hardware"], r["model"]) for r in rows} == SHIPPED
    for r in rows:
        tables = load_op_tables(r["folder"])
        assert tables.tp_degrees == (1, 2, 4, 8) and set(LAYER_OPS) <= set(tables.ops)
        assert tables.dtype == "float16" and "bfloat16" in tables.serves_dtypes
        for tp in tables.tp_degrees:
            layer = tables.layer_curve(tp)
            assert np.all(np.diff(layer.y) >= 0) and layer.x_range[0] == 1 and layer.x_range[1] >= 4096
            ar = tables.allreduce_curve(tp)
            assert (ar is None) == (tp == 1)
        d = tables.describe()
        json.dumps(d)
        assert d["source"]["repo"] == "https://github.com/microsoft/vidur" and len(d["source"]["commit"]) == 40
        assert d["files"]["ops"].startswith("servelab/data/op_tables/")


@pytest.mark.parametrize("hardware,model", sorted(SHIPPED))
def test_catalogue_models_find_their_tables(hardware, model):
    shape = catalogue_shape(model)
    tables = find_op_tables(hardware, shape, 4, "bfloat16")
    assert tables is not None and tables.model == model  # Llama-3-70B gets its own table, not Llama-2-70B's
    assert tables.hardware == hardware


def test_layer_time_is_sane_on_h100_70b_tp4():
    tables = find_op_tables("h100", catalogue_shape("llama2_70b"), 4, "bfloat16")
    layer = tables.layer_curve(4)
    one, big = layer(1), layer(4096)
    assert 10e-6 < one < 10e-3 and 10e-6 < big < 10e-3 and big > 5 * one
    assert 5e-6 < tables.allreduce_curve(4)(8192 * 2) < 1e-3


def test_host_and_network_tables():
    a100 = find_op_tables("a100_80gb", catalogue_shape("llama2_7b"), 1, "bfloat16")
    host = a100.host_curve()
    assert host.x_range == (8, 128) and 0.5e-3 < host(32) < 20e-3 and host(128) > host(8)
    assert a100.host_curve(4) is host and host.label == "host tp=1"  # the nearest measured TP
    h100 = find_op_tables("h100", catalogue_shape("llama2_7b"), 2, "bfloat16")
    assert h100.host_curve() is None
    ar = h100.allreduce_curve(2)
    per_token = ar.with_x_scale(4096 * 2)
    assert per_token(100) == pytest.approx(ar(100 * 4096 * 2), rel=1e-12)


def test_find_matches_by_shape_tp_and_dtype():
    shape = catalogue_shape("llama2_70b")
    assert find_op_tables("h100", shape, 8, "float16") is not None
    assert find_op_tables("h100", shape, 16, "bfloat16") is None
    assert find_op_tables("l40s", shape, 4, "bfloat16") is None
    assert find_op_tables("h100", shape, 4, "float32") is None
    assert find_op_tables("h100", catalogue_shape("llama3_8b"), 1, "bfloat16") is None  # only on a100
    other = ModelShape(80, 8192, 22016, 64, 8, 128, 32000)  # CodeLlama-34B's FFN: not shipped
    assert find_op_tables("h100", other, 4, "bfloat16") is None
    # vocabulary and layer count may differ: the tables are per layer
    assert find_op_tables("h100", ModelShape(40, 8192, 28672, 64, 8, 128, 50000), 4, "bfloat16") is not None
    assert find_op_tables("h100", shape, 4, "bfloat16") is find_op_tables("h100", shape, 4, "bfloat16")  # cached


def test_wrong_shape_is_one_line_naming_the_manifest_key():
    folder = PACKAGED_OP_TABLES / "h100" / "llama2_70b"
    with pytest.raises(ConfigError) as err:
        load_op_tables(folder, shape=catalogue_shape("llama2_7b"))
    msg = str(err.value)
    assert "\n" not in msg and "manifest.json" in msg and "'shape.hidden_size'" in msg and "8192" in msg
    assert "tables exist for:" in msg
    with pytest.raises(ConfigError, match="tensor_parallel_size=16"):
        load_op_tables(folder, tp=16)


def test_tables_resolve_through_the_installed_package(monkeypatch, tmp_path):
    assert PACKAGED_OP_TABLES == Path(servelab.__file__).resolve().parent / "data" / "op_tables"
    assert (PACKAGED_OP_TABLES / "LICENSE-vidur").read_text().lstrip().startswith("MIT License")
    monkeypatch.chdir(tmp_path)  # not found through the working directory
    assert find_op_tables("h100", catalogue_shape("llama2_7b"), 1, "bfloat16") is not None
    # every shipped file is in the package data a wheel installs
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["servelab"]
    pkg = Path(servelab.__file__).resolve().parent
    shipped = {p for p in PACKAGED_OP_TABLES.rglob("*") if p.is_file()}
    covered = {p for g in globs for p in pkg.glob(g)}
    assert shipped and shipped <= covered, sorted(map(str, shipped - covered))
    assert sum(p.stat().st_size for p in shipped) < 1.5e6


# ---- curves ----------------------------------------------------------------------------------

def test_curve_is_exact_at_points_and_monotone():
    x = [1, 2, 4, 8, 64, 512, 4096]
    y = [5e-6, 5e-6, 6e-6, 9e-6, 30e-6, 200e-6, 1.5e-3]
    c = Curve(x, y, source="t.csv")
    for xi, yi in zip(x, y):
        assert c(xi) == pytest.approx(yi, rel=1e-12)
    d = c.dense(4096)
    assert d[0] == 0 and np.all(np.diff(d) >= 0)
    assert c(0) == 0 and c(0.5) == pytest.approx(5e-6)  # flat below the first point


def test_curve_interpolates_in_log_log():
    c = Curve([1, 4], [1.0, 2.0])
    assert c(2) == pytest.approx(2 ** 0.5)  # y = x^0.5, not the linear 4/3
    p = Curve([10, 1000], [1e-5, 1e-3])
    assert p(100) == pytest.approx(1e-4)
    z = Curve([1, 3], [0.0, 2.0])  # a zero time: linear in that segment
    assert z(2) == pytest.approx(1.0)


def test_isotonic_repairs_dips_and_keeps_monotone_data():
    assert list(isotonic([1, 2, 3])) == [1, 2, 3]
    fixed = isotonic([1.0, 3.0, 2.0, 4.0])
    assert list(fixed) == [1.0, 2.5, 2.5, 4.0]
    c = Curve([1, 2, 3, 4], [1.0, 3.0, 2.0, 4.0])
    assert list(c.raw_y) == [1.0, 3.0, 2.0, 4.0] and c(3) == pytest.approx(2.5)


def test_extrapolation_warns_once_naming_the_file(caplog):
    c = Curve([1, 100], [1e-6, 1e-4], source="/somewhere/extrap_once.csv", label="tp=1 qkv", x_name="tokens")
    with caplog.at_level(logging.WARNING, logger="servelab.sim.op_tables"):
        assert c(200) == pytest.approx(2e-4)  # proportional past the last point
        c(300)
        c.dense(1000)
        c(50)  # inside: no warning
    warned = [r.getMessage() for r in caplog.records if r.name == "servelab.sim.op_tables"]
    assert len(warned) == 1
    assert "/somewhere/extrap_once.csv" in warned[0] and "1..100" in warned[0] and "tokens" in warned[0]


def test_dense_agrees_with_call():
    layer = find_op_tables("a100_80gb", catalogue_shape("llama3_8b"), 2, "bfloat16").layer_curve(2)
    d = layer.dense(40000)  # past 32768: extrapolated
    for i in (0, 1, 2, 3, 7, 9, 100, 1001, 4095, 4096, 32768, 39999, 40000):
        assert d[i] == pytest.approx(layer(i), rel=1e-12, abs=0)


# ---- bad tables ------------------------------------------------------------------------------

def write_tables(folder: Path, rows: list[list], header: list[str] | None = None, **manifest) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    header = header or ["tp", "tokens", *LAYER_OPS]
    m = {"format": FORMAT, "kind": "compute", "hardware": "testgpu", "model": "toy",
         "shape": {"hidden_size": 64, "intermediate_size": 128, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16},
         "dtype": "float16", "tp_degrees": [1], "time_unit": "us",
         "tables": {"ops": {"file": "ops.csv", "x": "tokens", "columns": list(LAYER_OPS)}}, **manifest}
    (folder / "manifest.json").write_text(json.dumps(m))
    (folder / "ops.csv").write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return folder


def good_rows() -> list[list]:
    return [[1, t] + [10.0 * (1 + t / 64)] * len(LAYER_OPS) for t in (1, 8, 64, 512)]


def toy_shape() -> ModelShape:
    return ModelShape(2, 64, 128, 4, 2, 16, 100)


def test_a_good_tiny_table_loads_and_is_found(tmp_path):
    folder = write_tables(tmp_path / "testgpu" / "toy", good_rows())
    tables = find_op_tables("testgpu", toy_shape(), 1, "float16", root=tmp_path)
    assert tables is not None and tables.allreduce_curve(2) is None and tables.host_curve() is None
    assert tables.layer_curve(1)(1) == pytest.approx(9 * 10.0 * (1 + 1 / 64) * 1e-6)
    assert find_op_tables("testgpu", toy_shape(), 1, "bfloat16", root=tmp_path) is None  # serves float16 only
    assert load_op_tables(folder, shape=toy_shape(), tp=1, dtype="float16") is tables


def _error(folder: Path) -> str:
    with pytest.raises(ConfigError) as err:
        load_op_tables(folder)
    msg = str(err.value)
    assert "\n" not in msg and str(folder / "ops.csv") in msg
    return msg


def test_missing_column_names_file_column_and_header(tmp_path):
    header = ["tp", "tokens", *[op for op in LAYER_OPS if op != "qkv"]]
    rows = [r[:3] + r[4:] for r in good_rows()]
    msg = _error(write_tables(tmp_path / "t", rows, header=header))
    assert "line 1 (header)" in msg and "column 'qkv'" in msg and "missing" in msg


def test_negative_time_names_file_column_and_row(tmp_path):
    rows = good_rows()
    rows[1][2 + LAYER_OPS.index("o")] = -5
    msg = _error(write_tables(tmp_path / "t", rows))
    assert "line 3" in msg and "column 'o'" in msg and "negative" in msg


def test_non_monotone_tokens_name_file_column_and_row(tmp_path):
    rows = good_rows()
    rows[2][1] = 4  # 1, 8, 4, 512
    msg = _error(write_tables(tmp_path / "t", rows))
    assert "line 4" in msg and "column 'tokens'" in msg and "does not increase" in msg and "line 3" in msg
    rows = good_rows()
    rows[0][1] = -1
    msg = _error(write_tables(tmp_path / "u", rows))
    assert "line 2" in msg and "column 'tokens'" in msg and "> 0" in msg


def test_non_numeric_cell_names_file_column_and_row(tmp_path):
    rows = good_rows()
    rows[0][2 + LAYER_OPS.index("down")] = "fast"
    msg = _error(write_tables(tmp_path / "t", rows))
    assert "line 2" in msg and "column 'down'" in msg and "'fast' is not a number" in msg


def test_a_large_drop_is_an_error_a_small_one_is_repaired(tmp_path):
    rows = good_rows()
    col = 2 + LAYER_OPS.index("gate_up")
    rows[2][col] = rows[1][col] * 0.5  # falls 50% as tokens grow
    msg = _error(write_tables(tmp_path / "big", rows))
    assert "line 4" in msg and "column 'gate_up'" in msg and "50%" in msg and "line 3" in msg
    # the manifest may allow it
    assert load_op_tables(write_tables(tmp_path / "allowed", rows, max_drop=0.6)) is not None
    rows = good_rows()
    rows[2][col] = rows[1][col] * 0.9  # a 10% dip: noise, repaired
    curve = load_op_tables(write_tables(tmp_path / "small", rows)).op_curve(1, "gate_up")
    assert np.all(np.diff(curve.y) >= 0) and curve.raw_y[2] < curve.raw_y[1]


def test_a_manifest_without_the_tables_tp_is_an_error(tmp_path):
    folder = write_tables(tmp_path / "t", good_rows(), tp_degrees=[1, 2])
    msg = _error(folder)
    assert "column 'tp'" in msg and "tp=2" in msg
    bad = tmp_path / "v"
    bad.mkdir()
    (bad / "manifest.json").write_text("{not json")
    with pytest.raises(ConfigError, match="manifest.json: not valid JSON"):
        load_op_tables(bad)

