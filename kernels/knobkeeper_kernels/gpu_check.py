"""The GPU check: one command that proves the split-KV kernel on a CUDA device and measures its knob.

    python3 kernels/gpu_check.py --out DIR [--budget-s 400] [--evidence-dir DIR]   # `make gpu-check`
    python3 kernels/gpu_check.py --fake-timing --out DIR       # the same path on a CPU, FAKE timings

Made for a lent GPU that starts bare (its own python3, torch and triton; nothing to install):
kernels/gpu_check.py puts kernels/ on sys.path, so nothing of the rest of the project, and no
pip, is needed. In order, each phase printing a table row as it goes:

1. tests: decode_attention on CUDA (not the interpreter) in fp32, fp16 and bf16 against the
   fp64 torch reference, ragged/paged/contiguous layouts, several split counts, the table's
   launch config and every tuning candidate; fresh random inputs per case, NaN in every cache
   slot the kernel must not read.
2. per shape (batch x context, GQA 8 at bf16 by default; the shapes that matter most, batch >= 64
   and context >= 32k, first): tune stage 1 over splitkv.CANDIDATE_CONFIGS at the unset knob,
   then time KNOBKEEPER_SPLITKV_TARGET_CTAS unset and each candidate, and torch SDPA (and
   flash_attn, if importable) on the same bytes, `--repeats` times interleaved; each repeat is
   the median of `--iters` calls timed with CUDA events after a warm-up, the L2 flushed before
   every call, the launches queued behind a GPU sleep so host overhead stays out (what an engine
   sees under CUDA graphs). Reported: us per call, HBM bandwidth from the bytes of K, V, q and o
   (bench.bytes_moved), its fraction of the device's peak, and the recommended target.
3. output in --out, rewritten after every test group and shape (a run cut at its limit keeps
   everything finished so far): gpu_check.json (all figures), gpu_check.txt (the table), and
   evidence.tar: one knobkeeper evidence file per (candidate, context) against the unset
   baseline, the batch sizes as levels (`tar -xf evidence.tar -C DIR`, then
   `knobkeeper ab import --format kernels --baseline DIR/<file> --role decode`). Three files: a
   device tool that returns few files gets all of them. --evidence-dir also writes them loose.

--budget-s bounds the run: a shape whose estimated cost (from the ones done so far) would pass the
budget is skipped and listed; the run still writes its files and exits.

--fake-timing runs every phase on the CPU in Triton's interpreter at tiny sizes, with timings
from a made-up model instead of a clock: it proves the code path, the files and the import, never
performance. Every line, file name and record of such a run says FAKE, and the script refuses to
write fake output where real output is, or the other way round.

Exit status: 0 when every check passed (or there is no CUDA device: one line says so), 1 when a
check failed, 2 on bad arguments (one line).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import random
import secrets
import sys
import tarfile
import time
import traceback
import warnings
from datetime import datetime, timezone
from pathlib import Path

from .bench import (
    KNOB,
    bytes_moved,
    evidence_doc,
    evidence_name,
    git_sha,
    peak_bandwidth,
    positive_ints,
    run_record,
    write_atomic,
)

UNSET = "unset"
GQA = 8
REAL = {"batch": "1,8,64,128", "context": "4096,32768,131072", "q_heads": 64, "kv_heads": 8, "head_dim": 128,
        "page_size": 16}
# Fake mode: the same knob values, tiny shapes the interpreter runs in seconds.
FAKE_SIZES = {"batch": "1,2", "context": "64,1024", "q_heads": 8, "kv_heads": 1, "head_dim": 16, "page_size": 8}
TARGETS = "unset,132,264,512,1024,2048"
KNOB_RANGE = (1, 65536)          # inventory/catalog.toml's min/max for the knob
MIN_GPU_ITERS = 20
L2_FLUSH_BYTES = 256 << 20       # > the H200's 50 MB L2
NOISE_FLOOR = 0.02               # a target within 2% of unset is not recommended over it
BANDWIDTH_GOAL = 0.80            # the goal at batch >= 64 and context >= 32k
# Tolerances against the fp64 reference (relative: ||o - ref|| / ||ref||, and elementwise).
REL_FP32_OUT = 2e-5              # fp32 sums of exact (or 3xTF32) products, fp32 output
LSE_ATOL = 5e-5
SPLIT_ATOL = 2e-5                # any split count against one split, fp32 output
SWEEP_REL_VS_SDPA = 1e-2         # two bf16 outputs of fp32 sums: a few bf16 ulps (2**-8 each) apart


class ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse's own prints the usage too)
        raise ArgError(message)


def _int_list(text: str, flag: str) -> list[int]:
    try:
        return sorted(set(positive_ints(text, flag)))
    except ValueError as exc:
        raise ArgError(str(exc)) from None


def _targets(text: str) -> list[int]:
    """The candidate values (the unset baseline is always measured; 'unset' in the list is allowed)."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        if not part or part == UNSET:
            continue
        try:
            value = int(part)
        except ValueError:
            raise ArgError(f"--targets {text!r}: {part!r} is neither 'unset' nor an integer") from None
        if not KNOB_RANGE[0] <= value <= KNOB_RANGE[1]:
            raise ArgError(f"--targets {text!r}: {value} is outside {KNOB}'s range "
                           f"{KNOB_RANGE[0]}..{KNOB_RANGE[1]}")
        values.append(value)
    if not values:
        raise ArgError(f"--targets {text!r}: give at least one candidate value besides unset")
    return sorted(set(values))


