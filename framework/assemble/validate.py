"""Checks across keys that Hydra's types cannot express: each mistake one :class:`ConfigError` line naming
the key, before anything is built. :func:`clock_kind` resolves ``clock=auto`` and checks clock, backend and
time model together."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.core.errors import ConfigError
from servelab.core.packaged import PACKAGED_CHECKPOINTS, PACKAGED_MODELS
from servelab.config import check_known_keys, config_yaml_defaults
from servelab.assemble.preflight import check_device
from servelab.workloads.arrivals import check_arrivals

log = logging.getLogger(__name__)




def validate(cfg: DictConfig) -> None:
    """Cross-key checks Hydra's types cannot express; raise :class:`ConfigError` naming the key."""
    check_required(cfg)
    check_known_keys(cfg)  # a Python API config too: the CLI's composer already said it in one line
    check_device(cfg)
    check_packaged_model(cfg)
    check_arrivals(cfg.workload)
    bs = check_block_size(cfg.block_size)
    if cfg.max_num_seqs < 1:
        raise ConfigError(f"max_num_seqs={cfg.max_num_seqs} must be >= 1")
    if cfg.max_model_len < 2:
        raise ConfigError(f"max_model_len={cfg.max_model_len} must be >= 2")
    if cfg.max_num_batched_tokens < max(bs, cfg.max_num_seqs):  # auto: only sizes that fit are candidates
        raise ConfigError(f"max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= block_size ({bs}) and "
                          f">= max_num_seqs ({cfg.max_num_seqs}, one token per running sequence)")
    if not cfg.chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(f"chunked_prefill=false needs max_num_batched_tokens ({cfg.max_num_batched_tokens}) >= "
                          f"max_model_len ({cfg.max_model_len}) so any prompt fits one step")
    steps = cfg.get("num_scheduler_steps", 1)
    if steps < 1:
        raise ConfigError(f"num_scheduler_steps={steps} must be >= 1 (1 = schedule every step)")
    if steps > 1 and cfg.drafter.name != "none":
        raise ConfigError(f"num_scheduler_steps={steps} with drafter={cfg.drafter.name}: multi-step windows run "
                          "plain decodes only (vLLM refuses the pair too); use num_scheduler_steps=1")
    if cfg.num_kv_blocks is not None and cfg.num_kv_blocks < 1:
        raise ConfigError(f"num_kv_blocks={cfg.num_kv_blocks} must be >= 1 (or null to size from memory)")
    if cfg.tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size={cfg.tensor_parallel_size} must be >= 1")
    for key in ("expert_parallel_size", "pipeline_parallel_size"):
        if cfg.get(key, 1) < 1:
            raise ConfigError(f"{key}={cfg.get(key)} must be >= 1")
    check_data_parallel_attention(cfg)
    check_pipeline_priced(cfg)
    if cfg.backend.tp_step_timeout_s <= 0:
        raise ConfigError(f"backend.tp_step_timeout_s={cfg.backend.tp_step_timeout_s} must be > 0")
    swap_blocks = cfg.backend.get("num_swap_blocks")
    if swap_blocks is not None and swap_blocks < 0:
        raise ConfigError(f"backend.num_swap_blocks={swap_blocks} must be >= 0")
    swap_gb = cfg.backend.get("swap_space_gb")
    if swap_gb is not None and (swap_gb < 0 or swap_blocks is not None):
        raise ConfigError(f"backend.swap_space_gb={swap_gb} must be >= 0 and is exclusive with "
                          f"backend.num_swap_blocks={swap_blocks} (set one of them)")
    bandwidth = cfg.backend.get("swap_bandwidth_gb_s")
    if bandwidth is not None and bandwidth <= 0:
        raise ConfigError(f"backend.swap_bandwidth_gb_s={bandwidth} must be > 0 (or null to measure it)")
    for key in ("ttft_ms", "tpot_ms"):
        value = cfg.slo[key]
        if value is not None and value <= 0:
            raise ConfigError(f"slo.{key}={value} must be > 0")
    if cfg.backend.get("activation_reserve_gb", 0) < 0:
        raise ConfigError(f"backend.activation_reserve_gb={cfg.backend.activation_reserve_gb} must be >= 0")
    if cfg.backend.kv_cache_memory_gb <= 0:
        raise ConfigError(f"backend.kv_cache_memory_gb={cfg.backend.kv_cache_memory_gb} must be > 0")
    threads = cfg.backend.get("num_threads")
    if threads is not None and threads < 1:
        raise ConfigError(f"backend.num_threads={threads} must be >= 1 (torch's threads per rank; null = "
                          "torch's default)")
    check_evictor(cfg)
    check_kv_tiers(cfg)
    check_engine_timing(cfg)


