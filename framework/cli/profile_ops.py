"""``servelab profile-ops [overrides]``: measure operator tables (``servelab-op-tables/1``) on this machine.

For the composed model's shape, dtype (``model.dtype``) and quantisation (``model.quantization``) it
times servelab's own code (:mod:`servelab.exec.op_bench`) at each TP degree of
``profile_ops.tp_degrees``: every operator of one decoder layer on one rank (its column-/row-parallel
shard) at each token count, the torch and (on CUDA) Triton paged-attention kernels for prefill
(new tokens x context) and decode (batch x context), and NCCL's all-reduce at each TP degree > 1
the machine has GPUs for (gloo on CPU with ``profile_ops.all_reduce=true``). Each point is the
median of ``profile_ops.repeats`` calls after ``profile_ops.warmup``.

It writes ``<dir>/<hardware>/<model>/{manifest.json, ops.csv, ops_raw.csv, attention.csv}`` and
``<dir>/<hardware>/network/`` (the all-reduce) into ``hydra.run.dir`` (default
``outputs/profile-ops/<date>/<time>``), checks that ``servelab.sim.op_tables`` loads them and prints
``results: <the model's table folder>``. Use it: ``time_model=op_profile time_model.path=<folder>``.

Options (``profile_ops.<key>=<value>``, read by this command, not by Hydra; docs/op-tables.md):
``tp_degrees`` ([1]), ``tokens`` (the token counts; default 1, 2, 3, 4, 6, 8, 12, ... up to
``max_tokens``: 16384 on CUDA, 256 on CPU), ``repeats`` (10), ``warmup`` (3), ``hardware`` (the
folder and manifest name; default this GPU's ``conf/hardware`` name, e.g. ``h200``, else its name,
``cpu`` on CPU), ``attention`` (true), ``attention_backends`` (torch, and triton on CUDA),
``prefill_tokens``, ``decode_batches``, ``contexts``, ``max_kv_tokens`` (attention grid),
``all_reduce`` (null = on CUDA), ``all_reduce_max_bytes``, ``isotonic`` (true: each column made
non-decreasing, the raw medians kept in ``ops_raw.csv``).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Optional, cast

import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from servelab.cli.args import refuse_flags
from servelab.cli.help import plain_doc
from servelab.api import command_output_dir, compose_with_run_dir
from servelab.results.writable import writable_folder
from servelab.core.errors import ConfigError, ServelabError
from servelab.core.model_spec import SUPPORTED_ARCHITECTURES, ModelSpec, load_spec
from servelab.core.shapes import ModelShape
from servelab.exec import op_bench
from servelab.exec.executor import DTYPES, resolve_device
from servelab.assemble.preflight import check_device
from servelab.exec.quant import kv_cache_storage_dtype, linear_kernel
from servelab.exec.tp import check_tensor_parallel
from servelab.kernels import select_attention_backend
from servelab.assemble.executor import model_path, model_shape
from servelab.assemble.validate import explicit_block_size
from servelab.sim.op_tables import FORMAT, isotonic, load_op_tables
from servelab.sim.step_profile import machine_description

USAGE = ("usage: servelab profile-ops [profile_ops.<option>=<value>...] [hydra overrides...]  "
         "(hydra.run.dir=DIR: DIR/<hardware>/<model>/)")
PREFIX = "profile_ops."
TIME_UNIT = "us"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class ProfileOpsOptions:
    """``profile_ops.*``: what to measure (see the module docstring and docs/op-tables.md)."""

    tp_degrees: list = field(default_factory=lambda: [1])
    tokens: Optional[list] = None  # the token counts; null = 1, 2, 3, 4, 6, 8, ... up to max_tokens
    max_tokens: Optional[int] = None  # null = 16384 on CUDA, 256 on CPU
    repeats: int = 10
    warmup: int = 3
    hardware: Optional[str] = None  # null = this GPU's conf/hardware name (h200, ...), its name, or "cpu"
    attention: bool = True
    attention_backends: Optional[list] = None  # null = torch, and triton on CUDA
    prefill_tokens: Optional[list] = None  # null = 16..4096 (CUDA), 4..64 (CPU)
    decode_batches: Optional[list] = None  # null = 1..256 (CUDA), 1..16 (CPU)
    contexts: Optional[list] = None  # null = 256..16384 (CUDA), 16..256 (CPU); capped at max_model_len
    max_kv_tokens: int = 1 << 20  # leave out attention points with more KV tokens than this
    all_reduce: Optional[bool] = None  # null = on CUDA (NCCL); true on CPU: gloo, tp processes
    all_reduce_max_bytes: Optional[int] = None  # null = max tokens x hidden x dtype bytes
    isotonic: bool = True  # make each column non-decreasing (raw medians kept in *_raw.csv)


def split_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(``profile_ops.*`` settings as ``key=value``, the Hydra overrides)."""
    options: list[str] = []
    overrides: list[str] = []
    for arg in argv:
        bare = arg.lstrip("+")
        (options if bare.startswith(PREFIX) else overrides).append(bare[len(PREFIX):] if bare.startswith(PREFIX)
                                                                  else arg)
    return options, overrides


