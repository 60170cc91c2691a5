"""Deploys of the local stack as one Slurm job, on a real local cluster (munged, slurmctld, 3 slurmd):

  first deploy          wall time of `pyinfra -y inventory/local_slurm.py deploy.py` with no job running,
                        and from sbatch to the router's gate passed
  no-op deploy          wall time when the running job has the rendered digest (nothing submitted)
  one-knob deploy       wall time of a decode knob change: new job submitted, gated, old job cancelled;
                        and from sbatch to the old job's cancel
  Slurm's own           sbatch of a 3-component heterogeneous job that only sleeps -> RUNNING (squeue
                        polled every 20 ms), and scancel -> gone
  the engines' own      prefill, decode, router started one after another by hand (no Slurm, no
                        knobkeeper), each until it answers its health path
  overhead              one-knob deploy wall - Slurm's submit-to-running - the engines' start-up, with
                        the roles' settle (a gate holds a restarted process that long before it passes)
                        set to 0 and at the default 2 s

    .venv/bin/python bench/bench_slurm.py          # KK_BENCH_REPEATS=5 by default; as root (slurmd)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repo on sys.path)

from knobkeeper.changelog.ops import set_knob
from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.slurm.localcluster import start_cluster, stop_cluster
from knobkeeper.timeutil import parse_time
from tests.infra import FAST_ENGINE_ARGS, make_infra_repo
from tests.procs import free_port, start, stop, wait_http

REPEATS = int(os.environ.get("KK_BENCH_REPEATS", "5"))
INV = "inventory/local_slurm.py"
FAST = {"engine_args": FAST_ENGINE_ARGS, "stop_timeout": 10}


def _med(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def _secs(a: str, b: str) -> float:
    return (parse_time(b) - parse_time(a)).total_seconds()


def _deploy(project, extra=None):
    result = run_deploy(project, INV, extra_data={**FAST, **(extra or {})}, timeout=300)
    if not result.ok:
        raise SystemExit(f"deploy failed: {result.error}\n{result.output[-3000:]}")
    return result


def slurm_own(cluster, folder: Path) -> tuple[list[float], list[float], list[float]]:
    """sbatch -> RUNNING and scancel -> gone of a 3-component job that only sleeps, and how long its
    three `srun --het-group=N` steps take to launch one after another (each a `true`)."""
    script = folder / "sleep.sh"
    marks = folder / "steps"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=kk-bench-sleep\n#SBATCH --output=/dev/null\n"
                      + "#SBATCH --cpus-per-task=1\n#SBATCH hetjob\n#SBATCH --cpus-per-task=1\n#SBATCH hetjob\n"
                      + "#SBATCH --cpus-per-task=1\n"
                      + f"a=$(date +%s.%N); for g in 0 1 2; do srun --het-group=$g true; done; b=$(date +%s.%N)\n"
                      + f"echo \"$a $b\" > {marks}.$SLURM_JOB_ID\nsleep 300\n")
    running, gone, steps = [], [], []
    for _ in range(REPEATS):
        began = time.monotonic()
        ident = cluster.client("sbatch", "--parsable", str(script), check=True).stdout.strip().split(";")[0]
        while True:
            out = cluster.client("squeue", "-h", "-j", ident, "-o", "%T").stdout.split()
            if out and all(s == "RUNNING" for s in out):
                break
            time.sleep(0.02)
        running.append(time.monotonic() - began)
        mark = Path(f"{marks}.{ident}")
        while not mark.exists() or not mark.read_text().strip():
            time.sleep(0.02)
        a, b = (float(x) for x in mark.read_text().split())
        steps.append(b - a)
        began = time.monotonic()
        cluster.client("scancel", ident, check=True)
        while cluster.client("squeue", "-h", "-j", ident, "-o", "%T").stdout.split():
            time.sleep(0.02)
        gone.append(time.monotonic() - began)
    return running, gone, steps


def engines_own(folder: Path) -> list[float]:
    """prefill, decode, router (smg) started one after another, each until healthy: their sum."""
    python = sys.executable
    out = []
    for i in range(REPEATS):
        p, b, d, r, m = (free_port() for _ in range(5))
        procs = []
        began = time.monotonic()
        try:
            procs.append(start([python, "-m", "knobkeeper.sim", "--role", "prefill", "--port", str(p),
                                "--bootstrap-port", str(b), "--time-scale", "0.05"], folder / f"p{i}.log"))
            wait_http(f"http://127.0.0.1:{p}/health", 60, proc=procs[-1])
            procs.append(start([python, "-m", "knobkeeper.sim", "--role", "decode", "--port", str(d),
                                "--time-scale", "0.05"], folder / f"d{i}.log"))
            wait_http(f"http://127.0.0.1:{d}/health", 60, proc=procs[-1])
            procs.append(start([python, "-m", "smg.launch_router", "--host", "127.0.0.1", "--port", str(r),
                                "--pd-disaggregation", "--prefill", f"http://127.0.0.1:{p}", str(b), "--decode",
                                f"http://127.0.0.1:{d}", "--policy", "round_robin", "--prometheus-host", "127.0.0.1",
                                "--prometheus-port", str(m), *FAST["engine_args"]["router"]], folder / f"r{i}.log"))
            wait_http(f"http://127.0.0.1:{r}/readiness", 60, proc=procs[-1])
            out.append(time.monotonic() - began)
        finally:
            for proc in reversed(procs):
                stop(proc)
    return out


def main() -> None:
    if os.geteuid() != 0:
        raise SystemExit("bench_slurm: the local Slurm cluster runs as root")
    tmp = Path(tempfile.mkdtemp(prefix="kkb-slurm-"))
    tmp.chmod(0o755)
    ports = {k: free_port() for k in ("prefill", "bootstrap", "decode", "router", "router_metrics")}
    os.environ["KNOBKEEPER_LOCAL_PORTS"] = ",".join(f"{k}={v}" for k, v in ports.items())
    project = make_infra_repo(tmp / "repo")
    began = time.monotonic()
    cluster = start_cluster(tmp / "cluster")
    print(f"cluster up (munged, slurmctld, 3 slurmd idle): {time.monotonic() - began:.2f} s")
    os.environ["KNOBKEEPER_SLURM_ROOT"] = cluster.root
    try:
        running, gone, steps = slurm_own(cluster, tmp)
        print(f"Slurm's own: sbatch -> RUNNING {_med(running)}; scancel -> gone {_med(gone)}; three srun "
              f"steps launched in turn {_med(steps)}")
        engines = engines_own(tmp)
        print(f"the engines' own start-up (prefill, decode, router in turn): {_med(engines)}")
        first = _deploy(project)
        rec = first.record
        router = rec.service("@local", "knobkeeper-router")
        print(f"first deploy: wall {first.seconds:.2f} s; sbatch -> router gate passed "
              f"{_secs(rec.slurm.job.submitted_at, router.healthy_at):.2f} s")
        noop, calls = [], []
        for _ in range(REPEATS):
            result = _deploy(project)
            assert result.record.slurm.decision == "kept"
            noop.append(result.seconds)
            calls.append((result.record.slurm.client_calls, result.record.slurm.client_seconds))
        print(f"no-op deploy: {_med(noop)}; Slurm client calls in it: median "
              f"{statistics.median(c for c, _ in calls):g} calls, {statistics.median(t for _, t in calls):.2f} s")
        figures = {}
        change = 0
        for settle in (0, 2):
            roles = {}
            if settle == 0:
                for role in ("prefill", "decode", "router"):
                    spec = dict(json.loads(json.dumps(_role(project, role))))
                    spec["settle"] = 0
                    roles[f"role_{role}"] = spec
            walls, to_cancel = [], []
            for _ in range(REPEATS):
                change += 1
                set_knob(project, "SGLANG_SM120_MMA_TARGET_CTAS", str(256 * (1 + change % 2)), "decode",
                         f"bench {change}")
                result = _deploy(project, roles)
                rec = result.record
                assert rec.slurm.decision == "new job" and rec.slurm.replaced[0].cancelled_at
                walls.append(result.seconds)
                to_cancel.append(_secs(rec.slurm.job.submitted_at, rec.slurm.replaced[0].cancelled_at))
            slurm = statistics.median(running) + statistics.median(steps)
            over = [w - slurm - statistics.median(engines) for w in walls]
            inside = [t - slurm - statistics.median(engines) for t in to_cancel]
            figures[settle] = over
            print(f"one-knob deploy (settle {settle} s): wall {_med(walls)}; sbatch -> old job cancelled "
                  f"{_med(to_cancel)}")
            print(f"  overhead beyond Slurm's submit-to-running + step launches ({slurm:.2f} s) and the engines' "
                  f"start-up: whole deploy {_med(over)}; from sbatch to the old job cancelled {_med(inside)}")
    finally:
        stop_cluster(cluster.root)
        shutil.rmtree(tmp, ignore_errors=True)


def _role(project, role: str) -> dict:
    """The role's group-data dict (to override its settle for a run with --data role_<role>=...)."""
    from knobkeeper.deploy.stack import load_stack

    return load_stack(project.root, INV).roles[role].to_json()


if __name__ == "__main__":
    main()
