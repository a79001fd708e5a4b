"""``kv_tiers`` and ``kv_tier_policy`` of a run's config, checked: the tiers (:func:`kv_tier_specs`) and
whether they select the tiered store (:func:`tiers_wanted`: the ``kv_connector=tiers`` shorthand, built
by :func:`servelab.kv.builtins.tiers`, beside any other connector through ``multi``).

On an engine that computes tokens the tiers hold real bytes (:mod:`servelab.kv.tiers.pools`).
Bad input is one :class:`ConfigError` line naming the key: a tier smaller than one block, a
shared tier outside a simulated cluster (:mod:`servelab.kv.tiers.shared`), a disk tier whose ``kv_tiers.disk_dir`` is not
writable, a policy that stores with no tier to store in, a real engine over several ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, open_dict

from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import KVTierPolicy, TierSpec
from servelab.kv.tiers.shared import SharedTiers


def _value(x: Any) -> Any:
    return getattr(x, "value", x)


def kv_tier_specs(cfg: DictConfig, bytes_per_block: int, shared: SharedTiers | None = None) -> tuple[TierSpec, ...]:
    """The tiers ``cfg.kv_tiers.tiers`` configures, each sized in blocks of ``bytes_per_block``; a
    ``shared`` one priced over ``shared``'s network link (None: not in a simulated cluster: refused)."""
    node = cfg.get("kv_tiers")
    if node is None:
        return ()
    specs = []
    for i, tier in enumerate(node.tiers):
        key = f"kv_tiers.tiers.{i}"
        kind = str(_value(tier.kind))
        for field in ("read_gb_s", "write_gb_s"):
            if not float(tier[field]) > 0:
                raise ConfigError(f"{key}.{field}={tier[field]}: a {kind} tier's link needs a bandwidth above 0")
        if float(tier.latency_us) < 0:
            raise ConfigError(f"{key}.latency_us={tier.latency_us}: must be 0 or more")
        num_blocks = int(float(tier.capacity_gib) * 2**30 // bytes_per_block) if bytes_per_block else 0
        if num_blocks < 1:
            raise ConfigError(f"{key}.capacity_gib={tier.capacity_gib}: below one KV block ({bytes_per_block} bytes "
                              f"= {bytes_per_block / 2**30:.6f} GiB per GPU); raise it or drop the tier")
        if tier.shared and shared is None:
            raise ConfigError(f"{key}.shared=true: a single-engine run has no replicas to share a tier with; use "
                              "shared=false, or a simulated cluster (backend=sim cluster.replicas=N)")
        spec = TierSpec(kind, float(tier.capacity_gib), float(tier.read_gb_s), float(tier.write_gb_s),
                        float(tier.latency_us), bool(tier.shared), num_blocks)
        specs.append(shared.priced(spec) if spec.shared and shared is not None else spec)
    return tuple(specs)


def tiers_wanted(cfg: DictConfig, policy_cls: type[KVTierPolicy], tiers: tuple[TierSpec, ...]) -> bool:
    """Whether ``kv_tiers`` / ``kv_tier_policy`` ask for the tiered store (``kv_connector=tiers``'s
    shorthand): a policy that stores, over at least one tier (a storing policy without one is refused)."""
    if not policy_cls.stores:
        return False
    if not tiers:
        raise ConfigError(f"kv_tier_policy={cfg.kv_tier_policy.name} stores KV below the GPU but kv_tiers has no tier: "
                          "add kv_tiers=host (or host_disk), or kv_tier_policy=none")
    return True


def default_disk_dir(cfg: DictConfig, output_dir: Path) -> None:
    """A disk tier's files go under the run's folder (``<output_dir>/kv_tier_disk``, removed at the end)
    unless ``kv_tiers.disk_dir`` names another folder."""
    node = cfg.get("kv_tiers")
    if node is None or node.get("disk_dir") or not any(str(_value(t.kind)) == "disk" for t in node.tiers):
        return
    with open_dict(node):
        node.disk_dir = str(Path(output_dir) / "kv_tier_disk")