def parse_options(settings: list[str]) -> ProfileOpsOptions:
    """``key=value`` settings (Hydra's override syntax: ``tp_degrees=[1,2]``) -> typed options."""
    for s in settings:
        if "=" not in s:
            raise ConfigError(f"profile_ops.{s}: expected profile_ops.<option>=<value>")
    known = {f.name for f in fields(ProfileOpsOptions)}
    for s in settings:
        key = s.split("=", 1)[0]
        if key not in known:
            raise ConfigError(f"profile_ops.{key} is not an option of servelab profile-ops "
                              f"(options: {', '.join(sorted(known))})")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ProfileOpsOptions), OmegaConf.from_dotlist(settings))
        opts = ProfileOpsOptions(**cast("dict[str, Any]", OmegaConf.to_container(merged)))
    except (OmegaConfBaseException, ValueError, TypeError) as exc:
        raise ConfigError(f"profile_ops: {str(exc).splitlines()[0]}") from None
    for key in ("tp_degrees", "tokens", "prefill_tokens", "decode_batches", "contexts"):
        value = getattr(opts, key)
        if value is None:
            continue
        if not isinstance(value, list) or not value or not all(isinstance(v, int) and v >= 1 for v in value):
            raise ConfigError(f"profile_ops.{key}={value!r} must be a list of positive integers, e.g. [1,2]")
        setattr(opts, key, sorted(set(value)))
    for key, low in (("repeats", 1), ("warmup", 0), ("max_tokens", 1), ("max_kv_tokens", 1),
                     ("all_reduce_max_bytes", 1)):
        value = getattr(opts, key)
        if value is not None and value < low:
            raise ConfigError(f"profile_ops.{key}={value} must be >= {low}")
    if opts.hardware is not None and not NAME.match(opts.hardware):
        raise ConfigError(f"profile_ops.hardware={opts.hardware!r} must be a folder name (letters, digits, _ . -)")
    if opts.attention_backends is not None:
        bad = [b for b in opts.attention_backends if b not in ("torch", "triton")]
        if bad or not opts.attention_backends:
            raise ConfigError(f"profile_ops.attention_backends={opts.attention_backends!r}: each must be torch "
                              "or triton")
    return opts


# ---- what is profiled ---------------------------------------------------------------------------

def model_spec(cfg) -> ModelSpec:
    """The composed model's spec: its checkpoint's ``config.json`` (``model=tiny_code``, ``model=hf``),
    else the config's shape fields (``model=tiny``, a catalogue shape such as ``model=llama3_8b``),
    with Llama defaults for what a shape does not say (RoPE, norm epsilon: they do not change a time)."""
    m = cfg.model
    if m.path is not None and not m.shape_only:
        return load_spec(model_path(cfg))
    shape = model_shape(cfg)
    arch = str(m.architecture)
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"model.architecture={arch!r} is not one of {sorted(SUPPORTED_ARCHITECTURES)}")
    family = SUPPORTED_ARCHITECTURES[arch]
    return ModelSpec(architecture=arch, family=family, vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                     intermediate_size=shape.intermediate_size, num_layers=shape.num_layers,
                     num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                     rms_norm_eps=1e-5, max_position_embeddings=shape.max_position_embeddings,
                     tie_word_embeddings=shape.tie_word_embeddings, qkv_bias=family == "qwen2",
                     qk_norm=family == "qwen3", rope_type="default", rope_theta=10000.0, eos_token_ids=())


