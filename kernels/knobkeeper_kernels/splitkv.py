"""Split-KV decode attention in Triton, with an exact log-sum-exp combine.

Read top to bottom:

1. The split rule (`num_splits`, `split_bounds`): how many splits S the knob
   KNOBKEEPER_SPLITKV_TARGET_CTAS asks for, and which KV blocks each split covers.
2. Stage 1 (`_splitkv_stage1`): a grid of B x H_kv x S programs. Each program reads
   one split of one sequence's K and V for one KV head, once, and computes all the
   G = H_q / H_kv query heads that share that KV head (grouped-query attention), with
   an online softmax in fp32. It writes a partial output o_s (already divided by its
   own softmax denominator) and the split's log-sum-exp lse_s.
3. Stage 2 (`_splitkv_combine`): a grid of B x H_q programs. Each one combines the
   real splits of its sequence by their LSE weights,

       o = sum_s exp(lse_s - lse) * o_s,    lse = log sum_s exp(lse_s),

   which is exactly softmax(q K^T) V over the whole sequence: a split's o_s is
   sum_j exp(x_j - lse_s) v_j over its tokens, so exp(lse_s - lse) * o_s is the same sum
   with the global normaliser. Nothing is dropped or approximated; results for
   different S differ only by fp32 rounding order (tests/test_kernels.py bounds it).
4. The launcher `decode_attention`.

The KV cache is paged, as the engines keep it: k_cache and v_cache are
[num_pages, page_size, H_kv, D]; block_table[b, i] is the page holding tokens
i*page_size .. (i+1)*page_size-1 of sequence b; seq_lens[b] is its length (>= 1).
page_size may be anything (1 as in SGLang, 16 as in vLLM, ...): the kernel's KV
block (BLOCK_N tokens) is independent of it and looks the page up per token.
A contiguous cache [B, L, H_kv, D] is the special case of one page per sequence
(block_table=None).

Inputs may be fp32, fp16 or bf16; all arithmetic and accumulation is fp32. With bf16/fp16
inputs on the GPU both products run in the inputs' own tensor-core format: q.k directly
(the product of two bf16 numbers is exact in fp32, and the MMA sums in fp32), p.v with the
fp32 p split into three bf16 (fp16) parts, which together hold its 24 bits, so K and V stay
16-bit in registers. fp32 inputs use 3xTF32 (~fp32-accurate). In Triton's CPU interpreter
every load is converted to fp32 first (its bf16 arithmetic works on raw bits); the
native path is tested there with fp16, and with bf16 by the GPU check.

Stage 1's tile and schedule (KV block, warps, pipeline stages) come from `launch_config`
(a table derived from the bytes in flight an H200 needs) unless the caller passes them;
the GPU check tunes over CANDIDATE_CONFIGS per shape and reports the best beside it.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

TARGET_CTAS_ENV = "KNOBKEEPER_SPLITKV_TARGET_CTAS"
DEFAULT_TARGET_CTAS = 256  # the catalog default (inventory/catalog.toml)

# For tests only: KNOBKEEPER_KERNELS_BROKEN_COMBINE=uniform makes stage 2 average the
# splits with equal weights instead of their LSE weights, so the suite can be shown to
# catch a wrong combine. Never set it on an engine host.
BROKEN_COMBINE_ENV = "KNOBKEEPER_KERNELS_BROKEN_COMBINE"

# Splits the combine reads per step: 8 x 128 fp32 partials is 8 registers a thread at 4 warps.
COMBINE_CHUNK = 8

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


# --------------------------------------------------------------------------------------
# 1. The split rule
# --------------------------------------------------------------------------------------


def num_splits(target_ctas: int, batch: int, heads: int, num_kv_blocks: int) -> int:
    """S = clamp(ceil(target_ctas / (batch * heads)), 1, num_kv_blocks).

    `heads` is the number of KV heads: one stage-1 program (a CTA on the GPU) serves one
    KV head and all the query heads of its group, so the grid launches
    batch * kv_heads * S CTAs, and that product is what the knob targets.
    `num_kv_blocks` is the number of BLOCK_N-token blocks of the longest sequence: a
    split never covers less than one block.
    """
    if target_ctas < 1 or batch < 1 or heads < 1 or num_kv_blocks < 1:
        raise ValueError(
            f"num_splits needs positive integers, got target_ctas={target_ctas}, batch={batch}, "
            f"heads={heads}, num_kv_blocks={num_kv_blocks}"
        )
    wanted = -(-target_ctas // (batch * heads))
    return max(1, min(wanted, num_kv_blocks))


def split_bounds(num_blocks: int, splits: int) -> list[tuple[int, int]]:
    """The KV-block ranges [start, end) of one sequence's splits, as the kernels compute them.

    A sequence of `num_blocks` blocks uses min(splits, num_blocks) splits; split i covers
    blocks [i*n // s, (i+1)*n // s). With s <= n every range holds at least one block, and
    every block holds at least one real token, so no split is ever empty. (Programs of the
    grid beyond a short sequence's own split count return at once and write nothing; the
    combine reads only that sequence's real splits.)
    """
    s = min(splits, num_blocks)
    return [(i * num_blocks // s, (i + 1) * num_blocks // s) for i in range(s)]


# --------------------------------------------------------------------------------------
# 2. Stage 1: partial attention over one split, online softmax in fp32
# --------------------------------------------------------------------------------------


@triton.jit
def _splitkv_stage1(
    Q, K, V, BlockTable, SeqLens, MidO, MidLse,
    sm_scale_log2e,
    stride_qb, stride_qh,
    stride_kp, stride_ks, stride_kh,
    stride_vp, stride_vs, stride_vh,
    stride_btb,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    NUM_SPLITS,
    GROUP: tl.constexpr,        # query heads per KV head
    HEAD_DIM: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,      # GROUP padded to a power of two >= 16 (tl.dot's minimum)
    BLOCK_D: tl.constexpr,      # HEAD_DIM padded to a power of two >= 16
    BLOCK_N: tl.constexpr,      # tokens per KV block
    NATIVE_DOT: tl.constexpr,   # q.k and p.v in the inputs' own bf16/fp16 (fp32 sums); see the docstring
):
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    seq_len = tl.load(SeqLens + b)
    n_blocks = tl.cdiv(seq_len, BLOCK_N)
    splits_here = tl.minimum(NUM_SPLITS, n_blocks)
    if split < splits_here:
        # Balanced ranges: every split of this sequence covers >= 1 block (see split_bounds).
        start_block = split * n_blocks // splits_here
        end_block = (split + 1) * n_blocks // splits_here

        offs_h = tl.arange(0, BLOCK_H)
        offs_d = tl.arange(0, BLOCK_D)
        offs_n = tl.arange(0, BLOCK_N)
        heads = kv_head * GROUP + offs_h
        h_mask = offs_h < GROUP
        d_mask = offs_d < HEAD_DIM

        q = tl.load(Q + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=h_mask[:, None] & d_mask[None, :], other=0.0)
        if not NATIVE_DOT:
            q = q.to(tl.float32)

        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)  # running max
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)                # running denominator
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)       # running numerator

        for block in range(start_block, end_block):
            tok = block * BLOCK_N + offs_n
            n_mask = tok < seq_len
            # int64: page * stride_kp passes 2**31 elements in a large cache (96 x 32k tokens x 8 x 128).
            page = tl.load(BlockTable + b * stride_btb + tok // PAGE_SIZE, mask=n_mask, other=0).to(tl.int64)
            slot = tok % PAGE_SIZE
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(K + page[:, None] * stride_kp + slot[:, None] * stride_ks
                        + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(V + page[:, None] * stride_vp + slot[:, None] * stride_vs
                        + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)

            if NATIVE_DOT:
                # A bf16 x bf16 (fp16 x fp16) product is exact in fp32 and the MMA sums in fp32: the
                # same scores as converting first, at a third of the tensor-core work of tf32x3.
                s = tl.dot(q, tl.trans(k))                                     # [BLOCK_H, BLOCK_N]
            else:
                v = v.to(tl.float32)
                s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="tf32x3")
            s = s * sm_scale_log2e  # scores in base-2 units: exp2 below
            s = tl.where(n_mask[None, :], s, float("-inf"))
            # Every block of a split holds a real token, so m_new is finite: no -inf - -inf.
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None]
            if NATIVE_DOT:
                # p (fp32) as the sum of three numbers of V's own type, each times V on the tensor
                # cores with fp32 sums: 3 x 8 bits of bf16 mantissa hold all 24 of fp32's, so this
                # is p.v to fp32 accuracy, while V stays 16-bit in registers (tf32x3 would widen it).
                p_hi = p.to(v.dtype)
                rest = p - p_hi.to(tl.float32)
                p_mid = rest.to(v.dtype)
                p_lo = (rest - p_mid.to(tl.float32)).to(v.dtype)
                acc = tl.dot(p_hi, v, acc)
                acc = tl.dot(p_mid, v, acc)
                acc = tl.dot(p_lo, v, acc)
            else:
                acc += tl.dot(p, v, input_precision="tf32x3")
            m_i = m_new

        o = acc / l_i[:, None]
        lse = m_i + tl.log2(l_i)  # base 2
        tl.store(MidO + b * stride_mob + heads[:, None] * stride_moh + split * stride_mos + offs_d[None, :],
                 o, mask=h_mask[:, None] & d_mask[None, :])
        tl.store(MidLse + b * stride_mlb + heads * stride_mlh + split, lse, mask=h_mask)


# --------------------------------------------------------------------------------------
# 3. Stage 2: the exact combine by LSE weights
# --------------------------------------------------------------------------------------


@triton.jit
def _splitkv_combine(
    MidO, MidLse, SeqLens, Out, Lse,
    stride_mob, stride_moh, stride_mos,
    stride_mlb, stride_mlh,
    stride_ob, stride_oh,
    NUM_SPLITS, num_q_heads,
    HEAD_DIM: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,      # NUM_SPLITS padded to a power of two
    CHUNK_S: tl.constexpr,      # splits combined per step (a power of two)
    BLOCK_D: tl.constexpr,
    UNIFORM: tl.constexpr,      # True only to demonstrate that the tests catch a wrong combine
):
    b = tl.program_id(0)
    h = tl.program_id(1)

    seq_len = tl.load(SeqLens + b)
    splits_here = tl.minimum(NUM_SPLITS, tl.cdiv(seq_len, BLOCK_N))  # this sequence's real splits

    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = offs_s < splits_here
    d_mask = offs_d < HEAD_DIM

    lse_s = tl.load(MidLse + b * stride_mlb + h * stride_mlh + offs_s, mask=s_mask, other=float("-inf"))
    lse_max = tl.max(lse_s, axis=0)                   # finite: split 0 is always real
    lse = (lse_max + tl.log2(tl.sum(tl.exp2(lse_s - lse_max), axis=0))) * 0.6931471805599453  # natural log

    # The partial outputs CHUNK_S splits at a time: a [BLOCK_S, D] tile would not fit in registers
    # when a small batch asks for hundreds of splits.
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    w_acc = tl.zeros([CHUNK_S], dtype=tl.float32)
    offs_c = tl.arange(0, CHUNK_S)
    for start in range(0, splits_here, CHUNK_S):
        c_mask = start + offs_c < splits_here
        lse_c = tl.load(MidLse + b * stride_mlb + h * stride_mlh + start + offs_c, mask=c_mask,
                        other=float("-inf"))
        o_c = tl.load(MidO + b * stride_mob + h * stride_moh + (start + offs_c)[:, None] * stride_mos
                      + offs_d[None, :], mask=c_mask[:, None] & d_mask[None, :], other=0.0)
        if UNIFORM:
            w = tl.where(c_mask, 1.0, 0.0)            # WRONG on purpose: ignores each split's mass
        else:
            w = tl.exp2(lse_c - lse_max)              # 0 for the masked (-inf) slots
        acc += tl.sum(o_c * w[:, None], axis=0)
        w_acc += w
    o = acc / tl.sum(w_acc, axis=0)

    tl.store(Out + b * stride_ob + h * stride_oh + offs_d, o.to(Out.dtype.element_ty), mask=d_mask)
    tl.store(Lse + b * num_q_heads + h, lse)


# --------------------------------------------------------------------------------------
# 4. The launcher
# --------------------------------------------------------------------------------------


def target_ctas_from_env(environ=None) -> int:
    """KNOBKEEPER_SPLITKV_TARGET_CTAS as an int (the catalog default 256 when unset)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(TARGET_CTAS_ENV, "").strip()
    if not raw:
        return DEFAULT_TARGET_CTAS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{TARGET_CTAS_ENV}={raw!r}: expected an integer from 1 to 65536") from None
    if not 1 <= value <= 65536:
        raise ValueError(f"{TARGET_CTAS_ENV}={raw!r}: expected an integer from 1 to 65536")
    return value


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, triton.next_power_of_2(n))


class LaunchConfig(NamedTuple):
    """Stage 1's tile and schedule: tokens per KV block, warps per program, pipelining depth."""

    block_n: int
    num_warps: int
    num_stages: int

    @property
    def name(self) -> str:
        return f"n{self.block_n}w{self.num_warps}s{self.num_stages}"


# What the GPU check (gpu_check.py) tunes over, per shape, before it measures the knob. The
# larger tiles need 16-byte loads of a 256-byte bf16 row: every one of these keeps the head dim
# whole in one tile, so a program still reads its K and V exactly once.
CANDIDATE_CONFIGS = (
    LaunchConfig(32, 4, 2), LaunchConfig(32, 4, 3), LaunchConfig(64, 4, 2), LaunchConfig(64, 4, 3),
    LaunchConfig(64, 8, 3), LaunchConfig(128, 4, 2), LaunchConfig(128, 8, 2), LaunchConfig(128, 8, 3),
)


def launch_config(head_dim: int, itemsize: int) -> LaunchConfig:
    """The default tile for a head dim and element size (the table; not yet measured on a GPU).

    Why these, from the arithmetic rather than a measurement (the GPU check's tuning pass
    reports the measured best per shape beside this choice): decode attention reads every K/V
    byte once, so a program should keep ~32 KiB of K+V in flight per stage (Little's law on
    an H200: 4.8 TB/s x ~1 us over 132 SMs is ~36 KB per SM). For bf16/fp16 at D=128 a
    64-token block is 16 KiB of K and 16 KiB of V, and three stages keep the next blocks'
    loads in flight (cp.async, 16 bytes a thread). Compiled for sm_90 (compile_check) it
    takes 124 registers a thread and 43 KB of shared memory, no spills: four programs (16
    warps, ~170 KB of K/V staged) per SM. fp32 rows are twice as wide, so half the tokens.
    """
    row_bytes = head_dim * itemsize
    block_n = max(16, min(128, triton.next_power_of_2(max(1, 16384 // row_bytes))))
    return LaunchConfig(block_n, 8 if block_n * row_bytes > 16384 else 4, 3)


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    seq_lens: torch.Tensor,
    *,
    target_ctas: int | None = None,
    sm_scale: float | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    max_seq_len: int | None = None,
    out_dtype: torch.dtype | None = None,
    native_dot: bool | None = None,
    return_lse: bool = False,
    return_partials: bool = False,
    combine: str | None = None,
):
    """One decode step of attention: softmax(q K^T * sm_scale) V for each sequence and query head.

    q          [B, H_q, D] (one new token per sequence)
    k_cache    [num_pages, page_size, H_kv, D] with block_table [B, max_pages] (int32), or
               [B, L, H_kv, D] contiguous with block_table=None; v_cache the same shape
    seq_lens   [B] int32, each in 1 .. max_pages*page_size (or L)
    target_ctas  the knob; None reads KNOBKEEPER_SPLITKV_TARGET_CTAS (default 256)
    sm_scale   default 1/sqrt(D)
    block_n, num_warps, num_stages  stage 1's tile and schedule; None takes launch_config's
               (block_n must be a power of two >= 16; it also sets how many blocks the split
               rule counts)
    max_seq_len  the longest seq_len if the caller knows it (avoids a device sync; must be
               >= the real maximum; it only sets the grid's S)
    out_dtype  default q.dtype; the output is computed in fp32 and rounded once at the end
    native_dot  bf16/fp16 inputs: q.k and p.v on the tensor cores in the inputs' own type
               (exact products, fp32 sums); default on CUDA. Triton's interpreter gets fp16 right
               (tests force it there) but not bf16, whose arithmetic it does on raw bits.

    Returns out [B, H_q, D]; with return_lse also lse [B, H_q] (fp32, natural log);
    with return_partials also a dict of the stage-1 buffers and the split count S.
    """
    if q.dim() != 3:
        raise ValueError(f"q: expected [B, H_q, D], got shape {tuple(q.shape)}")
    batch, q_heads, head_dim = q.shape
    if k_cache.shape != v_cache.shape or k_cache.dim() != 4:
        raise ValueError(f"k_cache/v_cache: expected equal 4-D shapes, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if not (q.dtype == k_cache.dtype == v_cache.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtypes: q, k_cache, v_cache must share one of fp32/fp16/bf16, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} != q's {head_dim}")
    if q_heads % kv_heads:
        raise ValueError(f"heads: H_q={q_heads} is not a multiple of H_kv={kv_heads}")
    table = launch_config(head_dim, q.element_size())
    block_n = table.block_n if block_n is None else block_n
    num_warps = table.num_warps if num_warps is None else num_warps
    num_stages = table.num_stages if num_stages is None else num_stages
    if block_n < 16 or block_n & (block_n - 1):
        raise ValueError(f"block_n={block_n}: expected a power of two >= 16")
    if native_dot is None:  # the interpreter's bf16 arithmetic works on raw bits: convert first there
        native_dot = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    if native_dot and q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"native_dot: needs bf16 or fp16 inputs, got {q.dtype}")
    if num_warps not in (1, 2, 4, 8, 16) or not 1 <= num_stages <= 8:
        raise ValueError(f"num_warps={num_warps}, num_stages={num_stages}: expected warps 1/2/4/8/16, stages 1..8")
    if seq_lens.shape != (batch,):
        raise ValueError(f"seq_lens: expected shape ({batch},), got {tuple(seq_lens.shape)}")
    device = q.device
    seq_lens = seq_lens.to(device=device, dtype=torch.int32)

    if block_table is None:  # contiguous [B, L, H_kv, D]: one page of L tokens per sequence
        if k_cache.shape[0] != batch:
            raise ValueError(f"k_cache: contiguous layout needs batch {batch} first, got {tuple(k_cache.shape)}")
        page_size = k_cache.shape[1]
        block_table = torch.arange(batch, device=device, dtype=torch.int32)[:, None]
    else:
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table: expected [B={batch}, max_pages], got {tuple(block_table.shape)}")
        page_size = k_cache.shape[1]
        block_table = block_table.to(device=device, dtype=torch.int32)
    capacity = block_table.shape[1] * page_size

    if max_seq_len is None:
        lo, hi = int(seq_lens.min()), int(seq_lens.max())  # one device sync
        if lo < 1 or hi > capacity:
            raise ValueError(f"seq_lens: each must be in 1..{capacity} (block_table width x page size), got {lo}..{hi}")
        max_seq_len = hi
    if target_ctas is None:
        target_ctas = target_ctas_from_env()
    combine = combine if combine is not None else (os.environ.get(BROKEN_COMBINE_ENV) or "lse")
    if combine not in ("lse", "uniform"):
        raise ValueError(f"combine={combine!r}: expected 'lse' (or 'uniform', the deliberately broken one)")

    num_kv_blocks = triton.cdiv(max_seq_len, block_n)
    splits = num_splits(target_ctas, batch, kv_heads, num_kv_blocks)
    group = q_heads // kv_heads
    block_d = _pow2_at_least(head_dim, 16)

    q = q.contiguous() if q.stride(2) != 1 else q
    if k_cache.stride(3) != 1 or v_cache.stride(3) != 1:
        raise ValueError("k_cache/v_cache: the head dim must be contiguous")
    mid_o = torch.empty((batch, q_heads, splits, head_dim), device=device, dtype=torch.float32)
    mid_lse = torch.empty((batch, q_heads, splits), device=device, dtype=torch.float32)
    out = torch.empty((batch, q_heads, head_dim), device=device, dtype=out_dtype or q.dtype)
    lse = torch.empty((batch, q_heads), device=device, dtype=torch.float32)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(head_dim)

    _splitkv_stage1[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_table, seq_lens, mid_o, mid_lse,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        splits,
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_H=_pow2_at_least(group, 16), BLOCK_D=block_d, BLOCK_N=block_n,
        NATIVE_DOT=native_dot,
        num_warps=num_warps, num_stages=num_stages,
    )
    _splitkv_combine[(batch, q_heads)](
        mid_o, mid_lse, seq_lens, out, lse,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        out.stride(0), out.stride(1),
        splits, q_heads,
        HEAD_DIM=head_dim, BLOCK_N=block_n, BLOCK_S=_pow2_at_least(splits, 1), BLOCK_D=block_d,
        CHUNK_S=min(COMBINE_CHUNK, _pow2_at_least(splits, 1)),
        UNIFORM=(combine == "uniform"),
    )

    result = [out]
    if return_lse:
        result.append(lse)
    if return_partials:
        # mid_lse is in base 2 inside the kernels; hand it out in natural log like `lse`.
        result.append({"splits": splits, "mid_o": mid_o, "mid_lse": mid_lse * _LN2})
    return result[0] if len(result) == 1 else tuple(result)
