"""Pure-torch reference for split-KV decode attention (fp64 math by default).

`gather_kv` turns the paged cache into each sequence's contiguous K and V;
`decode_attention_ref` is softmax(q K^T * sm_scale) V per sequence with GQA, plus the
log-sum-exp, optionally over a token range only (one split's partial result);
`combine_ref` is the LSE combine in torch, for checking the algebra apart from the kernel.
"""

from __future__ import annotations

import math

import torch


def gather_kv(k_cache, v_cache, block_table, seq_lens):
    """[(K_b [L_b, H_kv, D], V_b [L_b, H_kv, D]) for each sequence b], from a paged or contiguous cache."""
    out = []
    for b, length in enumerate(seq_lens.tolist()):
        if block_table is None:
            out.append((k_cache[b, :length], v_cache[b, :length]))
            continue
        page_size = k_cache.shape[1]
        tok = torch.arange(length, device=k_cache.device)
        pages = block_table[b].long()[tok // page_size]
        slots = tok % page_size
        out.append((k_cache[pages, slots], v_cache[pages, slots]))
    return out


def decode_attention_ref(q, k_cache, v_cache, block_table, seq_lens, *, sm_scale=None,
                         token_ranges=None, dtype=torch.float64):
    """(out [B, H_q, D], lse [B, H_q]) computed in `dtype` from the given (already rounded) inputs.

    token_ranges: optional [(start, end)] per sequence; attention over those tokens only
    (what one split of stage 1 computes).
    """
    batch, q_heads, head_dim = q.shape
    kv_heads = k_cache.shape[2]
    group = q_heads // kv_heads
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)
    outs, lses = [], []
    for b, (k, v) in enumerate(gather_kv(k_cache, v_cache, block_table, seq_lens)):
        if token_ranges is not None:
            start, end = token_ranges[b]
            k, v = k[start:end], v[start:end]
        k = k.to(dtype).repeat_interleave(group, dim=1)   # [L, H_q, D]
        v = v.to(dtype).repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,lhd->hl", q[b].to(dtype), k) * sm_scale
        lse = torch.logsumexp(scores, dim=1)
        outs.append(torch.einsum("hl,lhd->hd", torch.exp(scores - lse[:, None]), v))
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def combine_ref(partial_o, partial_lse, uniform=False):
    """Combine split results [S, ..., D] and [S, ...] by LSE weights (or, wrongly, uniformly)."""
    if uniform:
        return partial_o.mean(dim=0), None
    lse = torch.logsumexp(partial_lse, dim=0)
    weights = torch.exp(partial_lse - lse)
    return (weights[..., None] * partial_o).sum(dim=0), lse