def tp_splits(spec: ModelSpec) -> list[int]:
    """The TP degrees this model can be split into (up to its head count)."""
    out = []
    for tp in range(1, spec.num_heads + 1):
        try:
            check_tensor_parallel(spec, tp, "cpu")
        except ConfigError:
            continue
        out.append(tp)
    return out


def hardware_names() -> list[str]:
    """The ``conf/hardware`` names (a100_80gb, h100, h200, l40s, ...)."""
    folder = resources.files("servelab.conf").joinpath("hardware")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def machine_hardware_name(device: torch.device) -> str:
    """``conf/hardware``'s name for this GPU when its name says it (``NVIDIA H200`` -> ``h200``,
    ``NVIDIA A100-SXM4-80GB`` -> ``a100_80gb``), else the GPU's name as a folder name; ``cpu`` on CPU."""
    if device.type != "cuda":
        return "cpu"
    slug = re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name(device).lower()).strip("_") or "cuda"
    words = set(slug.split("_"))
    for name in sorted(hardware_names(), key=len, reverse=True):
        if set(name.split("_")) <= words:
            return name
    return slug


def model_folder_name(cfg, quantization: str) -> str:
    m = cfg.model
    name = Path(str(m.path)).name if m.name == "hf" and m.path is not None else str(m.name)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "model"
    return f"{name}_int8" if quantization == "int8" else name


def _defaults(cuda: bool, max_model_len: int, opts: ProfileOpsOptions) -> dict:
    def cap(values):
        kept = [v for v in values if v <= max_model_len]
        return kept or [max_model_len]

    return {
        "tokens": opts.tokens or op_bench.token_grid(opts.max_tokens or (16384 if cuda else 256)),
        "prefill_tokens": opts.prefill_tokens or cap([16, 64, 256, 1024, 4096] if cuda else [4, 16, 64]),
        "decode_batches": opts.decode_batches or ([1, 4, 16, 64, 256] if cuda else [1, 4, 16]),
        "contexts": opts.contexts or cap([256, 1024, 4096, 16384] if cuda else [16, 64, 256]),
    }


# ---- the command --------------------------------------------------------------------------------

class _Lines:
    """Warnings (one line each, on stderr, kept for the manifest) and progress lines."""

    def __init__(self, quiet: bool = False) -> None:
        self.warnings: list[str] = []
        self.quiet = quiet

    def warn(self, text: str) -> None:
        self.warnings.append(text)
        print(f"servelab profile-ops: warning: {text}", file=sys.stderr)

    def progress(self, text: str) -> None:
        if not self.quiet:
            print(f"servelab profile-ops: {text}", file=sys.stderr)