def check_evictor(cfg: DictConfig) -> None:
    """An evictor only chooses which cached prefix block goes: one other than the default, without a
    prefix cache, would never be asked (the run would silently be the default's)."""
    evictor = cfg.get("evictor")
    if evictor is None or evictor.name == config_yaml_defaults().get("evictor"):
        return
    if not cfg.allocator.get("prefix_caching", False):
        raise ConfigError(f"evictor={evictor.name} chooses which cached prefix block to give up, and allocator="
                          f"{cfg.allocator.name} caches none here: add allocator.prefix_caching=true (or drop "
                          f"evictor={evictor.name})")


def check_kv_tiers(cfg: DictConfig) -> None:
    """Tiers that would be built wrong or not at all, refused before the model loads: tiers hold prefix-cache
    blocks (``allocator.prefix_caching``); a disk tier's ``kv_tiers.disk_dir`` must be writable; a real engine
    holds the tiers' bytes in one worker, so not over several ranks (the simulator prices any TP size). The
    rest (capacities, shared tiers, a policy with no tier) is checked where the tiers are sized
    (:mod:`servelab.kv.tiers.build`)."""
    node = cfg.get("kv_tiers")
    if node is None or not node.tiers:
        return
    what = f"kv_tiers={node.name}" if node.name != "none" else "kv_tiers.tiers"
    if not cfg.allocator.get("prefix_caching", False):
        raise ConfigError(f"{what} holds prefix-cache blocks, and allocator={cfg.allocator.name} caches none here: "
                          "use allocator=paged allocator.prefix_caching=true (the kv_tiers presets turn it on), or "
                          "kv_tiers=none")
    disk_dir = node.get("disk_dir")
    if disk_dir and not any(option_value(t.kind) == "disk" for t in node.tiers):
        raise ConfigError(f"kv_tiers.disk_dir={disk_dir}: {what} has no disk tier to keep there; drop it, or use "
                          "kv_tiers=host_disk")
    if disk_dir:
        reason = _unwritable(Path(disk_dir))
        if reason:
            raise ConfigError(f"kv_tiers.disk_dir={disk_dir}: not writable ({reason}), and the disk tier's files go "
                              "there; name a folder you can write to, or leave it unset (the run's folder)")
    stores = cfg.get("kv_tier_policy") is not None and cfg.kv_tier_policy.name != "none"
    if stores and cfg.backend.name != "sim" and cfg.tensor_parallel_size > 1:
        raise ConfigError(f"{what} with tensor_parallel_size={cfg.tensor_parallel_size} on backend={cfg.backend.name}: "
                          "a real engine's tiers need one worker in this process (backend=local, or backend=torch "
                          "with tensor_parallel_size=1); backend=sim prices tiers at any TP size")


def _unwritable(path: Path) -> str | None:
    """Why no file can be made in folder ``path`` (made later by its user), or None when one can. Nothing is
    left behind: a temporary file is made and removed in its nearest existing folder."""
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"no file can be made in {existing}: {exc.strerror or type(exc).__name__}"
    return None