def parse_args(argv=None) -> argparse.Namespace:
    parser = _Parser(prog="gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/out/gpu", help="folder for gpu_check.json, .txt and evidence.tar")
    parser.add_argument("--evidence-dir", help="also write the evidence files loose into this folder")
    parser.add_argument("--budget-s", type=float, default=400.0,
                        help="start no shape that would end past this many seconds (default 400)")
    parser.add_argument("--targets", default=TARGETS, help=f"knob values (default {TARGETS}; unset is the baseline)")
    parser.add_argument("--batch", help=f"decode batch sizes (default {REAL['batch']})")
    parser.add_argument("--context", help=f"KV lengths (default {REAL['context']})")
    parser.add_argument("--kv-heads", type=int, help=f"KV heads (default {REAL['kv_heads']}; query heads = {GQA} x this)")
    parser.add_argument("--head-dim", type=int, help=f"head dim (default {REAL['head_dim']})")
    parser.add_argument("--page-size", type=int, help=f"tokens per KV page (default {REAL['page_size']})")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats per arm (default 5, >= 2)")
    parser.add_argument("--iters", type=int, default=MIN_GPU_ITERS,
                        help=f"timed calls per repeat, median taken (default {MIN_GPU_ITERS}, >= {MIN_GPU_ITERS} on a GPU)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before each timing (default 3)")
    parser.add_argument("--no-tune", action="store_true", help="use splitkv.launch_config's table, no tuning pass")
    parser.add_argument("--skip-tests", action="store_true", help="skip phase 1 (the correctness tests)")
    parser.add_argument("--peak-gbps", type=float, help="the device's peak HBM bandwidth in GB/s (default: by name)")
    parser.add_argument("--fake-timing", action="store_true",
                        help="CPU: Triton interpreter, tiny shapes, FAKE timings (proves the path, not performance)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    sizes = FAKE_SIZES if args.fake_timing else REAL
    args.batch = _int_list(args.batch or sizes["batch"], "--batch")
    args.context = _int_list(args.context or sizes["context"], "--context")
    for key in ("kv_heads", "head_dim", "page_size"):
        if getattr(args, key) is None:
            setattr(args, key, sizes[key])
    args.q_heads = GQA * args.kv_heads
    args.targets = _targets(args.targets)
    for flag, value, low in (("--kv-heads", args.kv_heads, 1), ("--head-dim", args.head_dim, 16),
                             ("--page-size", args.page_size, 1), ("--repeats", args.repeats, 2),
                             ("--iters", args.iters, 1 if args.fake_timing else MIN_GPU_ITERS),
                             ("--warmup", args.warmup, 0)):
        if value < low:
            raise ArgError(f"{flag} {value}: expected at least {low}")
    if args.head_dim > 256:
        raise ArgError(f"--head-dim {args.head_dim}: expected at most 256")
    if not args.budget_s > 0 or not math.isfinite(args.budget_s):
        raise ArgError(f"--budget-s {args.budget_s}: expected a positive number of seconds")
    if args.peak_gbps is not None and not args.peak_gbps > 0:
        raise ArgError(f"--peak-gbps {args.peak_gbps}: expected a positive number")
    args.label = "FAKE" if args.fake_timing else ""
    return args


def output_names(fake: bool) -> dict[str, str]:
    """The three files of --out; a fake run's names say so."""
    tag = "-FAKE" if fake else ""
    return {"json": f"gpu_check{tag}.json", "text": f"gpu_check{tag}.txt", "evidence": f"evidence{tag}.tar"}


def _check_out(out: Path, fake: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ArgError(f"--out {out}: exists and is not a folder")
    other = output_names(not fake)
    if any((out / name).exists() for name in other.values()):
        kind, this = ("real", "FAKE") if fake else ("FAKE", "real")
        raise ArgError(f"--out {out}: holds {kind} gpu_check output; write {this} output to another folder")


# ------------------------------------------------------------------------------------- the run


class Check:
    """One run: its arguments, the torch/triton modules, the report and the output files."""

    gpu_device = "cuda"  # tests/test_gpu_check.py runs the real path on CPU tensors with a stand-in torch.cuda

    def __init__(self, args, torch, triton):
        self.args, self.torch, self.triton = args, torch, triton
        self.fake = args.fake_timing
        self.device = "cpu" if self.fake else self.gpu_device
        self.started = time.monotonic()
        self.out = Path(args.out)
        self.names = output_names(self.fake)
        self.lines: list[str] = []
        self.rng = random.Random(args.seed)
        name = "cpu-interpreter" if self.fake else torch.cuda.get_device_name()
        self.device_name = f"FAKE timing on {name}" if self.fake else name
        self.peak = args.peak_gbps * 1e9 if args.peak_gbps else (None if self.fake else peak_bandwidth(name))
        if self.fake:
            self.peak = 4.8e12  # the model's pretend device, so the fraction column is exercised
        self.doc = {
            "tool": "knobkeeper_kernels.gpu_check", "fake_timing": self.fake,
            "timing": ("FAKE: a made-up model of bytes / bandwidth, not a measurement" if self.fake else
                       f"CUDA events, median of {args.iters} calls after {args.warmup} warm-up, L2 flushed, "
                       f"launches queued behind a GPU sleep"),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": self.device_name, "peak_bandwidth_gbps": self.peak / 1e9 if self.peak else None,
            "python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
            "args": {k: v for k, v in vars(args).items() if k != "label"},
            "shape": {"q_heads": args.q_heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                      "dtype": "bf16", "page_size": args.page_size},
            "phase": "start", "tests": [], "tests_passed": None, "shapes": [], "skipped": [], "errors": [],
            "goals": [], "elapsed_s": 0.0, "finished": False,
        }
        self.evidence_ids: dict[tuple[int, int], str] = {}
        self.created = datetime.now(timezone.utc)
        self.flush = None  # the L2-flush buffer, allocated by the sweep on a GPU
        self.git_sha = self.doc["git_sha"] = git_sha()  # None where the copy has no git (a device's may not)

    # ---------------------------------------------------------------- reporting

    def say(self, line: str = "") -> None:
        if self.fake:
            line = f"FAKE {line}"
        print(line, flush=True)
        self.lines.append(line)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def save(self) -> None:
        """Rewrite every output file from what is done so far (atomic per file)."""
        self.doc["elapsed_s"] = round(self.elapsed(), 1)
        self.out.mkdir(parents=True, exist_ok=True)
        write_atomic(self.out / self.names["json"], json.dumps(self.doc, indent=2) + "\n")
        write_atomic(self.out / self.names["text"], "\n".join(self.lines) + "\n")
        docs = self.evidence_docs()
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for doc in docs:
                data = (json.dumps(doc, indent=2) + "\n").encode()
                info = tarfile.TarInfo(evidence_name(doc))
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
        write_atomic(self.out / self.names["evidence"], buffer.getvalue())
        if self.args.evidence_dir:
            loose = Path(self.args.evidence_dir)
            loose.mkdir(parents=True, exist_ok=True)
            for doc in docs:
                write_atomic(loose / evidence_name(doc), json.dumps(doc, indent=2) + "\n")

    # ---------------------------------------------------------------- timing

    def time_us(self, fn, *, iters: int, model_us: float | None = None, exercise: bool = False) -> list[float]:
        """Per-call times in us: CUDA events, or (fake mode) the model's numbers, after one real call
        when `exercise` (the caller has not run this exact call yet; interpreter wall time means nothing)."""
        if self.fake:
            if exercise:
                fn()
            return [model_us * math.exp(self.rng.gauss(0.0, 0.01)) for _ in range(iters)]
        torch = self.torch
        for _ in range(self.args.warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(400_000 * iters)  # ~0.2 ms per call queued: the host runs ahead of the GPU
        for start, end in zip(starts, ends):
            self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)]

    def fake_model_us(self, moved: dict, ctas: int, splits: int, factor: float = 1.0) -> float:
        """FAKE: a pretend device whose bandwidth grows with the grid until ~2 waves of 132 SMs."""
        fill = min(1.0, ctas / 264) ** 0.5
        return factor * (3.0 + moved["bytes_moved"] / (3.6e12 * fill) * 1e6 + 0.02 * splits)

    # ---------------------------------------------------------------- phase 1: tests

    def run_tests(self) -> bool:
        from .cases import make_case
        from .reference import decode_attention_ref
        from .splitkv import CANDIDATE_CONFIGS, decode_attention, launch_config

        torch, args = self.torch, self.args
        self.doc["phase"] = "tests"
        if self.fake:  # the interpreter: tiny cases
            cases = {"ragged-paged": ([1, 37, 100], 8, 1, 16, 8), "contiguous-mha": ([20, 70], 2, 2, 16, None)}
            sweep_case = ([5, 90], args.q_heads, args.kv_heads, args.head_dim, args.page_size)
        else:
            cases = {"ragged-paged16": ([1, 77, 1000, 4097], 64, 8, 128, 16),
                     "contiguous-gqa4-d64": ([300, 2049], 16, 4, 64, None),
                     "paged1-sglang-d96": ([129, 600], 16, 2, 96, 1)}
            sweep_case = ([1, 1500, 4096], args.q_heads, args.kv_heads, args.head_dim, args.page_size)
        dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
        plan = [(name, dt, None) for name in cases for dt in dtypes]
        # Every config the sweep may tune to, on the sweep's own shape (so its compiles are reused).
        plan += [("sweep-shape", "bf16", c) for c in CANDIDATE_CONFIGS]
        cases["sweep-shape"] = sweep_case
        self.say(f"# tests on {self.device_name}: decode_attention vs the fp64 reference")
        self.say(f"{'case':<22} {'dtype':<5} {'config':<9} {'S':>4} {'rel err':>9} {'max abs':>9} {'lse err':>9} ok")
        ok_all = True
        for i, (name, dt_name, config) in enumerate(plan):
            seq_lens, q_heads, kv_heads, head_dim, page_size = cases[name]
            dtype = dtypes[dt_name]
            q, k, v, bt, lens = make_case(seq_lens, q_heads, kv_heads, head_dim, page_size, dtype=dtype,
                                          seed=args.seed * 1000 + i, device=self.device)
            ref_o, ref_lse = decode_attention_ref(q, k, v, bt, lens)
            cfg = config or launch_config(head_dim, torch.empty((), dtype=dtype).element_size())
            blocks = -(-max(seq_lens) // cfg.block_n)
            first = None
            for splits in sorted({1, min(3, blocks), blocks}):
                record = {"case": name, "dtype": dt_name, "config": cfg.name, "splits": splits}
                try:
                    out, lse, parts = decode_attention(
                        q, k, v, bt, lens, target_ctas=splits * len(seq_lens) * kv_heads, block_n=cfg.block_n,
                        num_warps=cfg.num_warps, num_stages=cfg.num_stages, out_dtype=torch.float32,
                        return_lse=True, return_partials=True)
                    native = decode_attention(q, k, v, bt, lens, target_ctas=splits * len(seq_lens) * kv_heads,
                                              block_n=cfg.block_n, num_warps=cfg.num_warps,
                                              num_stages=cfg.num_stages)
                    if not self.fake:
                        torch.cuda.synchronize()
                    err = (out.double() - ref_o)
                    rel = float(err.norm() / ref_o.norm())
                    max_abs = float(err.abs().max())
                    lse_err = float((lse.double() - ref_lse).abs().max())
                    ulp = torch.finfo(dtype).eps * ref_o.abs() + 1e-5
                    native_ok = bool(((native.double() - ref_o).abs() <= ulp).all()) and native.dtype == dtype
                    first = out if first is None else first
                    split_diff = float((out - first).abs().max())
                    passed = (bool(torch.isfinite(out).all()) and parts["splits"] == splits and rel <= REL_FP32_OUT
                              and lse_err <= LSE_ATOL and native_ok and split_diff <= SPLIT_ATOL)
                    record.update(rel_err=rel, max_abs_err=max_abs, lse_err=lse_err, native_within_1ulp=native_ok,
                                  diff_vs_one_split=split_diff, passed=passed)
                except Exception as exc:  # a compile or launch failure is a failed check, not a crash
                    record.update(passed=False, error=f"{type(exc).__name__}: {exc}".splitlines()[0][:300],
                                  traceback=traceback.format_exc()[-4000:])
                    rel = max_abs = lse_err = math.nan
                ok_all &= record["passed"]
                self.doc["tests"].append(record)
                self.say(f"{name:<22} {dt_name:<5} {cfg.name:<9} {splits:>4} {rel:>9.1e} {max_abs:>9.1e} "
                         f"{lse_err:>9.1e} {'yes' if record['passed'] else 'NO ' + record.get('error', '')}")
            self.doc["tests_passed"] = ok_all
            self.save()
        self.say(f"tests: {'all passed' if ok_all else 'FAILED'} ({len(self.doc['tests'])} checks, "
                 f"{self.elapsed():.0f} s)")
        return ok_all

    # ---------------------------------------------------------------- phase 2: the sweep

    def run_sweep(self) -> None:
        from .splitkv import CANDIDATE_CONFIGS, DEFAULT_TARGET_CTAS, decode_attention, launch_config, num_splits

        torch, args = self.torch, self.args
        self.doc["phase"] = "sweep"
        dtype, itemsize = torch.bfloat16, 2
        shapes = shape_order(args.batch, args.context)
        page_bytes = args.page_size * args.kv_heads * args.head_dim * itemsize
        pages_needed = {s: s[0] * -(-s[1] // args.page_size) for s in shapes}
        if not self.fake:
            torch.cuda.empty_cache()  # what the tests phase left cached is free for the pools
            free = torch.cuda.mem_get_info()[0]
            room = 0.85 * free - L2_FLUSH_BYTES - (2 << 30)  # headroom for SDPA, partials, the allocator
            for shape in sorted(shapes, key=lambda s: -pages_needed[s]):
                if 2 * pages_needed[shape] * page_bytes > room:
                    shapes.remove(shape)
                    self.skip(shape, f"K+V need {2 * pages_needed[shape] * page_bytes / 2**30:.1f} GiB, "
                                     f"{room / 2**30:.1f} GiB free")
        if not shapes:
            return
        pool_pages = max(pages_needed[s] for s in shapes)
        gen = torch.Generator(device=self.device).manual_seed(args.seed)
        pool_shape = (pool_pages, args.page_size, args.kv_heads, args.head_dim)
        # One pool for every shape: a shape uses its first B * pages_per_seq pages, in order, so the
        # SDPA view below is the same bytes with no copy. Random, never zeros (zeros can time faster).
        try:
            k_pool = torch.randn(pool_shape, generator=gen, device=self.device, dtype=dtype)
            v_pool = torch.randn(pool_shape, generator=gen, device=self.device, dtype=dtype)
            self.flush = None if self.fake else torch.empty(L2_FLUSH_BYTES, dtype=torch.int8, device=self.device)
        except Exception as exc:  # e.g. less memory free than mem_get_info said
            message = f"K/V pools of {2 * pool_pages * page_bytes / 2**30:.1f} GiB: {type(exc).__name__}: {exc}"
            self.doc["errors"].append({"error": message.splitlines()[0][:300]})
            self.say(f"sweep not run: {message.splitlines()[0][:300]}")
            return
        sdpa_variants = _sdpa_variants(torch, self.fake)
        flash = _optional_flash_attn()
        self.doc["others"] = {"flash_attn": flash[0], "flashinfer": _importable("flashinfer") and
                              "installed, not timed (no wrapper here)" or "not installed"}
        table = launch_config(args.head_dim, itemsize)
        self.say(f"# sweep on {self.device_name}: H_q={args.q_heads} H_kv={args.kv_heads} D={args.head_dim} bf16 "
                 f"page={args.page_size}; {args.repeats} repeats x median of {args.iters}; table config {table.name}")
        self.say(f"{'batch':>5} {'context':>7} {'target':>6} {'S':>4} {'config':<9} {'us':>9} {'GB/s':>7} "
                 f"{'%peak':>6} {'vs unset':>8} {'sdpa us':>9} {'vs sdpa':>7}")
        # Seconds per GB moved by the timed calls, learnt from the large shapes done (on small ones
        # compiles and launches dominate: the fixed 10 s per shape stands for them).
        seconds_per_gb, learnt = 1 / 1500, []
        for shape in shapes:
            batch, context = shape
            moved = bytes_moved(batch, context, args.q_heads, args.kv_heads, args.head_dim, itemsize)
            calls = (len(args.targets) + 2) * args.repeats * (args.iters + args.warmup)
            calls += 0 if args.no_tune else len(CANDIDATE_CONFIGS) * (args.iters // 2 + args.warmup)
            gigabytes = calls * moved["bytes_moved"] / 1e9
            estimate = 10.0 + gigabytes * seconds_per_gb
            if self.elapsed() + estimate > args.budget_s:
                self.skip(shape, f"budget: ~{estimate:.0f} s estimated, {args.budget_s - self.elapsed():.0f} s left")
                continue
            shape_start = time.monotonic()
            try:
                self.measure_shape(shape, moved, k_pool, v_pool, table, sdpa_variants, flash[1], decode_attention,
                                   num_splits, DEFAULT_TARGET_CTAS, CANDIDATE_CONFIGS)
            except Exception as exc:  # one shape's failure (an OOM, say) must not lose the others
                message = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                self.doc["errors"].append({"batch": batch, "context": context, "error": message,
                                           "traceback": traceback.format_exc()[-4000:]})
                self.say(f"{batch:>5} {context:>7} ERROR {message}")
                if not self.fake:
                    torch.cuda.empty_cache()
            spent = time.monotonic() - shape_start
            if gigabytes / 1500 > 10 and not self.fake:
                learnt.append(max(0.0, spent - 10.0) / gigabytes)
                seconds_per_gb = max(learnt)
            self.save()

    def skip(self, shape, why: str) -> None:
        self.doc["skipped"].append({"batch": shape[0], "context": shape[1], "why": why})
        self.say(f"{shape[0]:>5} {shape[1]:>7} skipped: {why}")

    def measure_shape(self, shape, moved, k_pool, v_pool, table, sdpa_variants, flash_call, decode_attention,
                      num_splits, default_target, candidates) -> None:
        torch, args = self.torch, self.args
        batch, context = shape
        pages_per_seq = -(-context // args.page_size)
        used = batch * pages_per_seq
        block_table = torch.arange(used, device=self.device, dtype=torch.int32).view(batch, pages_per_seq)
        seq_lens = torch.full((batch,), context, device=self.device, dtype=torch.int32)
        q = torch.randn((batch, args.q_heads, args.head_dim), device=self.device, dtype=torch.bfloat16)
        k_bld = k_pool[:used].view(batch, pages_per_seq * args.page_size, args.kv_heads, args.head_dim)[:, :context]
        v_bld = v_pool[:used].view(batch, pages_per_seq * args.page_size, args.kv_heads, args.head_dim)[:, :context]

        def kernel(target, config):
            return lambda: decode_attention(q, k_pool, v_pool, block_table, seq_lens, target_ctas=target,
                                            block_n=config.block_n, num_warps=config.num_warps,
                                            num_stages=config.num_stages, max_seq_len=context)

        def splits_of(target, config):
            return num_splits(target or default_target, batch, args.kv_heads, -(-context // config.block_n))

        def model(target, config, factor=1.0):
            s = splits_of(target, config)
            return self.fake_model_us(moved, batch * args.kv_heads * s, s, factor) if self.fake else None

        record = {"batch": batch, "context": context, "fake": self.fake, "bytes_moved": moved["bytes_moved"],
                  "table_config": table.name, "tune": [], "arms": {}, "sdpa": None, "flash_attn": None}
        config = table
        if not args.no_tune:
            best = None
            for cand in candidates:
                try:
                    fake_factor = 1.0 + 0.01 * abs(cand.block_n - 64) / 32 + 0.005 * cand.num_stages
                    us = _median(self.time_us(kernel(None, cand), iters=max(1, args.iters // 2),
                                              model_us=model(None, cand, fake_factor), exercise=True))
                except Exception as exc:  # e.g. out of shared memory for this tile: not a candidate here
                    record["tune"].append({"config": cand.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
                    continue
                record["tune"].append({"config": cand.name, "median_us": us})
                if best is None or us < best[0]:
                    best = (us, cand)
            if best is not None:
                config = best[1]
        record["config"] = config.name

        # Correctness on this shape: every arm against SDPA's output on the same bytes. SDPA reads
        # [B, H_kv, L, D]: a transposed view of the pool, or (if this torch refuses the strides) a
        # copy; the first backend that runs is the one timed (each alone: no silent fallback).
        reference, sdpa_kv, sdpa_call, sdpa_errors = None, None, None, []
        for layout in ("view", "copy"):
            for backend, call in sdpa_variants:
                try:
                    kv = tuple(x.transpose(1, 2) for x in (k_bld, v_bld))
                    kv = kv if layout == "view" else tuple(x.contiguous() for x in kv)
                    with warnings.catch_warnings():  # "backend not used because ..." for each refusal
                        warnings.simplefilter("ignore")
                        reference = call(q, *kv).float()
                except Exception as exc:
                    sdpa_errors.append(f"{layout}/{backend}: {type(exc).__name__}: {exc}".splitlines()[0][:300])
                    kv = None
                    if not self.fake:
                        torch.cuda.empty_cache()
                    continue
                sdpa_kv, sdpa_call = kv, call
                record["sdpa_layout"], record["sdpa_backend"] = layout, backend
                break
            if sdpa_call is not None:
                break
        if sdpa_kv is None:
            record["sdpa"] = {"error": "; ".join(sdpa_errors) or "torch SDPA unavailable"}
            sdpa_call = None
        elif sdpa_errors:
            record["sdpa_errors"] = sdpa_errors
        arms = [None] + list(args.targets)
        diffs = {}
        for target in arms:
            out = kernel(target, config)().float()
            if reference is None:
                diffs[target] = None
                continue
            diffs[target] = float((out - reference).abs().max())
            rel = float((out - reference).norm() / reference.norm())
            if not rel <= SWEEP_REL_VS_SDPA:  # NaN fails too
                self.doc["errors"].append({"batch": batch, "context": context, "target": target,
                                           "error": f"disagrees with SDPA: relative error {rel:.3g}"})
                self.say(f"{batch:>5} {context:>7} {UNSET if target is None else target:>6} "
                         f"DISAGREES with SDPA: relative error {rel:.3g} > {SWEEP_REL_VS_SDPA}")
        del reference

        times: dict = {target: [] for target in arms}
        sdpa_times: list[float] = []
        flash_times: list[float] = []
        for repeat in range(args.repeats):
            order = arms[repeat % len(arms):] + arms[:repeat % len(arms)]  # rotate: drift spreads over arms
            for target in order:
                times[target].append(_median(self.time_us(kernel(target, config), iters=args.iters,
                                                          model_us=model(target, config))))
            if sdpa_call is not None:
                sdpa_times.append(_median(self.time_us(lambda: sdpa_call(q, *sdpa_kv), iters=args.iters,
                                                       model_us=model(None, config, 1.3))))
            if flash_call is not None and not self.fake:
                try:
                    flash_times.append(_median(self.time_us(lambda: flash_call(q, k_bld, v_bld, seq_lens),
                                                            iters=args.iters)))
                except Exception as exc:
                    record["flash_attn"] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
                    flash_call = None
        sdpa_us = _median(sdpa_times) if sdpa_times else None
        if sdpa_times:
            record["sdpa"] = self.arm_figures(sdpa_times, moved)
        if flash_times:
            record["flash_attn"] = self.arm_figures(flash_times, moved)
        unset_us = _median(times[None])
        for target in arms:
            splits = splits_of(target, config)
            figures = self.arm_figures(times[target], moved)
            figures.update(target=target, splits=splits, ctas=batch * args.kv_heads * splits,
                           vs_unset=unset_us / figures["median_us"] - 1, max_abs_diff_vs_sdpa=diffs[target],
                           vs_sdpa=(sdpa_us / figures["median_us"] - 1) if sdpa_us else None,
                           runs=[run_record(batch=batch, context=context, target=target, splits=splits,
                                            kv_heads=args.kv_heads, moved=moved, time_us=us, sdpa_us=None,
                                            peak=self.peak, max_abs_diff=diffs[target], config=config.name,
                                            effective_target_ctas=target or default_target,
                                            **({"fake_timing": True} if self.fake else {}))
                                 for us in times[target]])
            record["arms"][UNSET if target is None else str(target)] = figures
        best_target = min(arms, key=lambda t: _median(times[t]))
        gain = unset_us / _median(times[best_target]) - 1
        record["recommended"] = UNSET if best_target is None or gain < NOISE_FLOOR else best_target
        record["recommended_gain_vs_unset"] = 0.0 if record["recommended"] == UNSET else gain
        self.doc["shapes"].append(record)
        self.doc["goals"] = self.goals()
        for target in arms:
            a = record["arms"][UNSET if target is None else str(target)]
            frac = f"{a['bandwidth_fraction'] * 100:>5.1f}%" if a["bandwidth_fraction"] is not None else f"{'-':>6}"
            vs_sdpa = f"{a['vs_sdpa'] * 100:>+6.1f}%" if a["vs_sdpa"] is not None else f"{'-':>7}"
            sdpa_col = f"{sdpa_us:>9.1f}" if sdpa_us else f"{'-':>9}"
            self.say(f"{batch:>5} {context:>7} {UNSET if target is None else target:>6} {a['splits']:>4} "
                     f"{config.name:<9} {a['median_us']:>9.1f} {a['bandwidth_gbps']:>7.0f} {frac} "
                     f"{a['vs_unset'] * 100:>+7.1f}% {sdpa_col} {vs_sdpa}")
        self.say(f"{batch:>5} {context:>7} recommended target: {record['recommended']}"
                 + (f" ({record['recommended_gain_vs_unset'] * 100:+.1f}% vs unset)"
                    if record["recommended"] != UNSET else " (no candidate beats it by 2%)"))

    def arm_figures(self, repeat_us: list[float], moved: dict) -> dict:
        us = _median(repeat_us)
        gbps = moved["bytes_moved"] / (us * 1e-6) / 1e9
        return {"median_us": us, "repeats_us": repeat_us, "bandwidth_gbps": gbps,
                "bandwidth_fraction": gbps * 1e9 / self.peak if self.peak else None}

    def goals(self) -> list[dict]:
        """The issue's goals, per shape done: >= 80% of peak at batch >= 64 and context >= 32k (best
        arm), faster than SDPA at context >= 4k (best arm)."""
        rows = []
        for shape in self.doc["shapes"]:
            best = min(shape["arms"].values(), key=lambda a: a["median_us"])
            row = {"batch": shape["batch"], "context": shape["context"], "best_us": best["median_us"],
                   "best_fraction": best["bandwidth_fraction"]}
            if shape["batch"] >= 64 and shape["context"] >= 32768 and best["bandwidth_fraction"] is not None:
                row["bandwidth_goal_met"] = best["bandwidth_fraction"] >= BANDWIDTH_GOAL
            if shape["context"] >= 4096 and shape.get("sdpa") and "median_us" in shape["sdpa"]:
                row["faster_than_sdpa"] = best["median_us"] < shape["sdpa"]["median_us"]
            rows.append(row)
        return rows

    def summary(self) -> None:
        """The last lines of the output (what a cut-off terminal keeps): one row per shape, with the goals."""
        if not self.doc["shapes"]:
            return
        self.say("# summary: best arm per shape; goals: >= 80% of peak at batch >= 64 and context >= 32k, "
                 "faster than SDPA at context >= 4k")
        self.say(f"{'batch':>5} {'context':>7} {'unset us':>9} {'best':>6} {'best us':>9} {'%peak':>6} "
                 f"{'sdpa us':>9} {'backend':<19} {'vs sdpa':>7} {'recommended':>11} goals")
        by_shape = {(g["batch"], g["context"]): g for g in self.doc["goals"]}
        for shape in self.doc["shapes"]:
            best_key = min(shape["arms"], key=lambda k: shape["arms"][k]["median_us"])
            best = shape["arms"][best_key]
            sdpa_us = (shape.get("sdpa") or {}).get("median_us")
            frac = f"{best['bandwidth_fraction'] * 100:>5.1f}%" if best["bandwidth_fraction"] is not None else f"{'-':>6}"
            goal = by_shape[(shape["batch"], shape["context"])]
            marks = [f"{name}={'yes' if goal[name] else 'NO'}" for name in ("bandwidth_goal_met", "faster_than_sdpa")
                     if name in goal]
            self.say(f"{shape['batch']:>5} {shape['context']:>7} {shape['arms'][UNSET]['median_us']:>9.1f} "
                     f"{best_key:>6} {best['median_us']:>9.1f} {frac} "
                     + (f"{sdpa_us:>9.1f} " if sdpa_us else f"{'-':>9} ")
                     + f"{shape.get('sdpa_backend') or '-':<19} "
                     + (f"{sdpa_us / best['median_us'] - 1:>+7.1%} " if sdpa_us else f"{'-':>7} ")
                     + f"{shape['recommended']!s:>11} {' '.join(marks)}")

    # ---------------------------------------------------------------- phase 3: evidence

    def evidence_docs(self) -> list[dict]:
        """One doc per (candidate, context) with the shapes done so far; ids stay fixed across rewrites."""
        from . import __version__

        args, docs = self.args, []
        for context in args.context:
            done = [s for s in self.doc["shapes"] if s["context"] == context]
            if not done:
                continue
            for candidate in args.targets:
                runs = []
                for shape in sorted(done, key=lambda s: s["batch"]):
                    for arm, key in (("A", UNSET), ("B", str(candidate))):
                        runs += [{"arm": arm, "repeat": i, **r} for i, r in enumerate(shape["arms"][key]["runs"])]
                ident = self.evidence_ids.setdefault((candidate, context), secrets.token_hex(4))
                setup = {
                    "inventory": None, "git_sha": self.git_sha, "engine": "knobkeeper-kernels",
                    "engine_version": f"{__version__} (torch {self.torch.__version__}, triton {self.triton.__version__})",
                    "model": None, "device": self.device_name,
                    "workload": {"api": "kernel", "input_len": context, "output_len": 1, "requests_per_run": None,
                                 "duration_s": None},
                    "kernel": {**self.doc["shape"], "heads": args.q_heads, "interpreter": self.fake,
                               "fake_timing": self.fake, "timing": self.doc["timing"],
                               "peak_bandwidth_gbps": self.doc["peak_bandwidth_gbps"],
                               "configs": {str(s["batch"]): s["config"] for s in done}},
                }
                tool = "knobkeeper_kernels.gpu_check" + (" (FAKE timing)" if self.fake else "")
                docs.append(evidence_doc(baseline=None, candidate=candidate, runs=runs, setup=setup, tool=tool,
                                         ident=ident, created=self.created))
        return docs


def shape_order(batches, contexts) -> list[tuple[int, int]]:
    """(batch, context) in the order measured: the goals' shapes (batch >= 64 and context >= 32k)
    first, then the rest; larger first within each, so a cut run has the figures that matter."""
    shapes = [(b, c) for b in batches for c in contexts]
    return sorted(shapes, key=lambda s: (not (s[0] >= 64 and s[1] >= 32768), -s[0] * s[1], -s[1]))


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _sdpa_variants(torch, fake: bool) -> list[tuple[str, object]]:
    """[(backend name, call(q, k, v))]: torch SDPA with GQA on K, V as [B, H_kv, L, D], one entry
    per backend, tried in this order. Never the math backend on a GPU: it repeats K and V per query
    head (8x the memory at 128k x 128). On the CPU (fake mode) the default dispatch."""
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def plain(q, k, v):
        return sdpa(q[:, :, None, :], k, v, enable_gqa=True)[:, :, 0, :]

    if fake:
        return [("default", plain)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # a torch without backend selection: nothing safe to time
        return []

    def pinned(backend):
        def call(q, k, v):
            with sdpa_kernel([backend]):
                return plain(q, k, v)
        return call

    return [(name.lower(), pinned(getattr(SDPBackend, name)))
            for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION") if hasattr(SDPBackend, name)]


def _optional_flash_attn():
    """('installed'|'not installed', call or None): flash_attn's kv-cache decode, if on the machine."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except Exception:
        return "not installed", None

    def call(q, k_bld, v_bld, seq_lens):
        return flash_attn_with_kvcache(q[:, None], k_bld, v_bld, cache_seqlens=seq_lens)[:, 0]

    return "installed", call


def select_triton_mode(fake: bool) -> str | None:
    """The interpreter for a fake run (before triton is imported), the compiler for a real one;
    a problem line if it is too late to choose."""
    if fake:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            return "--fake-timing: triton was imported before the interpreter could be switched on"
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)  # a GPU run compiles: never the interpreter
    return None


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
        _check_out(Path(args.out), args.fake_timing)
    except ArgError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    problem = select_triton_mode(args.fake_timing)
    if problem:
        print(f"gpu_check: {problem}", file=sys.stderr)
        return 2
    # "unset" must mean unset: the kernel reads the knob from the environment when not passed one.
    inherited = os.environ.pop(KNOB, None)
    try:
        import torch
    except ImportError as exc:
        print(f"gpu_check: no CUDA device here (torch is not importable: {exc}); nothing checked")
        return 0
    if not args.fake_timing and not torch.cuda.is_available():
        print(f"gpu_check: no CUDA device here (torch {torch.__version__} sees none); nothing checked "
              f"(--fake-timing runs the CPU path)")
        return 0
    import triton

    check = Check(args, torch, triton)
    check.doc["inherited_env"] = {KNOB: inherited}
    check.say(f"# gpu_check {check.doc['started']} on {check.device_name}: python {check.doc['python']}, "
              f"torch {torch.__version__}, triton {triton.__version__}; budget {args.budget_s:.0f} s"
              + ("; timings are FAKE (a model), not measurements" if check.fake else ""))
    check.save()
    ok = True
    try:
        if not args.skip_tests:
            ok = check.run_tests()
        check.run_sweep()
    except Exception as exc:  # keep what was measured, say where it broke, exit 1
        check.doc["errors"].append({"phase": check.doc["phase"], "error": f"{type(exc).__name__}: {exc}"[:300],
                                    "traceback": traceback.format_exc()[-4000:]})
        check.say(f"# {check.doc['phase']} stopped: {type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    check.doc["phase"] = "done"
    check.doc["finished"] = True
    check.summary()
    ok &= not check.doc["errors"]
    tests = "skipped" if args.skip_tests else ("passed" if check.doc["tests_passed"] else "FAILED")
    check.say(f"# done in {check.elapsed():.0f} s: tests {tests}; {len(check.doc['errors'])} sweep errors; "
              f"{len(check.doc['shapes'])} shapes measured, {len(check.doc['skipped'])} skipped; "
              f"files in {args.out}: {', '.join(check.names.values())}")
    check.save()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