def profile_ops(argv: list[str], out: str | Path | None = None, quiet: bool = False) -> dict:
    """Measure and write the tables ``argv`` (Hydra overrides and ``profile_ops.*`` options) ask for,
    into ``out`` (default: ``hydra.run.dir``, else ``outputs/profile-ops/<date>/<time>``). Returns
    ``folder`` (the model's tables), ``network`` (None unless an all-reduce was measured), ``tables``
    (the loaded :class:`~servelab.sim.op_tables.OpTables`), ``tp_degrees``, ``all_reduce_tp_degrees``,
    ``attention_rows`` and ``warnings`` (each also printed as one line)."""
    settings, overrides = split_args(list(argv))
    opts = parse_options(settings)
    cfg, run_dir = compose_with_run_dir(overrides)
    explicit_block_size(cfg, "servelab profile-ops")
    out = Path(out) if out is not None else command_output_dir("profile-ops", run_dir)
    lines = _Lines(quiet)

    check_device(cfg)  # backend.device=gpu, or cuda without CUDA: one line
    device = resolve_device(str(cfg.backend.device))
    cuda = device.type == "cuda"
    if cuda and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    dtype_name = str(getattr(cfg.model.dtype, "value", cfg.model.dtype))
    dtype = DTYPES[dtype_name]
    if not cuda and dtype == torch.float16:
        raise ConfigError("model.dtype=float16 is not supported on CPU; use float32 or bfloat16")
    quantization = str(getattr(cfg.model.quantization, "value", cfg.model.quantization))
    kv_cache_dtype = str(getattr(cfg.kv_cache_dtype, "value", cfg.kv_cache_dtype))
    if cfg.backend.num_threads:
        torch.set_num_threads(cfg.backend.num_threads)
    if cuda:
        torch.cuda.set_device(device)
    spec = model_spec(cfg)
    run_backend = select_attention_backend(str(getattr(cfg.attention_backend, "value", cfg.attention_backend)),
                                           device).name
    int8_kernel = linear_kernel(run_backend, device, dtype) if quantization == "int8" else None

    splits = ", ".join(map(str, tp_splits(spec)))
    degrees, refused = [], []
    for tp in opts.tp_degrees:
        try:
            check_tensor_parallel(spec, tp, "cpu")
        except ConfigError as exc:
            refused.append(f"tp={tp} not profiled: {exc} (this model splits at tp {splits})")
            continue
        degrees.append(tp)
    if not degrees:
        raise ConfigError(f"profile_ops.tp_degrees={opts.tp_degrees}: {refused[0]}")
    writable_folder(out, f"hydra.run.dir={run_dir}" if run_dir else "the profile-ops folder")  # before the timing
    for line in refused:
        lines.warn(line)

    grid = _defaults(cuda, int(cfg.max_model_len), opts)
    tokens = grid["tokens"]
    backends = opts.attention_backends or (["torch", "triton"] if cuda else ["torch"])
    attention_ops = _attention_backends(backends, device, spec, cfg.block_size, kv_cache_dtype, dtype,
                                        lines) if opts.attention else {}
    points = op_bench.attention_grid(grid["prefill_tokens"], grid["decode_batches"], grid["contexts"],
                                     opts.max_kv_tokens) if attention_ops else []
    max_positions = max(tokens) + 1

    ops_times: dict[int, dict[str, list[float]]] = {}
    attention_rows: list[dict] = []
    for tp in degrees:
        lines.progress(f"tp={tp}: {len(op_bench.OP_COLUMNS)} operators x {len(tokens)} token counts "
                       f"({tokens[0]}..{tokens[-1]}), {opts.repeats} repeats")
        bench = op_bench.build_layer(spec, tp, dtype, device, max_positions, quantization, int8_kernel, cfg.seed)
        ops_times[tp] = op_bench.time_layer_ops(bench, tokens, opts.repeats, opts.warmup)
        for name, (ops, kv_dtype) in attention_ops.items():
            lines.progress(f"tp={tp}: attention ({name}) at {len(points)} points")
            for phase, batch, query_len, context_len in points:
                try:
                    p = op_bench.time_attention_point(ops, bench, phase, batch, query_len, context_len,
                                                      cfg.block_size, kv_dtype, kv_cache_dtype != "auto",
                                                      opts.repeats, opts.warmup)
                except (RuntimeError, ValueError) as exc:  # out of memory, an unsupported shape
                    lines.warn(f"attention ({name}) tp={tp} {phase} batch={batch} query={query_len} "
                               f"context={context_len} not profiled: {str(exc).splitlines()[0]}")
                    if cuda:
                        torch.cuda.empty_cache()
                    continue
                attention_rows.append({"tp": tp, "backend": name, **asdict(p)})
        del bench
        if cuda:
            torch.cuda.empty_cache()

    all_reduce = _measure_all_reduce(opts, degrees, tokens, spec, dtype, cuda, lines)

    hardware = opts.hardware or machine_hardware_name(device)
    folder = out / hardware / model_folder_name(cfg, quantization)
    context = {"argv": list(argv), "cfg": cfg, "spec": spec, "device": device, "dtype_name": dtype_name,
               "quantization": quantization, "int8_kernel": int8_kernel, "kv_cache_dtype": kv_cache_dtype,
               "hardware": hardware, "tokens": tokens, "backends": list(attention_ops), "opts": opts}
    network = _write_network(out / hardware / "network", all_reduce, context) if all_reduce else None
    _write_model(folder, ops_times, attention_rows, network is not None, lines, context)
    try:
        tables = load_op_tables(folder, shape=ModelShape.from_spec(spec), dtype=dtype_name)
    except ConfigError as exc:
        raise ServelabError(f"the tables written to {folder} do not load: {exc}") from None
    return {"folder": folder, "network": network, "tables": tables, "tp_degrees": degrees,
            "all_reduce_tp_degrees": sorted(all_reduce), "attention_rows": attention_rows,
            "warnings": lines.warnings, "tokens": tokens}


