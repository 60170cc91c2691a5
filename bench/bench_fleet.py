"""knobkeeper's deploy vs an equivalent Ansible playbook, on the same 5 loopback SSH hosts.

    .venv/bin/python bench/bench_fleet.py [--repeats N] [--keep DIR]

The fleet is tests/sshd.py's (one sshd on 127.0.0.2-.6, key-only root login, keys per run): 2 prefill
hosts, 2 decode hosts, 1 router, each with its own prefix and supervisord. Both sides deploy the same
stack (two sim workers per worker role, the real sglang-router) to their own prefix and ports:

    ours     `pyinfra -y inventory/fleet.py deploy.py` in a temporary infra repo (knobkeeper.deploy.api)
    Ansible  `ansible-playbook bench/ansible/deploy.yml`: engine wheel copy + pip install when changed,
             template, handler restart via supervisorctl, uri health wait with retries, one play per
             role in order with `serial` (any_errors_fatal)

Both install this repo's wheel into a venv per host (dependencies linked in offline, as in the
tests); both run against the same sshd, with host keys checked. Ansible runs with pipelining on and
its default ControlPersist=60s (SSH connections reused across runs; pyinfra reconnects every run).

Cases, alternating ours / Ansible each repeat so that load on a shared machine hits both alike:

    no-op    nothing changed: every side checks its files and gates every role
    one-knob SGLANG_SM120_MMA_TARGET_CTAS of decode changes (512 <-> 256): both decode hosts
             restart and are gated, then the router is gated

Prints medians (and every sample) per case and the ratio ours/Ansible. Whole-process wall time.
Ours runs as a user runs it (the record committed to git each time); the one-knob change for ours
is `knobkeeper set` (its commit is not timed), for Ansible a changed extra var.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
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
from knobkeeper.deploy.api import run_deploy  # noqa: E402
from knobkeeper.deploy.local import stop_local  # noqa: E402
from tests.fleet_inventory import (FAST_ENGINE_ARGS, FLEET, build_wheel, deps_dir, host_root, seed_venv,  # noqa: E402
                                   stack_data, write_inventory)
from tests.infra import git, make_infra_repo  # noqa: E402
from tests.sshd import start_sshd  # noqa: E402

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
VALUES = ("512", "256")


class Ours:
    def __init__(self, work: Path, fleet, wheel: Path, deps: Path) -> None:
        self.hosts_root = work / "h"
        for host in FLEET:
            seed_venv(host_root(self.hosts_root, host), deps)
        self.project = make_infra_repo(work)
        write_inventory(self.project.root / "inventory" / "fleet.py", fleet, self.hosts_root,
                        lambda host, root: stack_data(host, root, wheels=[str(wheel)]))
        git(self.project.root, "add", "-A")
        git(self.project.root, "commit", "-qm", "fleet inventory")

    def deploy(self) -> float:
        result = run_deploy(self.project, "inventory/fleet.py", timeout=600)
        if not result.ok:
            raise RuntimeError(f"knobkeeper deploy failed: {result.error}\n{result.output[-3000:]}")
        return result.seconds

    def set(self, value: str) -> None:
        set_knob(self.project, KNOB, value, "decode", f"bench: one-knob deploy ({value})")

    def stop(self) -> None:
        for host in FLEET:
            stop_local(host_root(self.hosts_root, host))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--keep", type=Path, help="work dir to use and keep (default: a temp dir, removed)")
    args = parser.parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="kk-bench-fleet-"))
    work.mkdir(parents=True, exist_ok=True)
    fleet = start_sshd(work / "sshd")
    ours = ansible = None
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        wheel = build_wheel(work / "wheel")
        deps = deps_dir(work / "deps")
        ours = Ours(work / "ours", fleet, wheel, deps)
        for host in FLEET:
            seed_venv(host_root(work / "ah", host), deps)
        ansible = AnsibleSide(work / "ansible", fleet, work / "ah", wheel, engine_args=FAST_ENGINE_ARGS)
        t = time.perf_counter()
        ours.deploy()
        print(f"cold deploy: ours {time.perf_counter() - t:.1f} s", flush=True)
        ansible.setup()
        print(f"cold deploy: Ansible {ansible.deploy():.1f} s (after its untimed supervisord set-up)", flush=True)
        ours.deploy()
        ansible.deploy()  # both warmed: files in place, every service running
        for i in range(args.repeats):
            samples.setdefault(("no-op", "ours"), []).append(ours.deploy())
            samples.setdefault(("no-op", "ansible"), []).append(ansible.deploy(knobs=_knobs(i - 1)))
            value = VALUES[i % 2]
            ours.set(value)
            samples.setdefault(("one-knob", "ours"), []).append(ours.deploy())
            samples.setdefault(("one-knob", "ansible"), []).append(ansible.deploy(knobs=_knobs(i)))
            for port in (30001, PORTS["decode_port"]):  # both sides really restarted decode with the value
                _check_knob(port, value)
            print(f"repeat {i + 1}/{args.repeats}: " + ", ".join(
                f"{case} {side} {v[-1]:.1f} s" for (case, side), v in samples.items()), flush=True)
    finally:
        for side in (ours, ansible):
            if side is not None:
                side.stop()
        fleet.stop()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n5 SSH hosts on loopback (2 prefill, 2 decode, 1 router), {args.repeats} repeats, median wall s")
    print(f"{'case':<10} {'ours':>8} {'Ansible':>8} {'ours/Ansible':>13}   samples ours | Ansible")
    for case in ("no-op", "one-knob"):
        o, a = samples[(case, "ours")], samples[(case, "ansible")]
        mo, ma = statistics.median(o), statistics.median(a)
        print(f"{case:<10} {mo:8.2f} {ma:8.2f} {mo / ma:13.2f}   "
              + " ".join(f"{x:.1f}" for x in o) + " | " + " ".join(f"{x:.1f}" for x in a))
    return 0


def _check_knob(port: int, value: str) -> None:
    for host in FLEET:
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
