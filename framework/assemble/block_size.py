"""``block_size=auto``: the KV block size chosen from the workload's lengths and the attention backend.

The model. Candidates are the powers of two in 8..128 (and <= ``max_num_batched_tokens``) that the
resolved attention backend supports: torch any; triton what ``kernels.triton_ops.check_supported``
accepts for the model's head dim; ``backend=sim`` vLLM's CUDA set {8, 16, 32, 64, 128} (the simulator
has no kernel, but it models a GPU serving stack). Each candidate ``bs`` gets a score, lowest wins
(ties: the smaller size), from the first ``SAMPLE`` requests (prompt length P, output length O =
``max_tokens``: exact for ``ignore_eos`` requests, an upper bound otherwise):

- waste(bs): a sequence holds ceil(L/bs) blocks at each of its O steps, L = P .. P+O-1; waste is the
  unused slots over the allocated ones, summed over every (sequence, step): the mean fraction of the
  KV pool lost to partly filled last blocks when every sequence decodes one token per step. Exact over
  the actual lengths (a closed form per sequence), not bs/2.
- overhead(bs) = BLOCK_COST / bs: each block costs bookkeeping (a block-table entry, one iteration of
  the paged-attention loop, an allocator call) counted as BLOCK_COST = 1/8 of a token's KV slot. With
  waste ~ bs / (2 L) the optimum is near sqrt(2 BLOCK_COST L): 16 for L ~ 1000 tokens, 32 for ~4000.
- prefix(bs), only with ``allocator.prefix_caching=true``: a request's shared prefix S (its longest
  common prefix with an earlier request of the sample with the same ``cache_salt``, at most P - 1)
  is cached in whole blocks only, so S mod bs tokens are computed and stored again; prefix(bs) is
  those tokens over all prompt tokens, weighted PREFIX_WEIGHT = 1 (a recomputed prompt token costs
  as much as a wasted slot). S is found by chained hashes of g-token chunks (g the smallest
  candidate) and extended token by token within the next chunk against one earlier request holding
  the match; hashing stops after PREFIX_TOKEN_BUDGET prompt tokens.

score(bs) = waste(bs) + overhead(bs) + PREFIX_WEIGHT x prefix(bs).
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
from dataclasses import dataclass

import numpy as np
from omegaconf import DictConfig, read_write

from servelab.core.errors import ConfigError
from servelab.core.shapes import ModelShape
from servelab.workloads.build import build_requests
from servelab.workloads.text import checkpoint_text

log = logging.getLogger(__name__)

SIZE_RANGE = tuple(2 ** i for i in range(3, 8))  # 8 .. 128: the sane range
SIM_SIZES = (8, 16, 32, 64, 128)  # vLLM's CUDA block sizes: what the simulated GPU stack offers
SAMPLE = 10_000
BLOCK_COST = 0.125
PREFIX_WEIGHT = 1.0
PREFIX_TOKEN_BUDGET = 4_000_000


@dataclass(frozen=True)
class LengthProfile:
    """Per request: prompt length, output length, shared-prefix length (None: prefix sharing not measured)."""

    prompt: np.ndarray
    output: np.ndarray
    shared: np.ndarray | None = None


@dataclass(frozen=True)
class Choice:
    chosen: int
    reason: str
    scores: dict[int, float]


def resolve_block_size(cfg: DictConfig, shape: ModelShape, requests=None) -> Choice | None:
    """With ``block_size=auto``: choose, log the reason, and set ``cfg.block_size`` to the choice; else
    None. ``requests``: the run's (built from ``cfg.workload`` when None)."""
    if cfg.block_size != "auto":
        return None
    backend, supported = supported_sizes(cfg, shape.head_dim)
    supported = tuple(bs for bs in supported if bs in SIZE_RANGE)
    sizes = tuple(bs for bs in supported if bs <= cfg.max_num_batched_tokens)
    if not sizes:
        budget = f" up to max_num_batched_tokens={cfg.max_num_batched_tokens}" if supported else ""
        raise ConfigError(f"block_size=auto: {backend} supports no block size in {SIZE_RANGE[0]}..{SIZE_RANGE[-1]}"
                          f"{budget}; set block_size=<int>")
    if requests is None:
        requests = workload_requests(cfg, shape)
    prefix = bool(cfg.allocator.get("prefix_caching", False))
    profile = length_profile(requests, min(sizes) if prefix else None)
    choice = choose_block_size(profile, sizes, f"{backend}, {len(profile.prompt)} requests of "
                                               f"workload={cfg.workload.name}")
    log.info("%s", choice.reason)
    with read_write(cfg):
        cfg.block_size = choice.chosen
    return choice


