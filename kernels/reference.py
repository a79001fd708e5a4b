"""Pure-torch paged KV-cache operations: the CPU path and the reference every kernel is tested against.

Cache layout (one layer): ``k_cache``/``v_cache`` of shape ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token at logical position ``p`` of a sequence lives in physical block ``block_table[p // block_size]``
at offset ``p % block_size``; its *slot* is ``block * block_size + offset``.

Varlen query layout: all query tokens of a step are flattened into ``q[T, num_heads, head_dim]``;
sequence ``b`` owns rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` and those rows are the *last*
``q_len_b`` positions of its ``context_lens[b]`` tokens (the cache already holds all of them,
including this step's, because the KV store runs first). Attention is causal.

Quantised caches (``kv_cache_dtype=int8|fp8_e4m3``): every operation takes optional ``k_scale`` /
``v_scale`` of shape ``[num_blocks, block_size, num_kv_heads]`` (float32, see
:mod:`servelab.kernels.kv_quant`). Given, ``store_kv`` quantises what it writes and attention
dequantises what it reads; absent, the caches hold K/V in their own dtype as before.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .kv_quant import bytes_view, dequantize_kv, quantize_kv


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write ``key``/``value`` ``[T, num_kv_heads, head_dim]`` into the cache slots ``slot_mapping[T]``.

    Slot ``-1`` means "do not store" (e.g. a padded or already-cached token). Writes in place.
    With ``k_scale``/``v_scale`` the values are quantised to the cache dtype and their scales stored.
    """
    valid = slot_mapping >= 0
    if not bool(valid.all()):
        key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    for src, cache, scales in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        flat = cache.view(-1, *cache.shape[2:])
        if scales is None:
            flat.index_copy_(0, slot_mapping, src.to(cache.dtype))
            continue
        q, s = quantize_kv(src, cache.dtype)
        bytes_view(flat).index_copy_(0, slot_mapping, bytes_view(q))
        scales.view(-1, scales.shape[2]).index_copy_(0, slot_mapping, s)


def gather_kv(cache: torch.Tensor, block_tables: torch.Tensor, max_context_len: int,
              scales: torch.Tensor | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Gather each sequence's first ``max_context_len`` cache positions: ``[B, max_context_len, kvh, d]``.

    Gathers whole blocks (one memcpy per block), then trims. Entries past a sequence's length
    are garbage and must be masked by the caller. With ``scales`` (a quantised cache) the result
    is dequantised to ``dtype``.
    """
    num_blocks_needed = -(-max_context_len // cache.shape[1])
    tables = block_tables[:, :num_blocks_needed].clamp_min(0)
    batch = tables.shape[0]
    if scales is None:
        gathered = cache[tables]  # [B, nblk, bs, kvh, d]
        return gathered.reshape(batch, -1, *cache.shape[2:])[:, :max_context_len]
    values = bytes_view(cache)[tables].view(cache.dtype).reshape(batch, -1, *cache.shape[2:])[:, :max_context_len]
    factors = scales[tables].reshape(batch, -1, scales.shape[2])[:, :max_context_len]
    return dequantize_kv(values, factors, dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    max_context_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention of ``q[T, H, d]`` over the paged cache; returns ``[T, H, d]``.

    Covers prefill, chunked prefill after cached tokens, and decode (``q_len == 1``) in one call.
    ``H`` must be a multiple of the cache's ``num_kv_heads`` (GQA). Decode rows and prompt
    chunks are attended separately, and sequences of similar length together, so no row is
    padded to a much longer one (padding is what this path pays for on CPU).
    """
    if max_query_len == 1:  # pure decode
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, max_context_len, scale,
                                      k_scale, v_scale)
    q_lens = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
    is_decode = q_lens == 1
    groups: list[tuple[torch.Tensor, str | None]]
    if not bool(is_decode.any()):
        groups = [(rows, None) for rows, _ in _length_buckets(q_lens, min_rows=2)]
    else:
        groups = [(is_decode.nonzero().squeeze(1), "decode")]
        prefill = (~is_decode).nonzero().squeeze(1)
        groups += [(prefill if rows is None else prefill[rows], None)
                   for rows, _ in _length_buckets(q_lens[prefill], min_rows=2)]
    if len(groups) == 1:
        return _padded_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, q_lens,
                                         max_query_len, max_context_len, scale, k_scale, v_scale)
    out = torch.empty_like(q)
    for seqs, kind in groups:
        sub_lens = q_lens[seqs]
        sub_cu = torch.zeros(len(seqs) + 1, dtype=cu_seqlens_q.dtype, device=q.device)
        torch.cumsum(sub_lens, 0, out=sub_cu[1:])
        total = int(sub_cu[-1])
        shift = torch.repeat_interleave((cu_seqlens_q[:-1][seqs] - sub_cu[:-1]).long(), sub_lens, output_size=total)
        rows = torch.arange(total, device=q.device) + shift
        sub_ctx = context_lens[seqs]
        if kind == "decode":
            out[rows] = _padded_decode_attention(q[rows], k_cache, v_cache, block_tables[seqs], sub_ctx,
                                                 int(sub_ctx.max()), scale, k_scale, v_scale)
        else:
            out[rows] = _padded_prefill_attention(q[rows], k_cache, v_cache, block_tables[seqs], sub_cu, sub_ctx,
                                                  sub_lens, int(sub_lens.max()), int(sub_ctx.max()), scale,
                                                  k_scale, v_scale)
    return out


