"""Measured per-operator GPU times (format ``servelab-op-tables/1``) and the curves a time model reads.

A table folder holds one hardware x one model shape x one dtype: ``manifest.json`` (what was measured,
where it came from, units) and CSV files of *median* times, one row per (``tp``, x) point:

- ``ops.csv``: seconds per decoder layer per rank of each operator (qkv, o, gate_up, down, the norms,
  rope, act, add, emb) against the number of tokens in the step;
- ``host.csv`` (optional): host-side time per step (schedule, prepare inputs, sample, process
  outputs) against the batch size;
- ``<hardware>/network/all_reduce.csv`` (shared by every model on that hardware): one NCCL
  all-reduce against the message bytes.

:class:`Curve` turns measured points into a monotone function (piecewise linear in log-log, flat
below the first point, proportional above the last, with one warning per table);
:func:`find_op_tables` picks the tables measured for a model's *shape* (not its name). The format,
the shipped tables (Microsoft Vidur's public profiles, MIT) and how to add your own:
docs/op-tables.md.
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
from pathlib import Path

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.shapes import ModelShape

log = logging.getLogger(__name__)

FORMAT = "servelab-op-tables/1"
# The tables shipped in the package (servelab/data/op_tables), found from this file, not the repo root.
PACKAGED_OP_TABLES = Path(__file__).resolve().parents[1] / "data" / "op_tables"
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
# One decoder layer, attention kernels excepted: what layer_curve() adds up (each once). The
# embedding (``emb``) is measured but is not part of a layer.
LAYER_OPS = ("input_norm", "qkv", "rope", "o", "post_norm", "gate_up", "act", "down", "add")
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_heads", "num_kv_heads")  # must equal the model's
# A measured time may dip as x grows (noise, a kernel switch) and is repaired by isotonic regression;
# a dip of more than MAX_DROP below the largest time before it (and more than DROP_ABS_TOL_S) is an
# error naming the row. A manifest may set its own "max_drop".
MAX_DROP = 0.3
DROP_ABS_TOL_S = 2e-6

_WARNED: set = set()  # (table, measured range) already warned about extrapolating


def isotonic(y) -> np.ndarray:
    """The least-squares non-decreasing fit of ``y`` (pool adjacent violators, equal weights):
    a dip is averaged with the points before it; data that never dip come back unchanged."""
    vals: list[float] = []
    wts: list[int] = []
    for v in np.asarray(y, dtype=float):
        vals.append(float(v))
        wts.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2 = vals.pop(), wts.pop()
            w1 = wts[-1]
            vals[-1] = (vals[-1] * w1 + v2 * w2) / (w1 + w2)
            wts[-1] = w1 + w2
    return np.repeat(np.array(vals, dtype=float), wts)


class Curve:
    """Seconds against x (tokens, bytes or batch size) through measured points.

    - x = 0 (or below): 0. Between 0 and the first point: the first point's time (a kernel costs
      at least its smallest measurement).
    - Between points: piecewise linear in log x / log y (a power law per segment: linear where
      time is proportional to work, flat where it is launch-bound); linear where a time is 0.
      Exact at the measured points.
    - Above the last point: proportional to x (``y_last * x / x_last``; large steps are
      throughput-bound), logging ONE warning per table naming its file and measured range.

    The measured times are made non-decreasing first by :func:`isotonic` (``raw_y`` keeps them).
    """

    def __init__(self, x, y, *, source: str = "", label: str = "", x_name: str = "x") -> None:
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        where = f"{source} ({label})" if label else (source or "curve")
        if x.ndim != 1 or x.shape != y.shape or len(x) == 0:
            raise ConfigError(f"{where}: a curve needs as many times as {x_name} values, at least one")
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
            raise ConfigError(f"{where}: {x_name} values and times must be finite numbers")
        if x[0] <= 0 or np.any(np.diff(x) <= 0):
            raise ConfigError(f"{where}: {x_name} values must be > 0 and strictly increasing")
        if np.any(y < 0):
            raise ConfigError(f"{where}: times must be >= 0")
        self.x = x
        self.raw_y = y
        self.y = isotonic(y)
        self.source = source
        self.label = label
        self.x_name = x_name

    @property
    def x_range(self) -> tuple[float, float]:
        return float(self.x[0]), float(self.x[-1])

    def __call__(self, x: float) -> float:
        return float(self._eval(np.array([x], dtype=float))[0])

    def at(self, x) -> np.ndarray:
        """The curve at every value of the array ``x`` (vectorised :meth:`__call__`)."""
        return self._eval(np.asarray(x, dtype=float))

    def dense(self, upto: int) -> np.ndarray:
        """The value at every integer 0..``upto`` (index = x; [0] = 0): an O(1) lookup table."""
        if upto < 0:
            raise ValueError(f"dense(upto={upto}): upto must be >= 0")
        return self._eval(np.arange(int(upto) + 1, dtype=float))

    def with_x_scale(self, factor: float) -> "Curve":
        """The same curve against ``x / factor``: ``c.with_x_scale(k)(u) == c(u * k)``; e.g. an
        all-reduce (bytes) per token with ``factor = hidden_size * dtype_bytes``."""
        if not factor > 0:
            raise ValueError(f"with_x_scale({factor}): the factor must be > 0")
        c = Curve.__new__(Curve)
        c.x, c.raw_y, c.y = self.x / factor, self.raw_y, self.y
        c.source, c.label, c.x_name = self.source, f"{self.label} per {factor:g}".strip(), self.x_name
        return c

    def _eval(self, q: np.ndarray) -> np.ndarray:
        x, y = self.x, self.y
        out = np.zeros_like(q)
        below = (q > 0) & (q < x[0])
        out[below] = y[0]
        above = q > x[-1]
        if above.any():
            out[above] = y[-1] * q[above] / x[-1]
            self._warn(float(q[above].max()))
        inside = (q >= x[0]) & ~above
        if inside.any():
            qi = q[inside]
            if len(x) == 1:
                out[inside] = y[0]
            else:
                i = np.clip(np.searchsorted(x, qi, side="right") - 1, 0, len(x) - 2)
                x0, x1, y0, y1 = x[i], x[i + 1], y[i], y[i + 1]
                lin = y0 + (y1 - y0) * (qi - x0) / (x1 - x0)
                pos = (y0 > 0) & (y1 > 0)
                with np.errstate(divide="ignore", invalid="ignore"):
                    loglog = y0 * np.power(y1 / y0, np.log(qi / x0) / np.log(x1 / x0))
                val = np.where(pos, loglog, lin)
                val = np.where(qi == x1, y1, np.where(qi == x0, y0, val))
                out[inside] = np.clip(val, y0, y1)  # no 1-ulp overshoot at a segment's end
        return out

    def _warn(self, q: float) -> None:
        lo, hi = self.x_range
        key = (self.source or id(self), lo, hi)
        if key in _WARNED:
            return
        _WARNED.add(key)
        what = f"{self.source} ({self.label})" if self.label else (self.source or "an op-table curve")
        log.warning("op table %s: measured for %s %g..%g; %s=%g and beyond are extrapolated in proportion "
                    "to %s (warned once per table)", what, self.x_name, lo, hi, self.x_name, q, self.x_name)

    def __repr__(self) -> str:
        lo, hi = self.x_range
        return f"Curve({self.label or self.source!r}, {len(self.x)} points, {self.x_name} {lo:g}..{hi:g})"


# ---- files -----------------------------------------------------------------------------------

def _manifest(path: Path) -> dict:
    try:
        m = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        fmt = m.get("format") if isinstance(m, dict) else None
        raise ConfigError(f"{path}: key 'format' is {fmt!r}, not {FORMAT!r}")
    kind = m.get("kind")
    need = ["kind", "hardware", "time_unit", "tables"]
    if kind == "compute":
        need += ["model", "shape", "dtype", "tp_degrees"]
    elif kind != "network":
        raise ConfigError(f"{path}: key 'kind' is {kind!r}, not 'compute' or 'network'")
    for key in need:
        if key not in m:
            raise ConfigError(f"{path}: key {key!r} is missing")
    if m["time_unit"] not in TIME_UNITS:
        raise ConfigError(f"{path}: key 'time_unit' is {m['time_unit']!r}, not one of {sorted(TIME_UNITS)}")
    if kind == "compute":
        for key in SHAPE_KEYS:
            if not isinstance(m["shape"].get(key), int):
                raise ConfigError(f"{path}: key 'shape.{key}' is missing or not an integer")
        tps = m["tp_degrees"]
        if not tps or not all(isinstance(t, int) and t >= 1 for t in tps):
            raise ConfigError(f"{path}: key 'tp_degrees' must list positive integers, not {tps!r}")
        if "ops" not in m["tables"]:
            raise ConfigError(f"{path}: key 'tables.ops' is missing")
        missing = [op for op in LAYER_OPS if op not in m["tables"]["ops"].get("columns", ())]
        if missing:
            raise ConfigError(f"{path}: key 'tables.ops.columns' lacks the layer ops {missing}")
    for name, spec in m["tables"].items():
        for key in ("file", "x", "columns"):
            if key not in spec:
                raise ConfigError(f"{path}: key 'tables.{name}.{key}' is missing")
    return m


def _number(cell: str, file: Path, line: int, col: str) -> float:
    try:
        v = float(cell)
    except ValueError:
        raise ConfigError(f"{file}: line {line}, column {col!r}: {cell!r} is not a number") from None
    if not math.isfinite(v):
        raise ConfigError(f"{file}: line {line}, column {col!r}: {cell!r} is not a finite number")
    return v


def _read_table(file: Path, x_name: str, columns, scale: float, unit: str, max_drop: float) -> dict:
    """{tp: (x, {column: seconds}, lines)}, validated; errors name the file, the line and the column."""
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read ({exc})") from None
    reader = csv.reader(text.splitlines())
    header = [h.strip() for h in next(reader, [])]
    for col in ("tp", x_name, *columns):
        if col not in header:
            raise ConfigError(f"{file}: line 1 (header), column {col!r}: missing (the header has {header})")
    idx = {c: header.index(c) for c in ("tp", x_name, *columns)}
    rows: dict[int, dict] = {}
    for row in reader:
        line = reader.line_num
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            col = header[len(row)] if len(row) < len(header) else "(extra)"
            raise ConfigError(f"{file}: line {line}, column {col!r}: {len(row)} cells, the header has {len(header)}")
        tp_cell = row[idx["tp"]].strip()
        tp = _number(tp_cell, file, line, "tp")
        if tp < 1 or tp != int(tp):
            raise ConfigError(f"{file}: line {line}, column 'tp': {tp_cell!r} is not a positive integer")
        tp = int(tp)
        x = _number(row[idx[x_name]], file, line, x_name)
        if x <= 0:
            raise ConfigError(f"{file}: line {line}, column {x_name!r}: {x:g} must be > 0")
        g = rows.setdefault(tp, {"x": [], "lines": [], "y": {c: [] for c in columns}})
        if g["x"] and x <= g["x"][-1]:
            raise ConfigError(f"{file}: line {line}, column {x_name!r}: {x:g} does not increase (line "
                              f"{g['lines'][-1]} has {g['x'][-1]:g} for tp={tp}); sort each tp's rows by "
                              f"{x_name}, without repeats")
        for c in columns:
            v = _number(row[idx[c]], file, line, c)
            if v < 0:
                raise ConfigError(f"{file}: line {line}, column {c!r}: time {v:g} {unit} is negative")
            g["y"][c].append(v)
        g["x"].append(x)
        g["lines"].append(line)
    if not rows:
        raise ConfigError(f"{file}: line 2: no rows under the header")
    out = {}
    for tp, g in rows.items():
        xs = np.array(g["x"])
        ys = {}
        for c in columns:
            y = np.array(g["y"][c])
            _check_drops(file, c, x_name, xs, y, g["lines"], scale, unit, max_drop)
            ys[c] = y * scale
        out[tp] = (xs, ys, g["lines"])
    return out


def _check_drops(file, col, x_name, x, y, lines, scale, unit, max_drop) -> None:
    top = np.maximum.accumulate(y)
    at = np.zeros(len(y), dtype=int)
    for i in range(1, len(y)):
        at[i] = i if y[i] >= top[i - 1] else at[i - 1]
    bad = (y < (1 - max_drop) * top) & ((top - y) * scale > DROP_ABS_TOL_S)
    if bad.any():
        i = int(np.argmax(bad))
        j = at[i]
        raise ConfigError(
            f"{file}: line {lines[i]}, column {col!r}: {y[i]:g} {unit} at {x_name}={x[i]:g} is "
            f"{1 - y[i] / top[i]:.0%} below the {top[i]:g} {unit} at {x_name}={x[j]:g} (line {lines[j]}); "
            f"a time may dip at most {max_drop:.0%} as {x_name} grows (noise, repaired by isotonic regression): "
            f"re-measure that point or set \"max_drop\" in manifest.json")


# ---- tables ----------------------------------------------------------------------------------

class OpTables:
    """One hardware x one model shape x one dtype: per-operator curves per TP degree, plus the
    hardware's all-reduce and, where measured, the host's per-step time. Load with
    :func:`find_op_tables` or :func:`load_op_tables` (cached per process)."""

    def __init__(self, folder: Path, manifest: dict, network: tuple[Path, dict] | None) -> None:
        self.folder = folder
        self.manifest = manifest
        self.hardware: str = manifest["hardware"]
        self.model: str = manifest["model"]
        self.shape: dict = dict(manifest["shape"])
        self.dtype: str = manifest["dtype"]
        self.serves_dtypes: tuple[str, ...] = tuple(manifest.get("serves_dtypes", [self.dtype]))
        self.tp_degrees: tuple[int, ...] = tuple(sorted(manifest["tp_degrees"]))
        unit = manifest["time_unit"]
        max_drop = float(manifest.get("max_drop", MAX_DROP))
        spec = manifest["tables"]["ops"]
        self.ops: tuple[str, ...] = tuple(spec["columns"])
        self._files = {"ops": folder / spec["file"]}
        self._ops = _read_table(self._files["ops"], spec["x"], self.ops, TIME_UNITS[unit], unit, max_drop)
        for tp in self.tp_degrees:
            if tp not in self._ops:
                raise ConfigError(f"{self._files['ops']}: column 'tp': no rows for tp={tp}, which "
                                  f"{folder / 'manifest.json'} lists in 'tp_degrees'")
        self._host = self._net = None
        self._host_spec = manifest["tables"].get("host")
        if self._host_spec:
            self._files["host"] = folder / self._host_spec["file"]
            self._host = _read_table(self._files["host"], self._host_spec["x"], self._host_spec["columns"],
                                     TIME_UNITS[unit], unit, max_drop)
        self.network_manifest = None
        if network is not None:
            net_folder, net = network
            self.network_manifest = net
            spec = net["tables"].get("all_reduce")
            if spec:
                self._files["all_reduce"] = net_folder / spec["file"]
                nunit = net["time_unit"]
                self._net = _read_table(self._files["all_reduce"], spec["x"], spec["columns"][:1],
                                        TIME_UNITS[nunit], nunit, float(net.get("max_drop", MAX_DROP)))
                self._net_col = spec["columns"][0]
        self._curves: dict = {}

    def _tp(self, tp: int) -> None:
        if tp not in self._ops:
            raise ConfigError(f"{self.folder / 'manifest.json'}: no tables for tensor_parallel_size={tp} "
                              f"(measured: {list(self.tp_degrees)})")

    def _curve(self, key, file: Path, x, y, label: str, x_name: str) -> Curve:
        if key not in self._curves:
            self._curves[key] = Curve(x, y, source=str(file), label=label, x_name=x_name)
        return self._curves[key]

    def op_curve(self, tp: int, op: str) -> Curve:
        """Seconds per decoder layer per rank of ``op`` against the tokens in the step."""
        self._tp(tp)
        if op not in self.ops:
            raise ConfigError(f"{self._files['ops']}: no column {op!r} (ops: {list(self.ops)})")
        x, ys, _ = self._ops[tp]
        return self._curve(("op", tp, op), self._files["ops"], x, ys[op], f"tp={tp} {op}", "tokens")

    def layer_curve(self, tp: int) -> Curve:
        """Seconds of one decoder layer per rank, attention kernels and all-reduces excepted: the
        sum of the (monotone) :data:`LAYER_OPS` at each measured token count, interpolated like
        any curve. The embedding is not included."""
        self._tp(tp)
        if ("layer", tp) not in self._curves:
            x, _, _ = self._ops[tp]
            total = sum(self.op_curve(tp, op).y for op in LAYER_OPS)
            self._curves[("layer", tp)] = Curve(x, total, source=str(self._files["ops"]),
                                                label=f"tp={tp} layer", x_name="tokens")
        return self._curves[("layer", tp)]

    def allreduce_curve(self, tp: int) -> Curve | None:
        """Seconds of one all-reduce across ``tp`` ranks against the message bytes (the tensor one
        rank holds); None for tp=1 or a TP degree the hardware's network table lacks."""
        if tp <= 1 or self._net is None or tp not in self._net:
            return None
        x, ys, _ = self._net[tp]
        return self._curve(("all_reduce", tp), self._files["all_reduce"], x, ys[self._net_col],
                           f"all_reduce tp={tp}", "bytes")

    @property
    def host_tp_degrees(self) -> tuple[int, ...]:
        return tuple(sorted(self._host)) if self._host else ()

    def host_curve(self, tp: int | None = None) -> Curve | None:
        """Host seconds per step against the batch size (the sum of the manifest's ``tables.host.sum``
        columns), or None without a host table. Host work barely depends on TP: a TP degree that
        was not measured takes the nearest measured one (the smaller on a tie); None, the smallest."""
        if not self._host:
            return None
        tps = self.host_tp_degrees
        use = tp if tp in tps else min(tps, key=lambda t: (abs(t - (tp or t)), t))
        x, ys, _ = self._host[use]
        cols = self._host_spec.get("sum", self._host_spec["columns"])
        return self._curve(("host", use), self._files["host"], x, sum(ys[c] for c in cols), f"host tp={use}",
                           "batch_size")

    def _file_name(self, path: Path) -> str:
        try:
            return "servelab/data/op_tables/" + str(path.resolve().relative_to(PACKAGED_OP_TABLES))
        except ValueError:
            return str(path)

    def describe(self) -> dict:
        """What ``summary.json`` records: the tables' provenance, shape, dtype and files."""
        net = self.network_manifest or {}
        return {"format": FORMAT, "hardware": self.hardware, "model": self.model, "shape": self.shape,
                "dtype": self.dtype, "serves_dtypes": list(self.serves_dtypes), "tp_degrees": list(self.tp_degrees),
                "all_reduce_tp_degrees": sorted(self._net) if self._net else [],
                "host_tp_degrees": list(self.host_tp_degrees), "layer_ops": list(LAYER_OPS),
                "files": {k: self._file_name(v) for k, v in self._files.items()},
                "source": self.manifest.get("source"), "network_source": net.get("source")}

    def __repr__(self) -> str:
        return f"OpTables({self.hardware}/{self.model}, {self.dtype}, tp {list(self.tp_degrees)})"