def supported_sizes(cfg: DictConfig, head_dim: int) -> tuple[str, tuple[int, ...]]:
    """(the backend as the reason names it, the sizes in SIZE_RANGE it supports for ``head_dim``)."""
    if cfg.backend.name == "sim":
        return "backend=sim (vLLM's CUDA sizes)", SIM_SIZES
    name = getattr(cfg.attention_backend, "value", cfg.attention_backend)
    if name == "auto":
        device = str(cfg.backend.device)
        cuda = device.startswith("cuda") or (device == "auto" and _cuda_available())
        name = "triton" if cuda and importlib.util.find_spec("triton") is not None else "torch"
    if name == "torch":
        return "attention_backend=torch", SIZE_RANGE
    try:
        from servelab.kernels.triton_ops import check_supported  # noqa: PLC0415 - triton
    except ImportError:
        raise ConfigError("block_size=auto with attention_backend=triton: the `triton` package is not "
                          "installed") from None
    return f"attention_backend=triton (head_dim={head_dim})", tuple(
        bs for bs in SIZE_RANGE if _accepts(check_supported, head_dim, bs))


def _accepts(check, head_dim: int, bs: int) -> bool:
    try:
        check(head_dim, bs)
    except ValueError:
        return False
    return True


def workload_requests(cfg: DictConfig, shape: ModelShape):
    """The requests ``cfg.workload`` gives this model, built before the stack (as the run would)."""
    max_model_len = min(cfg.max_model_len, shape.max_position_embeddings)
    return build_requests(cfg.workload, shape.vocab_size, max_model_len, checkpoint_text(cfg))


def length_profile(requests, chunk: int | None = None) -> LengthProfile:
    """The first SAMPLE requests' lengths; with ``chunk`` also their shared prefixes (see the module)."""
    sample = list(itertools.islice(requests, SAMPLE))
    prompt = np.array([r.prompt_len for r in sample], dtype=np.int64)
    output = np.array([r.max_tokens for r in sample], dtype=np.int64)
    return LengthProfile(prompt, output, None if chunk is None else shared_prefixes(sample, chunk))


