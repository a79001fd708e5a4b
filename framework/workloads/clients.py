"""Who sends each request of a generated or replayed workload: ``workload.clients``.

A list of ``{id, share, rate, prompt_len, output_len}`` (``servelab.config.workloads.ClientConfig``):

- ``share``: each request's client is drawn independently with probability share / sum(shares);
- ``rate`` (requests/s, Poisson arrivals only): every client is its own Poisson stream. The
  streams are merged by arrival and the workload keeps its ``num_requests``: the merge of
  independent Poisson streams is one Poisson stream at the summed rate whose arrivals belong to
  client c with probability rate_c / sum(rates), so that is how it is drawn (``workload.rate``
  is then not used);
- neither, on every client: equal shares.

Client draws use their own generator, seeded by (workload seed, :data:`CLIENT_STREAM`), so a
workload without clients is exactly what it was before clients existed, and one with clients
keeps the same prompts and lengths (with ``rate``, the same arrival gaps rescaled to the summed
rate). Errors are one line naming ``workload.clients[i].<field>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from servelab.core.errors import ConfigError

CLIENT_STREAM = 0x636C69  # "cli": the generator of client draws, apart from the workload's own


@dataclass(frozen=True)
class Client:
    id: str
    share: float | None = None
    rate: float | None = None
    prompt_len: object = None  # a LengthConfig replacing workload.prompt_len (synthetic only)
    output_len: object = None  # ... workload.output_len


def parse_clients(cfg, no_rates: str | None = None, lengths: bool = False) -> list[Client]:
    """``cfg.clients`` checked ([] when unset). ``no_rates``: why per-client rates do not apply
    here (None: they do, the workload has Poisson arrivals); ``lengths``: whether per-client
    lengths apply (``workload=synthetic``)."""
    entries = getattr(cfg, "clients", None) or []
    clients: list[Client] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        key = f"workload.clients[{i}]"
        cid = entry.get("id")
        if not isinstance(cid, str) or not cid:
            raise ConfigError(f"{key}.id={cid!r}: every client needs a non-empty string id")
        if cid in seen:
            raise ConfigError(f"{key}.id={cid!r} repeats workload.clients[{seen[cid]}].id: ids must be unique")
        seen[cid] = i
        share, rate = (_positive(entry.get(f), f"{key}.{f}") for f in ("share", "rate"))
        if share is not None and rate is not None:
            raise ConfigError(f"{key}: give share or rate, not both")
        if rate is not None and no_rates:
            raise ConfigError(f"{key}.rate: {no_rates}; give share instead")
        for name in ("prompt_len", "output_len"):
            if entry.get(name) is not None and not lengths:
                raise ConfigError(f"{key}.{name}: per-client lengths apply only to workload=synthetic")
        clients.append(Client(cid, share, rate, entry.get("prompt_len"), entry.get("output_len")))
    modes = ["rate" if c.rate is not None else "share" if c.share is not None else None for c in clients]
    for i, mode in enumerate(modes):
        if mode != modes[0]:
            field = mode or "share/rate"
            raise ConfigError(f"workload.clients[{i}].{field}: mixes {modes[0] or 'neither'} with {mode or 'neither'}; "
                              "every client gives a share, or every client gives a rate, or none gives either")
    return clients


def rates_unless_all_at_once(cfg) -> str | None:
    """``parse_clients``' ``no_rates`` for a workload with ``workload.arrival``."""
    arrival = getattr(cfg.arrival, "value", cfg.arrival)
    if arrival == "poisson":
        return None
    return f"workload.arrival={arrival} has no rate to split into per-client streams"


def _positive(value, key: str) -> float | None:
    if value is None:
        return None
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"{key}={value:g} must be > 0")
    return value


def summed_rate(clients: list[Client]) -> float | None:
    """The merged stream's rate when the clients give rates, else None (the workload's own rate)."""
    return sum(c.rate for c in clients if c.rate is not None) if clients and clients[0].rate is not None else None


def draw_clients(clients: list[Client], n: int, seed: int) -> np.ndarray | None:
    """Each of ``n`` requests' client (an index into ``clients``), or None without clients."""
    if not clients:
        return None
    weights = np.array([c.rate if c.rate is not None else c.share if c.share is not None else 1.0
                        for c in clients])
    rng = np.random.default_rng([int(seed), CLIENT_STREAM])
    return rng.choice(len(clients), size=n, p=weights / weights.sum())


def client_rng(seed: int, index: int, purpose: int) -> np.random.Generator:
    """A generator of client ``index``'s own draws: ``purpose`` 1 = its prompts' tokens, 2 = its lengths."""
    return np.random.default_rng([int(seed), CLIENT_STREAM, index + 1, purpose])


def client_ids(clients: list[Client], owners: np.ndarray | None, n: int) -> list[str | None]:
    """Each request's ``client_id`` (all None without clients)."""
    if owners is None:
        return [None] * n
    names = [c.id for c in clients]
    return [names[k] for k in owners.tolist()]