def check_engine_timing(cfg: DictConfig) -> None:
    """``sim.cuda_graphs`` / ``sim.cuda_graph_sizes`` / ``sim.all_reduce`` and ``frontend.*``: valid
    values, and only where they are priced (the virtual clock; the real model is measured as it is)."""
    sizes = list(cfg.sim.cuda_graph_sizes)
    if cfg.sim.cuda_graphs and (not sizes or min(sizes) < 1):
        raise ConfigError(f"sim.cuda_graph_sizes={sizes} must list batch sizes >= 1 (sim.cuda_graphs=true)")
    fe = cfg.frontend
    for key in ("per_request_s", "per_prompt_token_s", "per_output_token_s"):
        if fe[key] < 0:
            raise ConfigError(f"frontend.{key}={fe[key]} must be >= 0")
    if cfg.backend.name == "sim" or option_value(cfg.clock) == "virtual":
        return
    engine = cfg.get("engine")
    if engine is not None and engine.name != "servelab":
        raise ConfigError(f"engine={engine.name} prices another engine's time on the virtual clock; backend="
                          f"{cfg.backend.name} on the wall clock runs servelab's own engine as it is: use backend=sim "
                          "(or engine=servelab)")
    if cfg.sim.cuda_graphs or option_value(cfg.sim.all_reduce) != "nccl":
        raise ConfigError(f"sim.cuda_graphs / sim.all_reduce price steps on the virtual clock; backend="
                          f"{cfg.backend.name} on the wall clock is measured as it runs: drop them or use backend=sim")
    if any(fe[k] for k in ("per_request_s", "per_prompt_token_s", "per_output_token_s")) or fe.in_engine_process:
        raise ConfigError(f"frontend={fe.name}: the front-end model prices the virtual clock; backend="
                          f"{cfg.backend.name} on the wall clock is measured as it runs (servelab serve measures "
                          "the real server): use frontend=none or backend=sim")


def explicit_block_size(cfg: DictConfig, command: str) -> int:
    """``cfg.block_size`` for a command that runs no workload (so ``auto`` has nothing to choose from)."""
    bs = check_block_size(cfg.block_size)
    if cfg.block_size == "auto":
        raise ConfigError(f"block_size=auto chooses from a workload's lengths, and {command} runs none: "
                          "give block_size=<int>")
    return bs


def check_block_size(bs) -> int:
    """``block_size``: a power of two 1..256 (returned), or ``auto`` (returned as 1: resolved later)."""
    if bs == "auto":
        return 1
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1 or bs > 256 or bs & (bs - 1):
        raise ConfigError(f"block_size={bs} must be a power of two between 1 and 256, or auto")
    return bs


