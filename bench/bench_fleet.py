"""knobkeeper's deploy vs an equivalent Ansible playbook, on 5, 10 and 20 loopback SSH hosts.

    .venv/bin/python bench/bench_fleet.py [--sizes 5,10,20] [--repeats 3] [--keep DIR]

Per size N, one sshd listens on 127.0.0.2 ... (tests/sshd.py, key-only root login, keys per run);
tests/fleet_inventory.fleet_of(N) makes the fleet: one router, the other hosts split between prefill
and decode, each host with its own prefix and supervisord. Both sides deploy the same stack (sim
workers, the real sglang-router) to their own prefix and ports:

    ours     `pyinfra -y inventory/fleet.py deploy.py` in a temporary infra repo (knobkeeper.deploy.api)
    Ansible  `ansible-playbook bench/ansible/deploy.yml`: engine wheel copy + pip install when changed,
             template, handler restart via supervisorctl, uri health wait with retries, one play per
             role in order with `serial` (any_errors_fatal); forks = N, pipelining on

Both install this repo's wheel into a venv per host (dependencies linked in offline, as in the
tests); both run against the same sshd, with host keys checked. Ansible keeps its SSH connections
(ControlPersist=60s) across runs; pyinfra reconnects every run.

Cases, alternating ours / Ansible each repeat so that load on a shared machine hits both alike:

    no-op    nothing changed: every side checks its files and gates every role
    one-knob SGLANG_SM120_MMA_TARGET_CTAS of decode changes (512 <-> 256): every decode host
             restarts and is gated, then the router is gated

    floor    a bare pyinfra run on the same hosts, the same inventory: connect, read one fact
             (server.Hostname), nothing else; what no deploy through pyinfra can undercut

Prints medians (and every sample) per size and case, the ratio ours/Ansible, ours' no-op over the
floor, both against issue 37's targets (no-op/floor <= 1.5, one-knob ours/Ansible <= 0.5), how ours
grows with N, and where ours spends a no-op run at the largest size (pyinfra's phases and each
operation, timed from its output).
Where a no-op above the floor goes (10 hosts, 2026-12-06, medians of 3: 1.18 s vs 0.65 s): start-up,
inventory and connect as the floor's (0.54 s); deploy.py 0.21 s: the deploy's own imports (~0.05 s),
the run (~0.10 s: git processes, the render of every file) and pyinfra registering 90 operations (9 a
host: the engine venv, the wheel, supervisord, its restart step, the 3 roles' gates that every host
registers as the roles' barriers, the PD proof, the record), ~1 ms each for pyinfra's walk of the call
stack and as much for its check of the arguments; operations 0.29 s: one host snapshot, the files'
and every service's state (0.23 s: each host's shell, one small Python for supervisord's answer and
/proc reads, ten hosts on this machine's 2 cores), the roles in order (~0.02 s), the record's commit
(0.035 s); disconnect and exit 0.08 s.

Whole-process wall time. Ours runs as a user runs it (the record committed to git each time); the
one-knob change for ours is `knobkeeper set` (its commit is not timed), for Ansible a changed extra var.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (ROOT, HERE / "ansible"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from runner import PORTS, AnsibleSide  # noqa: E402

from knobkeeper.changelog.ops import set_knob  # noqa: E402
from knobkeeper.deploy.api import deploy_command, run_deploy  # noqa: E402
from knobkeeper.deploy.local import stop_local  # noqa: E402
from knobkeeper.deploy.options import DeployOptions  # noqa: E402
from tests.fleet_inventory import (FAST_ENGINE_ARGS, build_wheel, deps_dir, fleet_of, host_root,  # noqa: E402
                                   seed_venv, stack_data, write_inventory)
from tests.infra import git, make_infra_repo  # noqa: E402
from tests.sshd import loopback_addresses, start_sshd  # noqa: E402

# pyinfra's own progress lines, in the order they come: the phase each one starts.
PHASES = (("--> Loading inventory", "start-up: python, pyinfra, config"),
          ("--> Connecting to hosts", "inventory (group data)"),
          ("--> Preparing operation", "SSH connect"),
          ("--> Beginning operation run", "deploy.py per host: render, facts (state of every service)"),
          ("--> Results", "operations: uploads, restarts, gates"),
          (None, "record commit, disconnect, exit"))

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
VALUES = ("512", "256")
# The floor: pyinfra connects to every host and reads one fact.
FLOOR_DEPLOY = """from pyinfra import host
from pyinfra.facts.server import Hostname