def _attention_backends(names: list[str], device: torch.device, spec: ModelSpec, block_size: int,
                        kv_cache_dtype: str, dtype: torch.dtype, lines: _Lines) -> dict:
    """``{backend name: (ops, KV storage dtype)}`` to time; one warning line for each that cannot run here."""
    out = {}
    for name in names:
        try:
            ops = select_attention_backend(name, device)
            if ops.name == "triton":
                from servelab.kernels.triton_ops import check_supported  # noqa: PLC0415 - triton

                check_supported(spec.head_dim, block_size)
            kv_dtype = kv_cache_storage_dtype(kv_cache_dtype, dtype, device, ops.name)
        except (ServelabError, ValueError, RuntimeError) as exc:
            lines.warn(f"attention ({name}) not profiled: {str(exc).splitlines()[0]}")
            continue
        out[name] = (ops, kv_dtype)
    return out


def _measure_all_reduce(opts: ProfileOpsOptions, degrees: list[int], tokens: list[int], spec: ModelSpec,
                        dtype: torch.dtype, cuda: bool, lines: _Lines) -> dict[int, tuple[list[int], list[float]]]:
    """``{tp: (bytes, median seconds)}`` for each TP degree > 1 the machine can run; a warning line
    for each it cannot (the rest are still measured)."""
    wanted = [tp for tp in degrees if tp > 1]
    enabled = opts.all_reduce if opts.all_reduce is not None else cuda
    if not enabled or not wanted:
        return {}
    ranks = op_bench.all_reduce_ranks_here(cuda)
    what = "CUDA devices (NCCL, one per rank)" if cuda else "CPU cores (gloo, one process per rank)"
    can = f"tp 2..{ranks}" if ranks >= 3 else ("tp 2" if ranks == 2 else "no tp > 1")
    itemsize = torch.tensor([], dtype=dtype).element_size()
    max_bytes = opts.all_reduce_max_bytes or max(tokens) * spec.hidden_size * itemsize
    sizes = op_bench.byte_grid(min(1024, max_bytes), max_bytes)
    out = {}
    for tp in wanted:
        if tp > ranks:
            lines.warn(f"all-reduce at tp={tp} not profiled: it needs {tp} {what}, this machine has {ranks} "
                       f"(it can run {can})")
            continue
        lines.progress(f"all-reduce at tp={tp}: {len(sizes)} sizes ({sizes[0]}..{sizes[-1]} bytes)")
        try:
            out[tp] = (sizes, op_bench.time_all_reduce(tp, sizes, dtype, cuda, opts.repeats, opts.warmup))
        except RuntimeError as exc:
            lines.warn(f"all-reduce at tp={tp} not profiled: {str(exc).splitlines()[0]}")
    return out


# ---- the files ----------------------------------------------------------------------------------

def _fmt(seconds: float) -> str:
    """Microseconds to 4 significant digits, no exponent."""
    v = op_bench.round_sig(seconds * 1e6)
    return f"{v:.6f}".rstrip("0").rstrip(".") if v else "0"


def _monotone(series: np.ndarray, repair: bool, stats: dict) -> np.ndarray:
    stats["points"] += len(series)
    if not repair:
        return series
    mono = isotonic(series)
    moved = np.abs(mono - series) > 0.005 * np.maximum(series, 1e-12)
    stats["changed"] += int(moved.sum())
    if moved.any():
        stats["max_change"] = max(stats["max_change"], float(np.max(np.abs(mono - series)[moved] / series[moved])))
    return mono


def _repair_note(repair: bool, stats: dict, raw_file: str) -> dict:
    note = {"statistic": "median of the repeats", "rounding": "4 significant digits", "raw": raw_file}
    if repair:
        note.update({"monotone": "isotonic regression per (tp, column) (servelab.sim.op_tables.isotonic)",
                     "isotonic_points_changed": f"{stats['changed']} of {stats['points']} (by > 0.5%)",
                     "isotonic_max_change": f"{stats['max_change']:.1%}"})
    else:
        note["monotone"] = "not repaired (profile_ops.isotonic=false)"
    return note


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def _source(context: dict) -> dict:
    device = context["device"]
    try:
        import triton  # noqa: PLC0415

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "tool": "servelab profile-ops",
        "command": " ".join(["servelab", "profile-ops", *context["argv"]]),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "torch": torch.__version__, "cuda": torch.version.cuda, "triton": triton_version,
        "num_threads": torch.get_num_threads(), "machine": machine_description(),
    }


