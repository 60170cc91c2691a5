"""The canary once on the real stack (issue 23, item 5; by hand, not in CI): inventory/local_vllm.py
deployed with TWO decode workers (KNOBKEEPER_LOCAL_VLLM_WORKERS=decode=2: 3 vLLM instances, ~9.3 GB, the machine-wide
maximum: hold the heavy lock, nobody else may run vLLM meanwhile), live traffic from knobkeeper's load
generator through vllm-router, then `knobkeeper canary VLLM_CPU_OMP_THREADS_BIND=0-1 --role decode
--hosts 1` reading the `vllm:*` metrics through the engine family (knobkeeper.engine.vllm.VLLM_METRICS).
Writes the canary's JSON and what happened to results_canary.json; stops everything it started.

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_noise/canary_once.py [--duration 2m --interval 15s]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from knobkeeper.deploy.api import run_deploy  # noqa: E402
from knobkeeper.deploy.local import stop_local  # noqa: E402
from knobkeeper.loadgen import run_load  # noqa: E402
from tests.infra import kk, make_infra_repo  # noqa: E402
from tests.procs import free_port  # noqa: E402

INV = "inventory/local_vllm.py"
NAMES = ("prefill", "decode", "router", "router_metrics", "prefill_side_channel", "decode_side_channel")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", default="2m")
    ap.add_argument("--interval", default="15s")
    ap.add_argument("--calibrate", default="1m")
    ap.add_argument("--set", default="VLLM_CPU_OMP_THREADS_BIND=0-1")
    ap.add_argument("--concurrency", type=int, default=16, help="the live traffic's streams")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kkc"))
    project = make_infra_repo(tmp)
    os.environ["KNOBKEEPER_LOCAL_VLLM_WORKERS"] = "decode=2"   # every command below reads it
    # decode-2 takes the decode port + 1 and the decode side channel + 1 (random free ports: the
    # next one up is free but for a rare collision, which the deploy's port check reports)
    ports = {n: free_port() for n in NAMES}
    os.environ["KNOBKEEPER_LOCAL_VLLM_PORTS"] = ",".join(f"{k}={v}" for k, v in ports.items())
    prefix = project.root / ".knobkeeper-state" / "local-vllm"
    out: dict = {"ports": ports, "set": args.set, "concurrency": args.concurrency}
    stop_load = threading.Event()
    loads: list[dict] = []
    try:
        t0 = time.monotonic()
        deployed = run_deploy(project, INV, timeout=1500)
        out["deploy_s"] = round(time.monotonic() - t0, 1)
        out["deploy_ok"], out["deploy_error"] = deployed.ok, deployed.error
        print("deploy:", deployed.ok, deployed.error, out["deploy_s"], flush=True)
        if not deployed.ok:
            print(deployed.output[-3000:])
            return 1
        router = f"http://127.0.0.1:{ports['router']}"

        def traffic() -> None:
            while not stop_load.is_set():
                try:
                    s = run_load(router, args.concurrency, duration=10, api="completions", model="tiny", input_len=64,
                                 output_len=64, timeout_s=60)
                    loads.append({k: s.get(k) for k in ("output_tokens_per_s", "completed", "errors")})
                except Exception as exc:  # noqa: BLE001  (a restart's failures: keep loading)
                    loads.append({"error": repr(exc)[:200]})

        thread = threading.Thread(target=traffic, daemon=True)
        thread.start()
        time.sleep(5)
        t0 = time.monotonic()
        result = kk(project, "canary", args.set, "--role", "decode", "--inventory", INV, "--hosts", "1",
                    "--duration", args.duration, "--interval", args.interval, "--calibrate", args.calibrate,
                    "--json")
        out["canary_s"] = round(time.monotonic() - t0, 1)
        out["canary_exit"] = result.exit_code
        body = result.output
        try:
            out["canary"] = json.loads(body[body.index("{"):])
        except ValueError:
            out["canary_output"] = body[-4000:]
        print(body[-6000:], flush=True)
    finally:
        stop_load.set()
        out["loads"] = loads
        stopped = stop_local(prefix, timeout=60)
        out["stopped_pids"] = stopped
        (Path(__file__).parent / "results_canary.json").write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