host.get_fact(Hostname)
"""


class Ours:
    def __init__(self, work: Path, fleet, wheel: Path, deps: Path, hosts) -> None:
        self.hosts = hosts
        self.hosts_root = work / "h"
        for host in hosts:
            seed_venv(host_root(self.hosts_root, host), deps)
        self.project = make_infra_repo(work)
        write_inventory(self.project.root / "inventory" / "fleet.py", fleet, self.hosts_root,
                        lambda host, root: stack_data(host, root, wheels=[str(wheel)]), hosts=hosts)
        (self.project.root / "floor.py").write_text(FLOOR_DEPLOY)
        git(self.project.root, "add", "-A")
        git(self.project.root, "commit", "-qm", "fleet inventory")

    def deploy(self) -> float:
        result = run_deploy(self.project, "inventory/fleet.py", timeout=600)
        if not result.ok:
            raise RuntimeError(f"knobkeeper deploy failed: {result.error}\n{result.output[-3000:]}")
        return result.seconds

    def set(self, value: str) -> None:
        set_knob(self.project, KNOB, value, "decode", f"bench: one-knob deploy ({value})")

    def floor(self) -> float:
        """One bare pyinfra run over the same inventory that only reads a fact (whole process)."""
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "inventory/fleet.py", "floor.py"],
                              cwd=self.project.root, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"bare pyinfra run failed: {(done.stdout + done.stderr)[-2000:]}")
        return seconds

    def phases(self) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
        """One no-op deploy run directly, every output line timestamped: (phase, seconds) and, within
        the operations phase, (operation, seconds) from each "Starting operation" line to the next."""
        cmd = deploy_command("inventory/fleet.py", DeployOptions(record=True))
        marks: list[float] = []
        ops: list[tuple[str, float]] = []
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=self.project.root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wanted = [marker for marker, _ in PHASES if marker]
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter()
            if line.startswith(("--> Starting operation", "--> Starting run once operation", "--> Results")):
                ops.append((line.split(":", 1)[-1].split(",")[0].strip(), now))
            if len(marks) < len(wanted) and line.startswith(wanted[len(marks)]):
                marks.append(now)
        proc.wait()
        if proc.returncode != 0 or len(marks) != len(wanted):
            raise RuntimeError(f"phase run failed ({proc.returncode}), saw {len(marks)} of {len(wanted)} phases")
        marks.append(time.perf_counter())
        edges = [start, *marks]
        return ([(name, b - a) for (_, name), a, b in zip(PHASES, edges, edges[1:])],
                [(name, b - a) for (name, a), (_, b) in zip(ops, ops[1:])])

    def stop(self) -> None:
        for host in self.hosts:
            stop_local(host_root(self.hosts_root, host))


def bench_size(count: int, repeats: int, work: Path, wheel: Path, deps: Path, profile: bool) -> dict:
    """Medians for one fleet size (and ours' phases when `profile`)."""
    hosts = fleet_of(count)
    fleet = start_sshd(work / "sshd", loopback_addresses(count))
    ours = ansible = None
    samples: dict[tuple[str, str], list[float]] = {}
    phases = None
    try:
        ours = Ours(work / "ours", fleet, wheel, deps, hosts)
        for host in hosts:
            seed_venv(host_root(work / "ah", host), deps)
        ansible = AnsibleSide(work / "ansible", fleet, work / "ah", wheel, engine_args=FAST_ENGINE_ARGS, hosts=hosts)
        t = time.perf_counter()
        ours.deploy()
        print(f"[{count} hosts] cold deploy: ours {time.perf_counter() - t:.1f} s", flush=True)
        ansible.setup()
        print(f"[{count} hosts] cold deploy: Ansible {ansible.deploy():.1f} s (after its untimed supervisord set-up)",
              flush=True)
        ours.deploy()
        ansible.deploy()  # both warmed: files in place, every service running
        for i in range(repeats):
            samples.setdefault(("floor", "ours"), []).append(ours.floor())
            samples.setdefault(("no-op", "ours"), []).append(ours.deploy())
            samples.setdefault(("no-op", "ansible"), []).append(ansible.deploy(knobs=_knobs(i - 1)))
            value = VALUES[i % 2]
            ours.set(value)
            samples.setdefault(("one-knob", "ours"), []).append(ours.deploy())
            samples.setdefault(("one-knob", "ansible"), []).append(ansible.deploy(knobs=_knobs(i)))
            for port in (30001, PORTS["decode_port"]):  # both sides really restarted decode with the value
                _check_knob(hosts, port, value)
            print(f"[{count} hosts] repeat {i + 1}/{repeats}: " + ", ".join(
                f"{case} {side} {v[-1]:.1f} s" for (case, side), v in samples.items()), flush=True)
        if profile:
            phases = ours.phases()
    finally:
        for side in (ours, ansible):
            if side is not None:
                side.stop()
        fleet.stop()
    return {"samples": samples, "phases": phases}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="5,10,20", help="fleet sizes, comma-separated (default 5,10,20)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="work dir to use and keep (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    # A timeout's SIGTERM unwinds like Ctrl-C: every side's supervisords and the sshd are stopped by
    # the `finally`s below (killed outright they would hold the fleet's addresses and ports).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    work = args.keep or Path(tempfile.mkdtemp(prefix="kk-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[int, dict] = {}
    try:
        wheel = build_wheel(work / "wheel")
        deps = deps_dir(work / "deps")
        # As installed: pip byte-compiles a package it installs, and pyinfra's CLI never writes bytecode
        # (sys.dont_write_bytecode), so ours from an editable checkout would compile its modules on every
        # run (~0.08 s here). The floor's pyinfra is byte-compiled by its pip install already.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "knobkeeper")], check=True,
                       stdout=subprocess.DEVNULL)
        for count in sizes:
            results[count] = bench_size(count, args.repeats, work / f"n{count}", wheel, deps,
                                        profile=count == max(sizes))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\nloopback SSH fleets (1 router, the rest prefill/decode), {args.repeats} repeats, median wall s")
    print(f"{'hosts':>5} {'case':<9} {'ours':>7} {'Ansible':>8} {'ours/Ansible':>13}   samples ours | Ansible")
    medians: dict[tuple[int, str], float] = {}
    for count, result in results.items():
        for case in ("no-op", "one-knob"):
            o, a = result["samples"][(case, "ours")], result["samples"][(case, "ansible")]
            mo, ma = statistics.median(o), statistics.median(a)
            medians[(count, case)] = mo
            print(f"{count:>5} {case:<9} {mo:7.2f} {ma:8.2f} {mo / ma:13.2f}   "
                  + " ".join(f"{x:.1f}" for x in o) + " | " + " ".join(f"{x:.1f}" for x in a))
    for count, result in results.items():
        floor, noop = (statistics.median(result["samples"][(case, "ours")]) for case in ("floor", "no-op"))
        print(f"ours no-op at {count} hosts over the bare pyinfra floor (connect + one fact, {floor:.2f} s): "
              f"{noop / floor:.2f}x, {noop - floor:+.2f} s")
    print("\nthe targets (issue 37): no-op/floor <= 1.5, one-knob ours/Ansible <= 0.5")
    for count, result in results.items():
        m = {key: statistics.median(v) for key, v in result["samples"].items()}
        print(f"{count:>5} hosts: no-op/floor {m[('no-op', 'ours')] / m[('floor', 'ours')]:.2f}, "
              f"one-knob ours/Ansible {m[('one-knob', 'ours')] / m[('one-knob', 'ansible')]:.2f}")
    first = min(sizes)
    for count in sizes:
        if count != first:
            for case in ("no-op", "one-knob"):
                growth = medians[(count, case)] / medians[(first, case)]
                print(f"ours {case} at {count} hosts / at {first}: {growth:.2f}x for {count / first:.1f}x the hosts")
    profiled = results[max(sizes)]["phases"]
    if profiled:
        phases, ops = profiled
        total = sum(s for _, s in phases)
        print(f"\nwhere ours spends a no-op deploy of {max(sizes)} hosts ({total:.1f} s):")
        for name, seconds in phases:
            print(f"  {seconds:6.2f} s  {100 * seconds / total:4.0f}%  {name}")
        print("its operations, each on every host that has it (to the next one's start):")
        for name, seconds in ops:
            print(f"  {seconds:6.3f} s  {name[:90]}")
    return 0


def _check_knob(hosts, port: int, value: str) -> None:
    for host in hosts:
        if host.role == "decode":
            url = f"http://{host.address}:{port}/get_server_info"
            with urllib.request.urlopen(url, timeout=5) as resp:
                seen = json.loads(resp.read())["knobs"].get(KNOB)
            if seen != value:
                raise RuntimeError(f"{url}: {KNOB}={seen!r}, expected {value!r} after the one-knob deploy")


def _knobs(i: int) -> dict:
    """Ansible's knob values after change i (-1: none set yet)."""
    return {"decode": {KNOB: VALUES[i % 2]}} if i >= 0 else {}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