def _stamp(folder: Path) -> tuple:
    out = []
    for d in (folder, folder.parent / "network"):
        if d.is_dir():
            out += [(str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(d.iterdir()) if p.is_file()]
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _load(folder: str, stamp: tuple) -> OpTables:
    path = Path(folder)
    manifest = _manifest(path / "manifest.json")
    if manifest["kind"] != "compute":
        raise ConfigError(f"{path / 'manifest.json'}: key 'kind' is {manifest['kind']!r}; load a model's "
                          f"folder (its network table comes with it)")
    network = None
    if manifest.get("network"):
        net_folder = (path / manifest["network"]).resolve()
        network = (net_folder, _manifest(net_folder / "manifest.json"))
    return OpTables(path, manifest, network)


def _matches(manifest: dict, shape: ModelShape) -> list[str]:
    """The manifest's shape keys that differ from ``shape`` (vocab and layer count may differ)."""
    want = {"hidden_size": shape.hidden_size, "intermediate_size": shape.intermediate_size,
            "num_heads": shape.num_heads, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_dim}
    have = manifest["shape"]
    return [k for k in (*SHAPE_KEYS, "head_dim") if k in have and have[k] != want[k]]


def load_op_tables(folder: str | Path, *, shape: ModelShape | None = None, tp: int | None = None,
                   dtype: str | None = None) -> OpTables:
    """The tables in ``folder`` (a model's folder with ``manifest.json``), validated and cached per
    process. With ``shape`` / ``tp`` / ``dtype``: a ConfigError naming the manifest key unless the
    tables were measured for that shape (hidden, intermediate, heads, KV heads, head dim), TP
    degree and dtype."""
    folder = Path(folder).resolve()
    tables = _load(str(folder), _stamp(folder))
    where = folder / "manifest.json"
    if shape is not None:
        for key in _matches(tables.manifest, shape):
            raise ConfigError(f"{where}: key 'shape.{key}' is {tables.shape[key]}, but the model has {key}="
                              f"{getattr(shape, key)} (these tables are for {tables.model}; tables exist for: "
                              f"{describe_available(folder.parent.parent)})")
    if tp is not None and tp not in tables.tp_degrees:
        raise ConfigError(f"{where}: key 'tp_degrees' is {list(tables.tp_degrees)}: no tables for "
                          f"tensor_parallel_size={tp}")
    if dtype is not None and dtype not in tables.serves_dtypes:
        raise ConfigError(f"{where}: key 'serves_dtypes' is {list(tables.serves_dtypes)}: no tables for dtype={dtype}")
    return tables


def _manifests(root: Path):
    for path in sorted(root.glob("*/*/manifest.json")):
        m = _manifest(path)
        if m["kind"] == "compute":
            yield path.parent, m


def find_op_tables(hardware: str, shape: ModelShape, tp: int, dtype: str,
                   root: str | Path | None = None) -> OpTables | None:
    """The tables measured on ``hardware`` (a ``conf/hardware`` name, e.g. ``h100``) for a model of
    this shape (hidden, intermediate, heads, KV heads, head dim equal; vocabulary and layer count
    may differ: the tables are per layer and leave out the LM head), with ``tp`` among their TP
    degrees and ``dtype`` among the dtypes they serve; None if there are none. Of several such
    folders (Llama-2-70B and Llama-3-70B share a shape) the one whose vocabulary is nearest the
    model's wins. ``root`` defaults to the tables shipped in the package."""
    root = Path(root) if root is not None else PACKAGED_OP_TABLES
    found = [(abs(m["shape"].get("vocab_size", shape.vocab_size) - shape.vocab_size), str(folder))
             for folder, m in _manifests(root)
             if m["hardware"] == hardware and not _matches(m, shape) and tp in m["tp_degrees"]
             and dtype in m.get("serves_dtypes", [m["dtype"]])]
    return load_op_tables(min(found)[1]) if found else None


def available_op_tables(root: str | Path | None = None) -> list[dict]:
    """Every table folder under ``root`` (default: the shipped ones): hardware, model, shape, dtype,
    the dtypes it serves, TP degrees, and whether it has host / all-reduce tables."""
    root = Path(root) if root is not None else PACKAGED_OP_TABLES
    out = []
    for folder, m in _manifests(root):
        net = (folder / m["network"]).resolve() / "manifest.json" if m.get("network") else None
        out.append({"hardware": m["hardware"], "model": m["model"], "shape": dict(m["shape"]), "dtype": m["dtype"],
                    "serves_dtypes": list(m.get("serves_dtypes", [m["dtype"]])), "tp_degrees": sorted(m["tp_degrees"]),
                    "host": "host" in m["tables"], "all_reduce": bool(net and net.is_file()), "folder": str(folder)})
    return out


def describe_available(root: str | Path | None = None) -> str:
    """One line for an error message: ``h100/llama2_70b (hidden 8192, ffn 28672, heads 64/8, float16
    [float16, bfloat16], tp 1/2/4/8); ...``."""
    rows = available_op_tables(root)
    if not rows:
        return "none"
    parts = []
    for r in rows:
        s = r["shape"]
        parts.append(f"{r['hardware']}/{r['model']} (hidden {s['hidden_size']}, ffn {s['intermediate_size']}, "
                     f"heads {s['num_heads']}/{s['num_kv_heads']}, {r['dtype']} [{', '.join(r['serves_dtypes'])}], "
                     f"tp {'/'.join(map(str, r['tp_degrees']))})")
    return "; ".join(parts)


def _files_stamp(folder: Path) -> tuple:
    return tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())