def _write_network(folder: Path, all_reduce: dict, context: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    opts = context["opts"]
    stats = {"points": 0, "changed": 0, "max_change": 0.0}
    rows, raw_rows = [], []
    for tp in sorted(all_reduce):
        sizes, seconds = all_reduce[tp]
        raw = np.array(seconds)
        mono = _monotone(raw, opts.isotonic, stats)
        rows += [[tp, b, _fmt(s)] for b, s in zip(sizes, mono)]
        raw_rows += [[tp, b, _fmt(s)] for b, s in zip(sizes, raw)]
    _write_csv(folder / "all_reduce.csv", ["tp", "bytes", "all_reduce"], rows)
    _write_csv(folder / "all_reduce_raw.csv", ["tp", "bytes", "all_reduce"], raw_rows)
    cuda = context["device"].type == "cuda"
    how = "NCCL, one GPU per rank" if cuda else "gloo, one CPU process per rank"
    manifest = {
        "format": FORMAT, "kind": "network", "hardware": context["hardware"], "dtype": context["dtype_name"],
        "tp_degrees": sorted(all_reduce), "time_unit": TIME_UNIT,
        "tables": {"all_reduce": {"file": "all_reduce.csv", "x": "bytes", "columns": ["all_reduce"],
                                  "repeats": opts.repeats, "warmup": opts.warmup,
                                  "conversion": _repair_note(opts.isotonic, stats, "all_reduce_raw.csv")}},
        "source": _source(context),
        "notes": [f"One torch.distributed all_reduce ({how}) "
                  f"of a {context['dtype_name']} tensor across tp ranks of this machine, by the bytes each rank holds; "
                  f"rank 0's median of {opts.repeats} calls, each after a barrier "
                  f"({'CUDA events' if cuda else 'time.perf_counter'}).",
                  "Written by servelab profile-ops for one model; other models on this hardware share it."],
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return folder


def _write_model(folder: Path, ops_times: dict, attention_rows: list[dict], has_network: bool, lines: _Lines,
                 context: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    opts, spec, tokens = context["opts"], context["spec"], context["tokens"]
    columns = list(op_bench.OP_COLUMNS)
    stats = {"points": 0, "changed": 0, "max_change": 0.0}
    rows, raw_rows = [], []
    for tp in sorted(ops_times):
        raw = {op: np.array(ops_times[tp][op]) for op in columns}
        mono = {op: _monotone(raw[op], opts.isotonic, stats) for op in columns}
        for i, n in enumerate(tokens):
            rows.append([tp, n, *(_fmt(mono[op][i]) for op in columns)])
            raw_rows.append([tp, n, *(_fmt(raw[op][i]) for op in columns)])
    _write_csv(folder / "ops.csv", ["tp", "tokens", *columns], rows)
    _write_csv(folder / "ops_raw.csv", ["tp", "tokens", *columns], raw_rows)
    device = context["device"]
    cuda = device.type == "cuda"
    tables = {"ops": {"file": "ops.csv", "x": "tokens", "columns": columns, "repeats": opts.repeats,
                      "warmup": opts.warmup, "conversion": _repair_note(opts.isotonic, stats, "ops_raw.csv")}}
    attention_file = folder / "attention.csv"
    if attention_rows:
        keys = ["tp", "backend", "phase", "batch_size", "query_len", "context_len"]
        attention_rows = sorted(attention_rows, key=lambda r: tuple(r[k] for k in keys))
        _write_csv(attention_file, [*keys, "store_kv", "attention"],
                   [[*(r[k] for k in keys), _fmt(r["store_kv"]), _fmt(r["attention"])] for r in attention_rows])
        tables["attention"] = {
            "file": "attention.csv", "x": "context_len", "keys": keys[:5], "columns": ["store_kv", "attention"],
            "repeats": opts.repeats, "warmup": opts.warmup, "backends": context["backends"],
            "block_size": int(context["cfg"].block_size), "kv_cache_dtype": context["kv_cache_dtype"],
            "notes": "an addition to servelab-op-tables/1, not read by servelab.sim.op_tables yet "
                     "(docs/op-tables.md#make-your-own-servelab-profile-ops)"}
    elif attention_file.exists():
        attention_file.unlink()  # a stale file from an earlier run into the same folder
    timing = ("CUDA events around each call, queued back to back (a kernel shorter than its launch is timed as "
              "the launch-bound cost of servelab's eager engine)" if cuda else "time.perf_counter around each call")
    notes = [
        f"ops.csv: median time ({opts.repeats} repeats after {opts.warmup} warm-up calls; {timing}) of each operator "
        f"of ONE decoder layer on ONE rank, servelab's own modules (servelab.exec.model) at each TP degree's shard "
        f"(qkv and gate_up column-parallel: n/tp outputs; o and down row-parallel: k/tp inputs, before their "
        f"all-reduce), random weights in {context['dtype_name']}, by the number of tokens in the step.",
        "'rope' includes Qwen3's q/k RMSNorm where the model has one; 'act' is SiLU(gate) * up as MLP.forward runs it;"
        " 'emb' is the rank's vocabulary shard of the embedding.",
    ]
    if context["quantization"] == "int8":
        notes.append(f"model.quantization=int8: the four linears are weight-only INT8 "
                     f"(servelab.exec.quant, kernel {context['int8_kernel']!r}); time_model=op_profile does not "
                     "price INT8 yet.")
    notes.append("attention.csv: the paged-attention kernels (store_kv + paged_attention of servelab.kernels) "
                 f"for {', '.join(context['backends'])}; not read by servelab.sim.op_tables yet."
                 if attention_rows else "No attention table (profile_ops.attention=false or no backend ran).")
    if not has_network:
        notes.append("No all-reduce table: " + ("no TP degree > 1 was profiled." if max(ops_times) == 1 else
                                                  "the all-reduce was not measured (see warnings)."))
    notes += [f"warning: {w}" for w in lines.warnings]
    manifest = {
        "format": FORMAT, "kind": "compute", "hardware": context["hardware"], "model": folder.name,
        "shape": {"hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
                  "num_heads": spec.num_heads, "num_kv_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
                  "vocab_size": spec.vocab_size},
        "dtype": context["dtype_name"], "serves_dtypes": [context["dtype_name"]],
        "quantization": context["quantization"], "tp_degrees": sorted(ops_times), "time_unit": TIME_UNIT,
        "tables": tables,
        **({"network": "../network"} if has_network else {}),
        "source": {**_source(context), "model": str(context["cfg"].model.name),
                   "model_path": None if context["cfg"].model.path is None else str(context["cfg"].model.path),
                   "architecture": spec.architecture, "int8_kernel": context["int8_kernel"]},
        "notes": notes,
    }
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + plain_doc(__doc__))
        return 0
    refuse_flags(argv, "profile-ops")
    result = profile_ops(argv)
    tables, folder = result["tables"], result["folder"]
    for tp in result["tp_degrees"]:
        layer = tables.layer_curve(tp)
        lo, hi = layer.x_range
        ar = tables.allreduce_curve(tp)
        extra = f"; all-reduce measured ({ar.x_range[0]:g}..{ar.x_range[1]:g} bytes)" if ar is not None else ""
        print(f"tp={tp}: one decoder layer (attention kernels excepted) {layer(lo) * 1e6:.1f} us at {lo:g} "
              f"token(s), {layer(hi) * 1e6:.1f} us at {hi:g} tokens{extra}")
    if result["attention_rows"]:
        print(f"attention: {len(result['attention_rows'])} points in {folder / 'attention.csv'}")
    hardware = f" hardware={tables.hardware}" if tables.hardware in hardware_names() else ""
    if tables.manifest.get("quantization") == "int8":
        print("note: time_model=op_profile does not price model.quantization=int8 yet; these tables are for analysis")
    else:
        src = tables.manifest["source"]
        model = f"model={src['model']}" + (f" model.path={src['model_path']}" if src["model"] == "hf" else "")
        print(f"use it: python run.py backend=sim {model} model.dtype={tables.dtype}"
              f"{hardware} tensor_parallel_size={result['tp_degrees'][-1]} time_model=op_profile "
              f"time_model.path={folder.resolve()}")
    print(f"results: {folder}")
    return 0
