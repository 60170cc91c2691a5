"""knobkeeper_amx_permission: asks Linux for Intel AMX tile state once per process, at interpreter
start-up, in the CPU engine's environment. Installed there by knobkeeper's engine step
(knobkeeper.engine.vllm_install), never imported by knobkeeper itself.

Why. Since Linux 5.16 a process may execute AMX tile instructions only after it asked for the
state with `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; the first tile instruction
without that permission is SIGILL. The permission is per process, inherited on fork and cleared on
execve, so every interpreter vLLM spawns (API server, engine core, worker) needs its own.
vLLM 0.32.0's CPU attention (vllm/v1/attention/backends/cpu_attn.py) takes its "amx" path for bf16
with a block size that is a multiple of 32 (the only block sizes its CPU backend accepts) whenever
`torch.cpu._is_amx_tile_supported()`, and never asks. oneDNN asks, but only inside its first bf16
matmul. So whichever runs first in a worker, a oneDNN bf16 op or vLLM's AMX attention, decided
whether that worker lived. Measured on a 2-core machine whose CPU advertises amx_tile/amx_bf16/
amx_int8 (freshly booted, kernel 6.x): decode's worker died of SIGILL at its first step after a Nixl
transfer in 6 of 6 deploys (dmesg with print-fatal-signals: "VLLM::Worker: potentially unexpected
fatal signal 4", code bytes `c4 e2 7b 49 f0` = tilezero tmm6; PYTHONFAULTHANDLER put it in
cpu_attention_with_kv_cache); `arch_prctl(ARCH_GET_XCOMP_PERM)` read 0x200e7 (bit 18 clear) after
`import torch` and `import vllm._C`. With this one syscall made at start-up the same deploy passed
(481 of 481 prompt tokens over the connector). An earlier explanation, UCX's in-place code patching
of mmap ("bistro"), was not the cause: UCX_MEM_MMAP_HOOK_MODE=reloc did not cure it.

The alternatives, rejected: `--dtype float32` avoids the AMX path but serves a dtype no GPU stack
runs and doubles the KV cache; `--block-size 16` (off the multiple of 32) is refused by vLLM
("MultipleOf(32)"); patching vLLM's attention to ask is a new patch per vLLM pin. The syscall is
what oneDNN itself does, costs microseconds, and is a no-op where there is no AMX.

What. At start-up, on Linux x86-64: `syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, 18)`. Where the
CPU or kernel has no AMX the kernel answers EINVAL and nothing changes. `OUTCOME` says what happened
("granted", "unsupported: ...", "off", "not linux x86-64"), for the engine step's check and for
`python -c "import knobkeeper_amx_permission as a; print(a.OUTCOME)"`.
KNOBKEEPER_AMX_PERMISSION=0 in the environment skips the request (to reproduce the SIGILL).
"""

from __future__ import annotations

import ctypes
import os

VARIABLE = "KNOBKEEPER_AMX_PERMISSION"
SYS_ARCH_PRCTL = 158          # x86-64 syscall number
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def permitted_mask() -> int | None:
    """The process's permitted xstate features (ARCH_GET_XCOMP_PERM), or None where it cannot be read."""
    if not _linux_x86_64():
        return None

    libc = ctypes.CDLL(None, use_errno=True)
    mask = ctypes.c_uint64(0)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(mask)) != 0:
        return None
    return mask.value


def request(environ=os.environ) -> str:
    """Ask for XTILEDATA once; the outcome in words."""
    if environ.get(VARIABLE, "").strip() == "0":
        return "off"
    if not _linux_x86_64():
        return "not linux x86-64"

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return "granted"
    return f"unsupported: {os.strerror(ctypes.get_errno())}"


def _linux_x86_64() -> bool:
    uname = os.uname()
    return uname.sysname == "Linux" and uname.machine == "x86_64"


OUTCOME = request()