@functools.lru_cache(maxsize=16)
def _custom_allreduce(folder: str, stamp: tuple) -> tuple[dict, Path, dict] | None:
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        return None
    manifest = _manifest(path)
    spec = manifest["tables"].get("custom_all_reduce")
    if spec is None:
        return None
    unit = manifest["time_unit"]
    file = Path(folder) / spec["file"]
    table = _read_table(file, spec["x"], spec["columns"][:1], TIME_UNITS[unit], unit,
                        float(manifest.get("max_drop", MAX_DROP)))
    return table, file, spec


def custom_allreduce_curve(hardware: str, tp: int, root: str | Path | None = None) -> Curve | None:
    """Seconds of one custom (one-shot / two-shot, vLLM's) all-reduce across ``tp`` ranks of
    ``hardware`` against the message bytes, from the published figures in
    ``<hardware>/network/custom_all_reduce.csv`` (docs/op-tables.md); None where none were published."""
    folder = (Path(root) if root is not None else PACKAGED_OP_TABLES) / hardware / "network"
    found = _custom_allreduce(str(folder), _files_stamp(folder)) if folder.is_dir() else None
    if found is None or tp not in found[0]:
        return None
    table, file, spec = found
    x, ys, _ = table[tp]
    return Curve(x, ys[spec["columns"][0]], source=str(file), label=f"custom_all_reduce tp={tp}", x_name="bytes")


def custom_allreduce_degrees(hardware: str, root: str | Path | None = None) -> list[int]:
    """The TP degrees with published custom all-reduce figures on ``hardware`` (for error messages)."""
    folder = (Path(root) if root is not None else PACKAGED_OP_TABLES) / hardware / "network"
    found = _custom_allreduce(str(folder), _files_stamp(folder)) if folder.is_dir() else None
    return sorted(found[0]) if found else []
