"""Kernel-level A/B evidence for KNOBKEEPER_SPLITKV_TARGET_CTAS.

    python -m knobkeeper_kernels.bench --target-ctas 128,256,512,1024 --batch 1,16,64,96 \\
        --context 4096,32768 [--baseline-ctas 256] [--repeats 5] [--out changelog/evidence]
    python -m knobkeeper_kernels.bench --smoke --out /tmp/ev      # tiny sizes, Triton interpreter, CPU

For every (batch, context) it builds one paged KV cache (all sequences `context` tokens long,
pages scattered at random as an engine's allocator leaves them), then, `--repeats` times and
interleaved, times decode_attention at every target-CTAs value and torch's
scaled_dot_product_attention on the same data (contiguous copy, enable_gqa).

Output: one evidence file (knobkeeper.evidence/1, see knobkeeper/evidence/schema.py) per
(candidate target, context), named <UTC stamp>-<8 hex id>.json in --out: arm A is
--baseline-ctas (default the catalog default, 256), arm B the candidate. The schema has exactly
two arms, so one file per candidate; a context per file keeps each concurrency level one
workload. A candidate equal to the baseline gets no file. The baseline's measurements are
shared by the files of one invocation (the same timings appear as arm A in each).

Each run (one arm, one batch size, one repeat) carries the schema's fields
    arm, repeat, concurrency (= the decode batch size), errors (0),
    output_tokens_per_s  batch / time per call (one new token per sequence per call),
    requests_per_s, ttft_ms, itl_ms, e2e_ms, completed: null (not meaningful for a kernel)
and these kernel fields, for `knobkeeper ab import --format kernels`:
    context               tokens per sequence (KV length)
    target_ctas           the knob value of this arm
    num_splits            S chosen by the split rule; ctas = batch * kv_heads * S (stage 1 grid)
    time_per_call_us      median time of one decode_attention call (stage 1 + combine)
    kv_bytes              bytes of K and V read per call: sum(seq_lens) * kv_heads * head_dim * 2 * itemsize
    qo_bytes, bytes_moved q read and o written (batch * q_heads * head_dim * 2 * itemsize); kv + qo
    bandwidth_gbps        bytes_moved / time, in GB/s (1e9)
    bandwidth_fraction    bandwidth / the device's peak HBM bandwidth (null when unknown or on CPU)
    sdpa_time_per_call_us, sdpa_bandwidth_gbps, sdpa_bandwidth_fraction
                          the same for torch.nn.functional.scaled_dot_product_attention, measured in
                          the same repeat (so the pair is comparable)
    max_abs_diff_vs_sdpa  max |decode_attention - sdpa| over the output, fp32 (correctness guard)
setup.kernel records the attention shape, dtype, page size, block size and whether the Triton
interpreter ran. Timing: triton.testing.do_bench (median, L2 flushed between calls) on CUDA;
wall time of `--iters` calls on the CPU interpreter (smoke mode: it proves the code path, its
numbers are not performance).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

KNOB = "KNOBKEEPER_SPLITKV_TARGET_CTAS"
ROLE = "decode"  # the role inventory/catalog.toml gives the knob
SCHEMA = "knobkeeper.evidence/1"

# Peak HBM bandwidth in bytes/s by device-name fragment (first match wins: specific names first).
PEAK_BANDWIDTH = [
    ("GH200", 4.0e12),  # before "H200", which its name contains
    ("H200", 4.8e12),
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H100", 3.35e12),
    ("H800", 3.35e12),
    ("H20", 4.0e12),
    ("B200", 8.0e12),
    ("B300", 8.0e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100 80GB PCIe", 1.935e12),
    ("A100", 1.555e12),
    ("L40S", 0.864e12),
    ("RTX PRO 6000", 1.792e12),
    ("RTX 5090", 1.792e12),
    ("RTX 4090", 1.008e12),
]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_FULL = {"target_ctas": "128,256,512,1024", "batch": "1,16,64,96", "context": "4096,32768", "baseline_ctas": 256,
         "heads": 32, "kv_heads": 8, "head_dim": 128, "page_size": 16, "block_n": 64, "repeats": 5, "iters": 1}
_SMOKE = {"target_ctas": "2,8", "batch": "1,2", "context": "24,40", "baseline_ctas": 4,
          "heads": 2, "kv_heads": 1, "head_dim": 16, "page_size": 8, "block_n": 16, "repeats": 2, "iters": 1}


def peak_bandwidth(device_name: str) -> float | None:
    for fragment, peak in PEAK_BANDWIDTH:
        if fragment.lower() in device_name.lower():
            return peak
    return None


def positive_ints(text: str, flag: str) -> list[int]:
    """'1,8,64' -> [1, 8, 64]; a ValueError naming the flag for anything else."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} {text!r}: expected comma-separated positive integers")
    return values