def check_required(cfg: DictConfig) -> None:
    """A key the chosen option needs but nobody set (``workload=jsonl`` without ``workload.path``,
    ``model=hf`` without ``model.path``): one line naming it, not a traceback at first use."""
    missing = [k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra.")]
    if cfg.model.name == "hf" and cfg.model.path is None:  # hf's ??? merges onto the schema's null
        missing.insert(0, "model.path")
    if not missing:
        return
    key = missing[0]
    group = key.split(".", 1)[0]
    option = OmegaConf.select(cfg, f"{group}.name", default=None) if "." in key else None
    needs = f"{group}={option} needs {key}" if option else f"{key} is required"
    what = "<checkpoint dir>" if key == "model.path" else "<file>" if key.endswith("path") else "<value>"
    more = f" (also unset: {', '.join(missing[1:])})" if len(missing) > 1 else ""
    raise ConfigError(f"{needs}: add {key}={what}{more}")


def check_packaged_model(cfg: DictConfig) -> None:
    """``model=tiny_code`` (a shipped checkpoint) with ``model.path`` pointing elsewhere would run the
    other checkpoint with the shipped one's name, context (``max_model_len``) and thread count: refuse."""
    m = cfg.model
    if m.name not in PACKAGED_MODELS or m.path is None:
        return
    shipped = PACKAGED_CHECKPOINTS / m.name
    if Path(str(m.path)).expanduser().resolve() != shipped.resolve():
        raise ConfigError(f"model.path={m.path} with model={m.name}: model={m.name} is the shipped checkpoint (its "
                          f"name, max_model_len and backend.num_threads); for your own checkpoint use "
                          f"model=hf model.path={m.path}")


def clock_kind(cfg: DictConfig) -> str:
    """``clock=auto`` resolved, and the combinations of clock, backend and time model checked."""
    kind = option_value(cfg.clock)
    sim = cfg.backend.name == "sim"
    if kind == "auto":
        kind = "virtual" if sim else "wall"
    tm = cfg.time_model.name
    if sim and kind == "wall":
        raise ConfigError("backend=sim has no wall time to measure: use clock=virtual (or clock=auto)")
    if kind == "wall" and tm != "measured":
        raise ConfigError(f"time_model={tm} prices steps on the virtual clock: add clock=virtual "
                          "(on clock=wall steps are timed as they run: time_model=measured)")
    if kind == "virtual" and tm == "measured":
        raise ConfigError("clock=virtual needs a time model that predicts step times: time_model=roofline "
                          "(hardware=<name>) or time_model=profile time_model.path=<profile.json>")
    return kind


def option_value(v):
    """An enum-typed config value's ``.value``; anything else as it is."""
    return getattr(v, "value", v)


DP_ATTENTION_TIME_MODELS = ("auto", "calibrated_roofline")  # the step pricer's (servelab.sim.step_pricer)


PIPELINE_TIME_MODELS = ("auto", "op_profile", "calibrated_roofline")  # the step pricer's (servelab.sim.pipeline)


def check_pipeline_priced(cfg: DictConfig) -> None:
    """``pipeline_parallel_size > 1`` on the simulator is priced stage by stage by the step pricer's time models;
    another is one line naming the key."""
    pp = cfg.get("pipeline_parallel_size", 1)
    time_model = cfg.time_model.name if "time_model" in cfg else "auto"
    if pp > 1 and cfg.backend.name == "sim" and time_model not in PIPELINE_TIME_MODELS:
        raise ConfigError(f"pipeline_parallel_size={pp} with time_model={time_model}: the stages and batches in flight "
                          f"are priced by time_model={', '.join(PIPELINE_TIME_MODELS)} only (the per-operator step pricer)")


def check_data_parallel_attention(cfg: DictConfig) -> None:
    """``data_parallel_attention=true`` is priced by the simulator only, beside expert parallelism on a
    MoE model (the MoE layers' all-to-all is where the data-parallel ranks meet); anything else is one line."""
    if not cfg.get("data_parallel_attention", False):
        return
    key = "data_parallel_attention=true"
    if cfg.backend.name != "sim":
        raise ConfigError(f"{key} is priced by the simulator only (backend=sim); backend={cfg.backend.name} runs "
                          "attention tensor-parallel")
    ep = cfg.get("expert_parallel_size", 1)
    if not cfg.model.get("num_experts") and cfg.model.get("path") is None:
        raise ConfigError(f"{key} needs a mixture-of-experts model (model={cfg.model.name} is dense)")
    if ep < 2:
        raise ConfigError(f"{key} needs expert_parallel_size > 1 (got {ep}): the data-parallel attention ranks "
                          "meet in the MoE layers' expert-parallel all-to-all")
    exchange = cfg.sim.get("moe", {}).get("ep_exchange", "all_to_all")
    if exchange != "all_to_all":
        raise ConfigError(f"{key} needs sim.moe.ep_exchange=all_to_all (got {exchange}): with each rank holding "
                          "its own tokens an all-reduce cannot gather them")
    if cfg.get("pipeline_parallel_size", 1) > 1:
        raise ConfigError(f"{key} with pipeline_parallel_size={cfg.pipeline_parallel_size}: not priced")
    time_model = cfg.time_model.name if "time_model" in cfg else "auto"
    if time_model not in DP_ATTENTION_TIME_MODELS:
        raise ConfigError(f"{key} with time_model={time_model}: priced by time_model="
                          f"{' or '.join(DP_ATTENTION_TIME_MODELS)} only (the per-operator step pricer)")