def _padded_prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, q_lens, max_query_len,
                              max_context_len, scale, k_scale=None, v_scale=None):
    """Every sequence padded to the longest query and context; one SDPA call with a causal mask."""
    num_tokens, num_heads, head_dim = q.shape
    batch = context_lens.shape[0]
    device = q.device
    # Scatter the flat queries into [B, max_q] (row index of each token inside its sequence).
    seq_of_token = torch.repeat_interleave(torch.arange(batch, device=device), q_lens, output_size=num_tokens)
    row_of_token = torch.arange(num_tokens, device=device) - cu_seqlens_q[:-1][seq_of_token]
    q_padded = q.new_zeros(batch, max_query_len, num_heads, head_dim)
    q_padded[seq_of_token, row_of_token] = q

    keys = gather_kv(k_cache, block_tables, max_context_len, k_scale, q.dtype)
    values = gather_kv(v_cache, block_tables, max_context_len, v_scale, q.dtype)

    # Query row i of sequence b sits at absolute position ctx_b - q_len_b + i.
    q_pos = (context_lens - q_lens).unsqueeze(1) + torch.arange(max_query_len, device=device).unsqueeze(0)
    k_pos = torch.arange(max_context_len, device=device)
    mask = (k_pos.view(1, 1, -1) <= q_pos.unsqueeze(2)) & (k_pos.view(1, 1, -1) < context_lens.view(-1, 1, 1))
    mask[:, :, 0] = True  # padded query rows would otherwise be all -inf (NaN); they are dropped below

    out = F.scaled_dot_product_attention(
        q_padded.transpose(1, 2),
        keys.transpose(1, 2).to(q.dtype),
        values.transpose(1, 2).to(q.dtype),
        attn_mask=mask.unsqueeze(1),
        scale=scale,
        enable_gqa=num_heads != k_cache.shape[2],
    )
    return out.transpose(1, 2)[seq_of_token, row_of_token]


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence: ``q[B, H, d]`` attends to all ``context_lens[b]`` cached tokens.

    On CPU the cost is copying the gathered K/V, so sequences of similar length are batched
    together (a few length buckets) instead of padding every one to the longest context.
    """
    buckets = _length_buckets(context_lens)
    if buckets[0][0] is None:
        return _padded_decode_attention(q, k_cache, v_cache, block_tables, context_lens, max_context_len, scale,
                                        k_scale, v_scale)
    out = torch.empty_like(q)
    for rows, longest in buckets:
        out[rows] = _padded_decode_attention(q[rows], k_cache, v_cache, block_tables[rows], context_lens[rows],
                                             longest, scale, k_scale, v_scale)
    return out


def _length_buckets(lengths: torch.Tensor, max_buckets: int = 4, min_rows: int = 8):
    """Split rows into up to ``max_buckets`` groups of similar length: ``[(row_indices, max_len)]``.

    Groups are quantiles of the sorted lengths; one group when the batch is small or splitting
    would save less than a quarter of the padded work.
    """
    batch = lengths.shape[0]
    count = min(max_buckets, batch // min_rows)
    if count <= 1:
        return [(None, int(lengths.max()))]
    sorted_lens, order = torch.sort(lengths)
    bounds = [batch * i // count for i in range(count + 1)]
    maxima = [int(sorted_lens[bounds[i + 1] - 1]) for i in range(count)]
    padded = sum((bounds[i + 1] - bounds[i]) * maxima[i] for i in range(count))
    if padded > 0.75 * batch * maxima[-1]:
        return [(None, maxima[-1])]
    return [(order[bounds[i]:bounds[i + 1]], maxima[i]) for i in range(count)]


def _padded_decode_attention(q, k_cache, v_cache, block_tables, context_lens, max_context_len, scale,
                             k_scale=None, v_scale=None):
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    keys = gather_kv(k_cache, block_tables, max_context_len, k_scale, q.dtype)
    values = gather_kv(v_cache, block_tables, max_context_len, v_scale, q.dtype)
    mask = torch.arange(max_context_len, device=q.device).view(1, -1) < context_lens.view(-1, 1)
    out = F.scaled_dot_product_attention(
        q.unsqueeze(2),  # [B, H, 1, d]
        keys.transpose(1, 2).to(q.dtype),
        values.transpose(1, 2).to(q.dtype),
        attn_mask=mask.view(batch, 1, 1, -1),
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )
    return out.view(batch, num_heads, head_dim)


def contiguous_attention_reference(q, k, v, scale):
    """Dense causal attention of one sequence (``[L, H, d]`` each, GQA allowed); the test oracle."""
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    if num_heads != num_kv_heads:
        k = k.repeat_interleave(num_heads // num_kv_heads, dim=1)
        v = v.repeat_interleave(num_heads // num_kv_heads, dim=1)
    lq, lk = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    causal = torch.arange(lk).view(1, -1) <= (torch.arange(lq) + lk - lq).view(-1, 1)
    scores = scores.masked_fill(~causal, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(q.dtype)