def _ints(text: str, flag: str) -> list[int]:
    try:
        return positive_ints(text, flag)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m knobkeeper_kernels.bench",
                                     description="Split-KV decode attention: A/B evidence for " + KNOB)
    parser.add_argument("--target-ctas", help=f"comma-separated candidate values (default {_FULL['target_ctas']})")
    parser.add_argument("--baseline-ctas", type=int, help="arm A's value (default 256, the catalog default)")
    parser.add_argument("--batch", help=f"comma-separated decode batch sizes (default {_FULL['batch']})")
    parser.add_argument("--context", help=f"comma-separated KV lengths (default {_FULL['context']})")
    parser.add_argument("--heads", type=int, help="query heads (default 32)")
    parser.add_argument("--kv-heads", type=int, help="KV heads (default 8)")
    parser.add_argument("--head-dim", type=int, help="head dim (default 128)")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    parser.add_argument("--page-size", type=int, help="tokens per KV page (default 16)")
    parser.add_argument("--block-n", type=int, help="tokens per kernel KV block (default 64)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per arm (default 5)")
    parser.add_argument("--iters", type=int, help="calls per timing on the CPU interpreter (default 1)")
    parser.add_argument("--peak-gbps", type=float, help="the device's peak HBM bandwidth, GB/s (default: by device name)")
    parser.add_argument("--out", default="changelog/evidence", help="directory for the evidence files")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes in the Triton interpreter on CPU (CI: proves the script works)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    defaults = _SMOKE if args.smoke else _FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.target_ctas = _ints(args.target_ctas, "--target-ctas")
    args.batch = _ints(args.batch, "--batch")
    args.context = _ints(args.context, "--context")
    if args.heads % args.kv_heads:
        raise SystemExit(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    return args


def git_sha() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _make_inputs(torch, batch, context, args, device, dtype):
    """q, a paged cache with shuffled pages, the block table, seq_lens, and a contiguous copy for SDPA."""
    pages_per_seq = -(-context // args.page_size)
    num_pages = batch * pages_per_seq
    shape = (num_pages, args.page_size, args.kv_heads, args.head_dim)
    k_cache = torch.randn(shape, device=device, dtype=dtype)
    v_cache = torch.randn(shape, device=device, dtype=dtype)
    block_table = torch.randperm(num_pages, device=device).to(torch.int32).view(batch, pages_per_seq)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    q = torch.randn((batch, args.heads, args.head_dim), device=device, dtype=dtype)

    def contiguous(cache):  # [B, H_kv, L, D]
        return cache[block_table.long()].reshape(batch, pages_per_seq * args.page_size, args.kv_heads,
                                                 args.head_dim)[:, :context].transpose(1, 2).contiguous()

    return q, k_cache, v_cache, block_table, seq_lens, contiguous(k_cache), contiguous(v_cache)


def bytes_moved(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int, itemsize: int) -> dict:
    """The bytes one decode call must move through HBM: K and V of every token once, q in, o out.

    (The splits' fp32 partials are extra traffic of the split-KV method itself, not counted:
    the figure is what any decode attention must move, so kernels compare on one scale.)
    """
    kv = batch * context * kv_heads * head_dim * 2 * itemsize
    qo = batch * q_heads * head_dim * 2 * itemsize
    return {"kv_bytes": kv, "qo_bytes": qo, "bytes_moved": kv + qo}


def run_record(*, batch: int, context: int, target: int | None, splits: int, kv_heads: int, moved: dict,
               time_us: float, sdpa_us: float | None, peak: float | None, max_abs_diff: float | None,
               **extra) -> dict:
    """One run's fields (see the module docstring): one arm, one batch size, one repeat."""
    def bandwidth(us):
        return None if us is None else moved["bytes_moved"] / (us * 1e-6)

    return {
        "concurrency": batch,
        "output_tokens_per_s": batch / (time_us * 1e-6),
        "requests_per_s": None, "ttft_ms": None, "itl_ms": None, "e2e_ms": None, "completed": None, "errors": 0,
        "context": context, "target_ctas": target, "num_splits": splits, "ctas": batch * kv_heads * splits,
        "time_per_call_us": time_us, **moved,
        "bandwidth_gbps": bandwidth(time_us) / 1e9,
        "bandwidth_fraction": bandwidth(time_us) / peak if peak else None,
        "sdpa_time_per_call_us": sdpa_us,
        "sdpa_bandwidth_gbps": None if sdpa_us is None else bandwidth(sdpa_us) / 1e9,
        "sdpa_bandwidth_fraction": bandwidth(sdpa_us) / peak if peak and sdpa_us is not None else None,
        "max_abs_diff_vs_sdpa": max_abs_diff,
        **extra,
    }


def evidence_doc(*, baseline: int | None, candidate: int, runs: list[dict], setup: dict, tool: str,
                 ident: str | None = None, created: datetime | None = None) -> dict:
    """One evidence doc: arm A = `baseline` (None = the knob unset), arm B = `candidate`.

    `runs` are run_record dicts with "arm" and "repeat" added.
    """
    created = created or datetime.now(timezone.utc)
    return {
        "schema": SCHEMA, "id": ident or secrets.token_hex(4), "created": created.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "knob": KNOB, "role": ROLE, "metric": "output_tokens_per_s",
        "arms": {"A": {"label": "baseline", "knobs": {KNOB: baseline}},
                 "B": {"label": "candidate", "knobs": {KNOB: candidate}}},
        "setup": setup,
        "runs": runs,
        "judgement": {"method": "none (raw kernel timings; judge with knobkeeper ab import)", "alpha": 0.05,
                      "levels": []},
        "anomalies": [],
        "source": {"tool": tool, "raw_files": [], "format": "kernels"},
    }


def evidence_name(doc: dict) -> str:
    """<UTC stamp>-<id>.json, the name the changelog's evidence folder uses."""
    stamp = datetime.strptime(doc["created"], "%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp.strftime('%Y%m%dT%H%M%S.%fZ')}-{doc['id']}.json"


def write_atomic(path: Path, data: bytes | str) -> Path:
    """Write `path` through a uniquely named temp file in its folder, fsynced, and a rename: a reader
    never sees half a file, and two writers never share a temp file. knobkeeper.fsio's atomic_write
    does the same for the controller; the kernels import nothing of it (a lent GPU runs them bare)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode() if isinstance(data, str) else data)
            handle.flush()
            os.fchmod(handle.fileno(), 0o644)
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def run(args) -> list[Path]:
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (below)
    import torch
    import triton

    from . import __version__
    from .splitkv import decode_attention, num_splits

    on_gpu = torch.cuda.is_available() and not args.smoke
    if not on_gpu and not args.smoke:
        raise SystemExit("no CUDA device: run on a GPU host, or use --smoke for the CPU interpreter")
    device = "cuda" if on_gpu else "cpu"
    device_name = torch.cuda.get_device_name() if on_gpu else "cpu-interpreter"
    peak = args.peak_gbps * 1e9 if args.peak_gbps else (peak_bandwidth(device_name) if on_gpu else None)
    dtype = getattr(torch, _DTYPES[args.dtype])
    itemsize = torch.empty((), dtype=dtype).element_size()
    torch.manual_seed(args.seed)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def timed_us(fn) -> float:
        if on_gpu:
            return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
        start = time.perf_counter()
        for _ in range(args.iters):
            fn()
        return (time.perf_counter() - start) / args.iters * 1e6

    targets = sorted(set(args.target_ctas) | {args.baseline_ctas})
    # measured[(context, batch, target)] -> list of run-field dicts, one per repeat
    measured: dict[tuple[int, int, int], list[dict]] = {}
    for context in args.context:
        for batch in args.batch:
            q, k_cache, v_cache, block_table, seq_lens, k_dense, v_dense = _make_inputs(
                torch, batch, context, args, device, dtype)
            moved = bytes_moved(batch, context, args.heads, args.kv_heads, args.head_dim, itemsize)
            num_kv_blocks = -(-context // args.block_n)

            def call(target):
                return decode_attention(q, k_cache, v_cache, block_table, seq_lens, target_ctas=target,
                                        block_n=args.block_n, max_seq_len=context)

            def call_sdpa():
                return sdpa(q[:, :, None, :], k_dense, v_dense, enable_gqa=True)

            reference = call_sdpa()[:, :, 0, :].float()
            diffs = {t: float((call(t).float() - reference).abs().max()) for t in targets}
            for repeat in range(args.repeats):
                for target in targets:
                    t_us = timed_us(lambda: call(target))
                    s_us = timed_us(call_sdpa)
                    splits = num_splits(target, batch, args.kv_heads, num_kv_blocks)
                    measured.setdefault((context, batch, target), []).append({
                        "repeat": repeat, **run_record(batch=batch, context=context, target=target, splits=splits,
                                                       kv_heads=args.kv_heads, moved=moved, time_us=t_us,
                                                       sdpa_us=s_us, peak=peak, max_abs_diff=diffs[target])})
            del q, k_cache, v_cache, k_dense, v_dense
            if on_gpu:
                torch.cuda.empty_cache()

    setup = {
        "inventory": None, "git_sha": git_sha(), "engine": "knobkeeper-kernels",
        "engine_version": f"{__version__} (torch {torch.__version__}, triton {triton.__version__})",
        "model": None, "device": device_name,
        "workload": {"api": "kernel", "input_len": None, "output_len": 1, "requests_per_run": None, "duration_s": None},
        "kernel": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": args.dtype,
                   "page_size": args.page_size, "block_n": args.block_n, "interpreter": not on_gpu,
                   "peak_bandwidth_gbps": peak / 1e9 if peak else None, "timing": "triton.testing.do_bench median"
                   if on_gpu else f"wall time of {args.iters} interpreter call(s)"},
    }
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for context in args.context:
        for candidate in args.target_ctas:
            if candidate == args.baseline_ctas:
                continue
            runs = []
            for batch in args.batch:
                for arm, target in (("A", args.baseline_ctas), ("B", candidate)):
                    runs += [{"arm": arm, **fields} for fields in measured[(context, batch, target)]]
            doc = evidence_doc(baseline=args.baseline_ctas, candidate=candidate, runs=runs,
                               setup={**setup, "workload": {**setup["workload"], "input_len": context}},
                               tool="knobkeeper_kernels.bench")
            written.append(write_atomic(out_dir / evidence_name(doc), json.dumps(doc, indent=2) + "\n"))
    _print_table(measured, args, device_name)
    for path in written:
        print(f"wrote {path}")
    return written


def _print_table(measured, args, device_name) -> None:
    print(f"# {device_name}: H_q={args.heads} H_kv={args.kv_heads} D={args.head_dim} {args.dtype} "
          f"page={args.page_size} block_n={args.block_n}; median over {args.repeats} repeats")
    print(f"{'context':>8} {'batch':>5} {'target':>6} {'S':>4} {'us/call':>10} {'GB/s':>8} {'frac':>6} "
          f"{'sdpa us':>10} {'sdpa GB/s':>9} {'maxdiff':>8}")
    for (context, batch, target), runs in sorted(measured.items()):
        def med(key):
            values = sorted(r[key] for r in runs)
            return values[len(values) // 2]
        frac = med("bandwidth_fraction") if runs[0]["bandwidth_fraction"] is not None else math.nan
        print(f"{context:>8} {batch:>5} {target:>6} {runs[0]['num_splits']:>4} {med('time_per_call_us'):>10.1f} "
              f"{med('bandwidth_gbps'):>8.2f} {frac:>6.3f} {med('sdpa_time_per_call_us'):>10.1f} "
              f"{med('sdpa_bandwidth_gbps'):>9.2f} {runs[0]['max_abs_diff_vs_sdpa']:>8.1e}")


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
