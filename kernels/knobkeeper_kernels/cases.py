"""Random decode-attention inputs for checks: a paged (or contiguous) KV cache whose unused
slots are NaN, so a kernel that reads outside a sequence poisons its own output.

Shared by tests/test_kernels.py (CPU interpreter) and gpu_check.py (CUDA): the same cases,
built on the CPU from a seeded generator (the same numbers on every machine), then moved.
"""

from __future__ import annotations

import math

import torch


def make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=torch.float32, seed=0, device="cpu"):
    """(q, k_cache, v_cache, block_table, seq_lens); page_size=None: contiguous [B, L, H_kv, D].

    Paged: [num_pages, page_size, H_kv, D] with pages shuffled as an engine's allocator leaves
    them, 3 spare pages nobody owns, and block_table [B, pages_per_seq] int32.
    """
    gen = torch.Generator().manual_seed(seed)
    batch, max_len = len(seq_lens), max(seq_lens)
    q = torch.randn(batch, q_heads, head_dim, generator=gen).to(dtype)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    pages_per_seq = 1 if page_size is None else -(-max_len // page_size)
    span = max_len if page_size is None else pages_per_seq * page_size
    outside = torch.arange(span)[None, :] >= lens[:, None]          # [B, span]: past each sequence's end
    dense = []
    for _ in "kv":
        x = torch.randn(batch, span, kv_heads, head_dim, generator=gen)
        x[outside] = math.nan
        dense.append(x)
    if page_size is None:
        k, v = (x.to(dtype).to(device) for x in dense)
        return q.to(device), k, v, None, lens.to(device)
    num_pages = batch * pages_per_seq + 3
    block_table = torch.randperm(num_pages, generator=gen)[: batch * pages_per_seq].view(batch, pages_per_seq)
    caches = []
    for x in dense:
        cache = torch.full((num_pages, page_size, kv_heads, head_dim), math.nan)
        cache[block_table] = x.view(batch, pages_per_seq, page_size, kv_heads, head_dim)
        caches.append(cache.to(dtype).to(device))
    return q.to(device), caches[0], caches[1], block_table.to(torch.int32).to(device), lens.to(device)
