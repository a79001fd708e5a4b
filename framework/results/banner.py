"""The start-up banner: what is about to run and where its results go, before the first step."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from rich.console import Console

from servelab.config.engine import engine_label
from servelab.kv.tiers.store import TieredKVConnector


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _clock_text(cfg: DictConfig, kind: str) -> str:
    """``clock=wall``, or ``clock=auto (wall)``: the setting as configured, then what it resolved to."""
    configured = getattr(cfg.clock, "value", cfg.clock)
    return f"clock={configured}" + (f" ({kind})" if kind != configured else "")


def banner_lines(cfg: DictConfig, stack, output_dir: Path, logger_where: str) -> list[tuple[str, str]]:
    """(label, text) rows: model, dtype, device/backend, KV pool, the stack, results, W&B."""
    executor, limits = stack.executor, stack.limits
    dtype = getattr(cfg.model.dtype, "value", cfg.model.dtype)
    if not executor.computes_tokens:
        device = f"sim (no tensors) priced as {cfg.hardware.name}"
        rule = cfg.hardware.get("pricing_rule")
        if rule:
            device += f" ({rule})"
    else:
        where = executor.describe()
        dev = where.get("device") or cfg.backend.device
        ops = where.get("attention") or getattr(cfg.attention_backend, "value", "auto")
        device = f"{cfg.backend.name} on {dev}, attention {ops}"
    if cfg.tensor_parallel_size > 1:
        device += f", tensor parallel x{cfg.tensor_parallel_size}"
    if cfg.get("expert_parallel_size", 1) > 1:
        device += f", experts split x{cfg.expert_parallel_size}"
    if cfg.get("pipeline_parallel_size", 1) > 1:
        device += f", pipeline stages x{cfg.pipeline_parallel_size}"
    blocks, bpb = executor.num_kv_blocks, executor.bytes_per_block
    auto = " (block_size=auto)" if getattr(stack, "block_size_auto", None) else ""
    pool = (f"{blocks:,} blocks x {limits.block_size}{auto} = {blocks * limits.block_size:,} tokens, "
            f"{_gib(blocks * bpb)}")
    kv_dtype = getattr(cfg.get("kv_cache_dtype", "auto"), "value", cfg.get("kv_cache_dtype", "auto"))
    if kv_dtype != "auto":
        pool += f" ({kv_dtype} values + a float32 scale per token and KV head)"
    swap = executor.num_swap_blocks
    if swap:
        pool += f"; host swap pool {swap:,} blocks ({_gib(swap * bpb)})"
    prefix = cfg.allocator.get("prefix_caching")
    stack_text = (f"scheduler={cfg.scheduler.name} allocator={cfg.allocator.name}"
                  + (f" (prefix_caching={str(prefix).lower()}"
                     + (f", evictor={cfg.evictor.name})" if prefix else ")") if prefix is not None else "")
                  + f" preemption={cfg.preemption.name} drafter={cfg.drafter.name}"
                  + f" chunked_prefill={str(cfg.chunked_prefill).lower()}"
                  + ("" if cfg.chunked_prefill else
                     f" ({getattr(cfg.get('non_chunked_schedule'), 'value', cfg.get('non_chunked_schedule'))})")
                  + (f" num_scheduler_steps={cfg.num_scheduler_steps}" if cfg.get("num_scheduler_steps", 1) > 1 else "")
                  + f" {_clock_text(cfg, stack.clock_kind)} time_model="
                  + getattr(stack.time_model, "label", cfg.time_model.name))
    model = cfg.model.name + (f" ({cfg.model.path})" if cfg.model.path else "")
    quant = getattr(cfg.model.get("quantization", "none"), "value", cfg.model.get("quantization", "none"))
    if quant != "none":
        dtype += f", {quant} decoder linears (embeddings and LM head in {dtype})"
    rows = [("model", f"{model}, {dtype}"), ("device", device), ("KV pool", pool), ("stack", stack_text)]
    moe = getattr(stack.time_model, "moe_label", None)
    if moe:  # a MoE model: how the time model prices the experts a step touches
        rows.append(("MoE", moe))
    pipeline = getattr(stack.time_model, "pipeline_label", None)
    memory = getattr(executor, "memory", None)
    if pipeline and memory is not None:  # PP on the simulator: the stages, and what one rank of a stage holds
        rows.append(("pipeline", f"{pipeline}; per rank {memory.weight_bytes / 1e9:.1f} GB weights and "
                                 f"{blocks * bpb / 1e9:.1f} GB KV pool (its stage's layers only; the fullest stage's)"))
    if "engine" in cfg:  # every run names the engine it prices (the default: servelab)
        rows.append(("engine", engine_label(cfg.engine)))
    tiers = tiers_line(cfg, stack.engine.connector, bpb)
    if tiers:
        rows.append(("KV tiers", tiers))
    return rows + [("workload", f"{cfg.workload.name}"), ("results", str(output_dir)), ("W&B", logger_where)]


def tiers_line(cfg: DictConfig, connector, bytes_per_block: int) -> str | None:
    """The KV tiers row (None: no tiers configured): the policy that runs, then each tier's size in
    blocks and its link, and how loads meet the steps; tiers the policy leaves unused are said to be."""
    node = cfg.get("kv_tiers")
    if node is None or not node.tiers:
        return None
    policy = cfg.kv_tier_policy.name
    if not isinstance(connector, TieredKVConnector):  # the policy stores nothing: no store was built
        kinds = ", ".join(str(getattr(t.kind, "value", t.kind)) for t in node.tiers)
        tiers = "tiers stay" if len(node.tiers) > 1 else "tier stays"
        return f"kv_tier_policy={policy} stores nothing: the {kinds} {tiers} unused (kv_tiers={node.name})"
    parts = [f"{t.kind}{' (shared)' if t.shared else ''} {t.num_blocks:,} blocks ({_gib(t.num_blocks * bytes_per_block)} per GPU), "
             f"{t.read_gb_s:g}/{t.write_gb_s:g} GB/s read/write" for t in connector.tiers]
    load = getattr(node.load, "value", node.load)
    return f"kv_tier_policy={policy} over {'; '.join(parts)}; kv_tiers.load={load}"


def cluster_line(cfg: DictConfig, cluster) -> tuple[str, str]:
    """The cluster row: how many replicas of which shape, the router, and the KV links."""
    groups: dict[tuple, int] = {}
    for r in cluster.replicas:
        key = (r.role, r.tensor_parallel_size, r.hardware, r.engine.allocator.num_blocks)
        groups[key] = groups.get(key, 0) + 1
    parts = [f"{n} x {role} (TP {tp} on {hw}, {blocks:,} KV blocks)" for (role, tp, hw, blocks), n in groups.items()]
    text = ", ".join(parts) + f"; router={cfg.router.name}"
    if cluster.links:
        kinds = sorted({link.kind for link in cluster.links.values()})
        overlap = "overlapped with prefill" if cluster.kv.overlap else "after prefill"
        text += f"; KV moves over {'/'.join(kinds)} links, {overlap}"
    return "cluster", text


def print_banner(cfg: DictConfig, stack, output_dir: Path, logger_where: str, console: Console | None = None,
                 cluster=None) -> None:
    # soft_wrap: paths stay on one line (copyable) whatever the terminal width
    console = console or Console(soft_wrap=True, highlight=False)
    lines = banner_lines(cfg, stack, output_dir, logger_where)
    if cluster is not None:
        lines.insert(3, cluster_line(cfg, cluster))
    for label, text in lines:
        console.print(f"[bold]{label:>8}[/bold]  {text}", soft_wrap=True)
