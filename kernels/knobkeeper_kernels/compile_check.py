"""Compile both split-KV kernels for NVIDIA targets without a GPU (ahead of time).

    python -m knobkeeper_kernels.compile_check --arch 90,120 [--dtype bf16,fp16,fp32] [--configs table|all]

Prints one JSON line per (kernel, arch, dtype, stage-1 config) with the sizes of the PTX and
cubin produced (and, for stage 1, the registers and spill bytes ptxas reports), and exits 1 if
any compile fails. `--configs all` compiles stage 1 with every
config the GPU check tunes over (splitkv.CANDIDATE_CONFIGS), not only the table's default. Must run WITHOUT TRITON_INTERPRET (the interpreter replaces
the compiler); ptxas ships inside the triton wheel, so no CUDA toolkit or driver is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
_ALIGNED_STRIDES = {"stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs",
                    "stride_vh", "stride_mob", "stride_moh", "stride_mos", "stride_ob", "stride_oh"}


def _signatures(dtype: str, group: int = 8, head_dim: int = 128, page_size: int = 16, block_n: int = 64):
    """(kernel, signature, constexprs) for stage 1 and the combine, one decode configuration
    (GQA 8, D=128, 16-token pages: the GPU check's sweep shape)."""
    from .splitkv import COMBINE_CHUNK, _splitkv_combine, _splitkv_stage1

    stage1_sig = {
        "Q": f"*{dtype}", "K": f"*{dtype}", "V": f"*{dtype}",
        "BlockTable": "*i32", "SeqLens": "*i32", "MidO": "*fp32", "MidLse": "*fp32",
        "sm_scale_log2e": "fp32",
    }
    for name in ("stride_qb", "stride_qh", "stride_kp", "stride_ks", "stride_kh", "stride_vp", "stride_vs",
                 "stride_vh", "stride_btb", "stride_mob", "stride_moh", "stride_mos", "stride_mlb", "stride_mlh",
                 "NUM_SPLITS"):
        stage1_sig[name] = "i32"
    stage1_const = {"GROUP": group, "HEAD_DIM": head_dim, "PAGE_SIZE": page_size,
                    "BLOCK_H": max(16, group), "BLOCK_D": head_dim, "BLOCK_N": block_n,
                    "NATIVE_DOT": dtype in ("bf16", "fp16")}  # as decode_attention launches it on a GPU
    stage1_sig.update({name: "constexpr" for name in stage1_const})

    combine_sig = {"MidO": "*fp32", "MidLse": "*fp32", "SeqLens": "*i32", "Out": f"*{dtype}", "Lse": "*fp32"}
    for name in ("stride_mob", "stride_moh", "stride_mos", "stride_mlb", "stride_mlh", "stride_ob", "stride_oh",
                 "NUM_SPLITS", "num_q_heads"):
        combine_sig[name] = "i32"
    combine_sig.update({name: "constexpr" for name in ("HEAD_DIM", "BLOCK_N", "BLOCK_S", "BLOCK_D", "CHUNK_S",
                                                        "UNIFORM")})
    # One split, a typical count, and the most a small batch asks for (2048 targets / 8 KV heads).
    combines = [(_splitkv_combine, combine_sig, {"HEAD_DIM": head_dim, "BLOCK_N": block_n, "BLOCK_S": block_s,
                                                 "BLOCK_D": head_dim, "CHUNK_S": min(COMBINE_CHUNK, block_s),
                                                 "UNIFORM": False})
                for block_s in (1, 16, 256)]
    return [(_splitkv_stage1, stage1_sig, stage1_const), *combines]


def ptxas_report(ptx: str) -> dict:
    """Registers and spill bytes per thread from ptxas -v (the ptxas inside the triton wheel), or
    Nones when it is not there or does not know the target."""
    import re
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    target = re.search(r"^\s*\.target\s+(\w+)", ptx, re.M)
    bin_dir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    ptxas = next((p for p in (bin_dir / "ptxas-blackwell", bin_dir / "ptxas")
                  if p.exists() and (p.name == "ptxas" or (target and "sm_1" in target.group(1)))), None)
    report = {"registers": None, "spill_bytes": None}
    if ptxas is None or target is None:
        return report
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "k.ptx"
        source.write_text(ptx)
        done = subprocess.run([str(ptxas), f"-arch={target.group(1)}", "-v", str(source), "-o", str(Path(tmp) / "k.o")],
                              capture_output=True, text=True, timeout=120)
    regs = re.search(r"Used (\d+) registers", done.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", done.stderr)
    if done.returncode == 0 and regs and spills:
        report = {"registers": int(regs.group(1)), "spill_bytes": int(spills.group(1)) + int(spills.group(2))}
    return report


def compile_for(arch: int, dtype: str = "bf16", config=None) -> list[dict]:
    """Compile both kernels for sm_<arch>; one record per kernel with the artefact sizes.

    `config` (a splitkv.LaunchConfig) sets stage 1's block, warps and stages; default the table's.
    """
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("compile_check: unset TRITON_INTERPRET (the interpreter does not compile)")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from .splitkv import launch_config

    if config is None:
        config = launch_config(128, 4 if dtype == "fp32" else 2)
    records = []
    for fn, signature, constexprs in _signatures(dtype, block_n=config.block_n):
        is_stage1 = fn.__name__ == "_splitkv_stage1"
        options = {"num_warps": config.num_warps, "num_stages": config.num_stages} if is_stage1 else {}
        # What the JIT sees at a real launch: torch's pointers and these strides are multiples of 16
        # (H*D, D, page_size*H_kv*D, ...), which lets K and V be read in 16-byte vectors.
        aligned = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name, ty in signature.items()
                   if ty.startswith("*") or name in _ALIGNED_STRIDES}
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned),
                                  target=GPUTarget("cuda", arch, 32), options=options)
        records.append({
            "kernel": fn.__name__, "arch": f"sm_{arch}", "dtype": dtype,
            "config": config.name if is_stage1 else None, "block_s": None if is_stage1 else constexprs["BLOCK_S"],
            "ptx_bytes": len(compiled.asm.get("ptx", "")),
            "mma": "mma.sync" in compiled.asm.get("ptx", "") or "wgmma" in compiled.asm.get("ptx", ""),
            "cubin_bytes": len(compiled.asm.get("cubin", b"")),
            "shared_bytes": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps,
            **(ptxas_report(compiled.asm["ptx"]) if is_stage1 else {}),
            "seconds": round(time.perf_counter() - start, 2),
        })
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m knobkeeper_kernels.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="90,120", help="comma-separated SM versions (default 90,120)")
    parser.add_argument("--dtype", default="bf16", help="comma-separated: bf16, fp16, fp32 (default bf16)")
    parser.add_argument("--configs", choices=("table", "all"), default="table",
                        help="stage 1 with the table's config only, or with every tuning candidate too")
    args = parser.parse_args(argv)
    from .splitkv import CANDIDATE_CONFIGS

    failed = False
    for arch in (int(a) for a in args.arch.split(",")):
        for dtype in args.dtype.split(","):
            if dtype not in _DTYPES:
                print(f"--dtype: {dtype!r} is not one of {', '.join(_DTYPES)}", file=sys.stderr)
                return 2
            configs = [None] + (list(CANDIDATE_CONFIGS) if args.configs == "all" else [])
            for config in configs:
                try:
                    for record in compile_for(arch, _DTYPES[dtype], config):
                        if config is not None and record["kernel"] != "_splitkv_stage1":
                            continue  # the combine does not depend on stage 1's config
                        print(json.dumps(record), flush=True)
                except Exception as exc:  # report every target, then fail
                    failed = True
                    print(json.dumps({"arch": f"sm_{arch}", "dtype": dtype, "config": getattr(config, "name", None),
                                      "error": f"{type(exc).__name__}: {exc}"}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