def shared_prefixes(requests, chunk: int) -> np.ndarray:
    """Each request's shared prefix length (see the module); 0 past PREFIX_TOKEN_BUDGET."""
    seen: dict[int, tuple] = {}  # chained hash of a prompt's first k chunks -> a prompt that has them
    shared, budget = np.zeros(len(requests), dtype=np.int64), PREFIX_TOKEN_BUDGET
    for i, r in enumerate(requests):
        p = r.prompt_token_ids
        budget -= len(p)
        if budget < 0:
            break
        h, k, holder, matching = hash(r.cache_salt), 0, None, True
        for k in range(len(p) // chunk):
            h = hash((h, p[k * chunk:(k + 1) * chunk]))
            if matching and h in seen:
                holder = seen[h]
                continue
            if matching:
                matching, shared[i] = False, k * chunk + _common(p, holder, k * chunk, chunk)
            seen.setdefault(h, p)
        else:
            if matching and holder is not None:
                full = len(p) // chunk * chunk
                shared[i] = full + _common(p, holder, full, chunk)
        shared[i] = min(shared[i], max(len(p) - 1, 0))
    return shared


def _common(p: tuple, q: tuple | None, start: int, limit: int) -> int:
    """Tokens ``p`` and ``q`` share from ``start`` on (at most ``limit``)."""
    n = 0
    if q is not None:
        while n < limit and start + n < min(len(p), len(q)) and p[start + n] == q[start + n]:
            n += 1
    return n


def choose_block_size(profile: LengthProfile, sizes, where: str = "") -> Choice:
    """The lowest-scoring size of ``sizes`` (see the module) and the reason: each term for the choice and
    the sizes either side of it. ``where`` names the backend and the workload in the reason."""
    sizes = sorted(sizes)
    if not sizes:
        raise ConfigError(f"block_size=auto: no candidate block size ({where or 'no backend named'})")
    if len(profile.prompt) == 0:
        chosen = 16 if 16 in sizes else sizes[0]
        return Choice(chosen, f"block_size=auto -> {chosen}: the workload has no requests ({where})", {})
    prompt_tokens = profile.prompt.sum()
    sharing = int(np.count_nonzero(profile.shared)) if profile.shared is not None else 0
    terms = {}  # size -> (waste, overhead, prefix loss in tokens per sharing request, score)
    for bs in sizes:
        w, o, p = waste(profile, bs), BLOCK_COST / bs, prefix_loss(profile, bs)
        terms[bs] = (w, o, p * prompt_tokens / max(sharing, 1), w + o + PREFIX_WEIGHT * p)
    chosen = min(sizes, key=lambda bs: (terms[bs][3], bs))
    i = sizes.index(chosen)
    around = sizes[max(i - 1, 0):i] + sizes[i + 1:i + 2]

    def figures(k: int, fmt: str) -> str:
        others = ", ".join(f"{bs}: {terms[bs][k]:{fmt}}" for bs in around)
        return f"{terms[chosen][k]:{fmt}}" + (f" ({others})" if others else "")

    parts = [f"KV waste {figures(0, '.1%')}", f"block overhead {figures(1, '.1%')}"]
    if profile.shared is not None:
        parts.append(f"prefix loss {figures(2, '.1f')} tokens per request with a shared prefix ({sharing})")
    parts.append(f"score {figures(3, '.2%')}")
    reason = (f"block_size=auto -> {chosen} of {'/'.join(map(str, sizes))} ({where}; mean prompt "
              f"{profile.prompt.mean():.0f}, output {profile.output.mean():.0f} tokens): {', '.join(parts)}")
    return Choice(chosen, reason, {bs: t[3] for bs, t in terms.items()})


def waste(profile: LengthProfile, bs: int) -> float:
    """Unused over allocated KV slots, summed over every sequence's steps at lengths P .. P+O-1."""
    first = profile.prompt
    last = profile.prompt + np.maximum(profile.output, 1) - 1
    used = ((first + last) * (last - first + 1) / 2).sum()
    allocated = bs * (_blocks_upto(last, bs) - _blocks_upto(first - 1, bs)).sum()
    return float(1 - used / allocated) if allocated else 0.0


def _blocks_upto(n: np.ndarray, bs: int) -> np.ndarray:
    """sum over L = 1..n of ceil(L / bs) (0 for n <= 0)."""
    n = np.maximum(n, 0).astype(np.float64)
    q, r = np.floor_divide(n, bs), np.mod(n, bs)
    return bs * q * (q + 1) / 2 + r * (q + 1)


def prefix_loss(profile: LengthProfile, bs: int) -> float:
    """Shared-prefix tokens a block-granular cache cannot reuse, over all prompt tokens (0 unmeasured)."""
    if profile.shared is None or not profile.prompt.sum():
        return 0.0
    return float((profile.shared % bs).sum() / profile.prompt.sum())


def _cuda_available() -> bool:
    import torch  # noqa: PLC0415 - only for the real model's attention backend: the simulator never loads torch here

    return torch.cuda.is_available()
