"""The stack deployed to a fleet over real SSH (issue 5): 2 prefill hosts, 2 decode hosts, 1 router.

The hosts are loopback addresses 127.0.0.2-.6 behind one real sshd (tests/sshd.py: Debian
openssh-server, key-only root login, keys generated per run). Each host has its own prefix (they
share one filesystem), its own supervisord and its own engine venv, into which the deploy installs a
wheel of this repo (offline). One fleet per module; the tests run in file order, each leaving the
stack healthy (or saying what it left), and teardown stops every supervisord and sshd by PID and
checks that nothing is left. A missing sshd FAILS the module (never a skip).

Timing is asserted from the deploy records (restart_issued_at, healthy_at), which are written by the
controller when it issues the restart and when the gate sees the service healthy.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from knobkeeper import pids
from knobkeeper.changelog.ops import set_knob
from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.local import stop_local, supervisord_pid
from knobkeeper.deploy.status import stack_status
from knobkeeper.timeutil import parse_time
from tests.fleet_inventory import (FLEET, build_wheel, by_name, deps_dir, host_root, hosts_of, seed_venv, stack_data,
                                   write_inventory)
from tests.infra import git, make_infra_repo
from tests.sshd import SshdError, sshd_fixture, start_sshd

pytestmark = pytest.mark.timeout(600)

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
INVENTORY = "inventory/fleet.py"
SERVICE = {"prefill": "knobkeeper-prefill", "decode": "knobkeeper-decode", "router": "knobkeeper-router"}
PORT = {"prefill": 30000, "decode": 30001, "router": 30080}
BROKEN = "decode-2"

sshd = sshd_fixture("module")


class FleetStack:
    """The infra repo, the hosts' prefixes and a few ways to look at them."""

    def __init__(self, project, hosts_root: Path, ssh, wheel: Path) -> None:
        self.project = project
        self.hosts_root = hosts_root
        self.ssh = ssh
        self.wheel = wheel

    def write_inventory(self, path: str = INVENTORY, overrides: dict | None = None, message: str = "fleet inventory"):
        write_inventory(self.project.root / path, self.ssh, self.hosts_root,
                        lambda host, root: stack_data(host, root, wheels=[str(self.wheel)]), overrides=overrides)
        git(self.project.root, "add", "-A")
        git(self.project.root, "commit", "-qm", message)

    def deploy(self, inventory: str = INVENTORY, **data):
        return run_deploy(self.project, inventory, extra_data=data, timeout=240)

    def prefix(self, name: str) -> Path:
        return host_root(self.hosts_root, by_name(name))

    def info(self, name: str) -> dict:
        host = by_name(name)
        url = f"http://{host.address}:{PORT[host.role]}/get_server_info"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return json.loads(resp.read())

    def ctl(self, name: str, *args: str) -> subprocess.CompletedProcess:
        """supervisorctl of one host, run ON that host over SSH."""
        prefix = self.prefix(name)
        ctl = Path(sys.executable).parent / "supervisorctl"
        cmd = f"{ctl} -c {prefix}/supervisor/supervisord.conf " + " ".join(args)
        return self.ssh.ssh(by_name(name).address, cmd)

    def pids(self) -> dict[str, int | None]:
        out = {}
        for host in FLEET:
            done = self.ctl(host.name, "pid", SERVICE[host.role])
            out[host.name] = int(done.stdout.strip()) if done.stdout.strip().isdigit() and done.stdout.strip() != "0" else None
        return out

    def status(self, inventory: str = INVENTORY) -> dict[str, object]:
        return {row.host: row for row in stack_status(self.project, inventory)}

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "knobkeeper.cli", *args, "--repo", str(self.project.root)],
                              cwd=self.project.root, capture_output=True, text=True, timeout=120)

    def records(self) -> list[Path]:
        return sorted((self.project.root / "changelog" / "deploys").glob("*.json"))


@pytest.fixture(scope="module")
def fleet(sshd, tmp_path_factory):
    work = tmp_path_factory.mktemp("fleet")
    wheel = build_wheel(work / "wheel")
    deps = deps_dir(work / "deps")
    hosts_root = work / "h"  # short: each host's supervisor socket path must stay under 100 characters
    for host in FLEET:
        seed_venv(host_root(hosts_root, host), deps)
    stack = FleetStack(make_infra_repo(work), hosts_root, sshd, wheel)
    stack.write_inventory()
    try:
        yield stack
    finally:
        stopped = []
        for host in FLEET:
            stopped += stop_local(host_root(hosts_root, host))
        left = subprocess.run(["pgrep", "-f", str(hosts_root)], capture_output=True, text=True).stdout.split()
        alive = [p for p in stopped if pids.alive(p)]
        listening = [f"{h.address}:{port}" for h in FLEET for port in (*PORT.values(), 8998, 29080)
                     if _listening(h.address, port)]  # sglang-router renames itself: look for its sockets too
        assert not left and not alive and not listening, f"left behind: {left or alive or listening}"


def _listening(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((address, port)) == 0


def _ok(result):
    assert result.ok, f"deploy failed: {result.error}\n{result.output[-5000:]}"
    return result.record


def _rows(record, role: str | None = None) -> list[dict]:
    return [r for r in record.services if role is None or r["role"] == role]


def _row(record, host: str) -> dict:
    return next(r for r in record.services if r["host"] == host)


def _t(text: str) -> datetime:
    return parse_time(text)


def _assert_role_order(record) -> None:
    """Every host of a role healthy before any host of the next role got its restart."""
    acted = {role: [r for r in _rows(record, role) if r["restart_issued_at"]] for role in record.order}
    for before, after in zip(record.order, record.order[1:]):
        # A role's gate passes on every host (acted or not) before the next role starts.
        gated = [r for r in _rows(record, before) if r["gate"]["result"] == "passed"]
        assert gated, f"role {before} was not gated"
        last_healthy = max(_t(r["gate"]["checked_at"]) for r in gated)
        for row in acted[after]:
            assert last_healthy <= _t(row["restart_issued_at"]), (before, after, row)


def test_a_missing_sshd_is_an_error_not_a_skip(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.sshd.SSHD", str(tmp_path / "no-sshd"))
    with pytest.raises(SshdError, match="openssh-server"):
        start_sshd(tmp_path / "sshd")


# --- order across hosts, the engine installed from a wheel ------------------------------------------


def test_first_deploy_installs_the_engine_and_starts_roles_in_order_across_hosts(fleet):
    record = _ok(fleet.deploy())
    assert record.order == ["prefill", "decode", "router"]
    assert {r["host"]: r["action"] for r in record.services} == {h.name: "started" for h in FLEET}
    assert all(r["gate"]["result"] == "passed" for r in record.services)
    _assert_role_order(record)
    for role in record.order[:-1]:
        nxt = record.order[record.order.index(role) + 1]
        for early in _rows(record, role):
            for late in _rows(record, nxt):
                assert _t(early["healthy_at"]) <= _t(late["restart_issued_at"]), (early, late)
    # Default batch = the whole role: the second prefill host was restarted before the first was healthy.
    prefills = _rows(record, "prefill")
    assert max(_t(r["restart_issued_at"]) for r in prefills) <= min(_t(r["healthy_at"]) for r in prefills)
    assert _row(record, "router-1")["gate"]["status"].endswith("4 workers healthy")

    # Every host: its own supervisord, its own engine venv with knobkeeper installed from the wheel,
    # services bound to its own address and running the venv's interpreter.
    sup_pids = {h.name: supervisord_pid(fleet.prefix(h.name)) for h in FLEET}
    assert None not in sup_pids.values() and len(set(sup_pids.values())) == len(FLEET)
    for host in FLEET:
        venv = fleet.prefix(host.name) / "venv"
        found = subprocess.run([str(venv / "bin" / "python"), "-c", "import knobkeeper; print(knobkeeper.__file__)"],
                               cwd="/", capture_output=True, text=True)
        assert found.stdout.strip().startswith(str(venv / "lib")), found
        pid = _row(record, host.name)["pid"]
        if host.role == "router":  # sglang-router renames its process: look at what was exec'd
            launch = (fleet.prefix(host.name) / "services" / SERVICE["router"] / "started.sh").read_text()
            assert f"exec {venv}/bin/python -m sglang_router.launch_router" in launch
            continue
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[0].decode() == str(venv / "bin" / "python"), argv
        info = fleet.info(host.name)
        assert info["pid"] == pid and info["disaggregation_mode"] == host.role
    freeze = subprocess.run([str(fleet.prefix("decode-1") / "venv" / "bin" / "pip"), "freeze"], cwd="/",
                            capture_output=True, text=True).stdout
    assert "knobkeeper @ file://" in freeze and fleet.wheel.name in freeze
    assert git(fleet.project.root, "status", "--porcelain") == ""


# --- planning without touching ----------------------------------------------------------------------


def test_plan_and_dry_diff_show_the_restarts_and_change_nothing(fleet):
    set_knob(fleet.project, KNOB, "512", "decode", "A/B +12.8% at 64")
    before_pids, before_records, head = fleet.pids(), fleet.records(), git(fleet.project.root, "rev-parse", "HEAD")
    before_files = {h.name: (fleet.prefix(h.name) / "services" / SERVICE[h.role] / "launch.sh").read_text() for h in FLEET}

    done = fleet.cli("plan", INVENTORY, "--data", "batch=1", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert [r["role"] for r in plan["roles"]] == ["prefill", "decode", "router"]
    by_role = {r["role"]: r for r in plan["roles"]}
    assert all(s["action"] == "unchanged" for b in by_role["prefill"]["batches"] for s in b)
    decode_batches = by_role["decode"]["batches"]
    assert [[s["host"] for s in b] for b in decode_batches] == [["decode-1"], ["decode-2"]]
    for batch in decode_batches:
        assert batch[0]["action"] == "restart" and "files changed" in batch[0]["reason"]
        assert KNOB in batch[0]["reason"]
    [[router]] = by_role["router"]["batches"]
    assert router["action"] == "unchanged" and router["gate"] is True  # downstream of decode: gated again

    text = fleet.cli("plan", INVENTORY)
    assert text.returncode == 0, text.stderr
    out = text.stdout
    assert out.index("prefill") < out.index("decode") < out.index("router")
    assert "decode-1" in out and "decode-2" in out and "files changed" in out

    dry = subprocess.run([sys.executable, "-m", "pyinfra", INVENTORY, "deploy.py", "--dry", "--diff"],
                         cwd=fleet.project.root, capture_output=True, text=True, timeout=120)
    output = dry.stdout + dry.stderr  # pyinfra logs to stderr
    assert dry.returncode == 0, output[-6000:]
    for host in hosts_of("decode"):
        launch = fleet.prefix(host.name) / "services" / SERVICE["decode"] / "launch.sh"
        assert f"[{host.name}]" in output and f"Will modify {launch}" in output, output[-6000:]
    assert re.search(rf"^\s*\+ export {KNOB}=512$", output, re.M), output[-6000:]
    # Nothing touched: processes, host files, deploy records, git.
    assert fleet.pids() == before_pids
    assert {h.name: (fleet.prefix(h.name) / "services" / SERVICE[h.role] / "launch.sh").read_text() for h in FLEET} == before_files
    assert fleet.records() == before_records and git(fleet.project.root, "rev-parse", "HEAD") == head
    assert git(fleet.project.root, "status", "--porcelain") == ""


# --- rolling restart within a role -------------------------------------------------------------------


def test_rolling_restart_batch_1_keeps_the_role_up(fleet):
    before = fleet.pids()
    down_both: list[float] = []
    stop = threading.Event()

    def watch():
        urls = [f"http://{h.address}:{PORT['decode']}/health" for h in hosts_of("decode")]
        while not stop.is_set():
            up = 0
            for url in urls:
                try:
                    # A busy machine may answer slowly: only a refused or failed answer counts as down.
                    with urllib.request.urlopen(url, timeout=15) as resp:
                        up += resp.status == 200
                except OSError:
                    pass
            if up == 0:
                down_both.append(time.time())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        record = _ok(fleet.deploy(batch=1))
    finally:
        stop.set()
        watcher.join(5)
    decodes = sorted(_rows(record, "decode"), key=lambda r: r["restart_issued_at"])
    assert [r["action"] for r in decodes] == ["restarted", "restarted"]
    assert [r["batch"] for r in decodes] == [1, 2]
    assert _t(decodes[0]["healthy_at"]) <= _t(decodes[1]["restart_issued_at"])
    assert not down_both, f"both decode hosts were down at once ({len(down_both)} samples)"
    _assert_role_order(record)
    after = fleet.pids()
    for host in FLEET:
        assert (after[host.name] != before[host.name]) == (host.role == "decode"), host
    assert fleet.info("decode-2")["knobs"][KNOB] == "512"


# --- a failing gate: stop, rollback --------------------------------------------------------------------


def _break_decode_2(fleet) -> None:
    """A bad change on one host: decode-2's engine never reports healthy; its gate gives up after 4 s."""
    data = stack_data(by_name(BROKEN), fleet.prefix(BROKEN), wheels=[str(fleet.wheel)])
    args = {**data["engine_args"], "decode": [*data["engine_args"]["decode"], "--never-healthy"]}
    fleet.write_inventory(overrides={BROKEN: {"engine_args": args, "health_timeout": 4}}, message="break decode-2")


def test_failed_gate_with_rollback_puts_the_previous_files_back(fleet):
    before = fleet.pids()
    previous = (fleet.prefix(BROKEN) / "services" / SERVICE["decode"] / "launch.sh").read_text()
    _break_decode_2(fleet)
    result = fleet.deploy(rollback=True)
    assert result.returncode != 0 and not result.ok
    record = result.record
    assert record.result == "failed"
    assert "rolled back" in record.error and BROKEN in record.error
    broken = _row(record, BROKEN)
    assert broken["action"] == "restarted" and broken["gate"]["result"] == "failed"
    assert broken["rollback"]["result"] == "passed"
    assert broken["rollback"]["digest"] == broken["previous_digest"]
    # The previous launch script and program are back, and run.
    launch = (fleet.prefix(BROKEN) / "services" / SERVICE["decode"] / "launch.sh").read_text()
    assert "--never-healthy" not in launch and launch.split("set -euo", 1)[1] == previous.split("set -euo", 1)[1]
    pid = fleet.info(BROKEN)["pid"]
    assert b"--never-healthy" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    router = _row(record, "router-1")
    assert router["restart_issued_at"] is None and router["gate"]["result"] == "not-run"
    after = fleet.pids()
    assert after["router-1"] == before["router-1"] and after["decode-1"] == before["decode-1"]
    assert after[BROKEN] not in (None, before[BROKEN])
    # Declared (broken) and running (rolled back) differ: status says so.
    status = fleet.status()
    assert status[BROKEN].state == "drifted"
    assert {status[h.name].state for h in FLEET if h.name != BROKEN} == {"in sync"}


def test_failed_gate_stops_the_run_before_the_router(fleet):
    before = fleet.pids()
    result = fleet.deploy()  # the same broken change, without rollback
    assert result.returncode != 0 and not result.ok
    record = result.record
    assert record.result == "failed"
    broken = _row(record, BROKEN)
    assert broken["action"] == "restarted" and broken["gate"]["result"] == "failed"
    assert BROKEN in record.error and SERVICE["decode"] in record.error and "503" in record.error
    router = _row(record, "router-1")
    assert router["action"] == "unchanged" and router["restart_issued_at"] is None
    assert router["gate"]["result"] == "not-run"
    assert fleet.pids()["router-1"] == before["router-1"]
    assert "rolled back" not in (record.error or "")
    # The decode it started and that never passed its gate is stopped (issue 38 item 6).
    assert fleet.pids()[BROKEN] is None and broken["stopped_at"] is not None
    assert fleet.status()[BROKEN].state == "down"


# --- a rerun repairs --------------------------------------------------------------------------------


def test_rerun_after_failure_repairs_down_services_even_with_unchanged_files(fleet):
    git(fleet.project.root, "revert", "--no-edit", git(fleet.project.root, "log", "-1", "--format=%H",
                                                              "--grep=break decode-2"))
    # prefill-2's host "rebooted": supervisord and its programs gone; its files are unchanged.
    stop_local(fleet.prefix("prefill-2"))
    before = fleet.pids()
    assert before["prefill-2"] is None
    record = _ok(fleet.deploy())
    assert _row(record, "prefill-2")["action"] == "started"
    assert "not running" in _row(record, "prefill-2")["reason"]
    # stopped after its failed gate; declared are the good files again
    assert _row(record, BROKEN)["action"] == "started" and "its gate failed in deploy " in _row(record, BROKEN)["reason"]
    assert _row(record, "prefill-1")["action"] == "unchanged" and _row(record, "decode-1")["action"] == "unchanged"
    assert _row(record, "router-1")["gate"]["result"] == "passed"
    _assert_role_order(record)
    status = fleet.status()
    assert {s.state for s in status.values()} == {"in sync"}, {h: (s.state, s.differences) for h, s in status.items()}


# --- an unreachable host ------------------------------------------------------------------------------


def test_unreachable_host_fails_before_any_restart(fleet):
    set_knob(fleet.project, KNOB, "256", "decode", "pending change")
    fleet.write_inventory("inventory/fleet_unreachable.py",
                          overrides={"router-1": {"ssh_hostname": "127.0.0.7"}}, message="router unreachable")
    before = fleet.pids()
    result = fleet.deploy("inventory/fleet_unreachable.py")
    assert result.returncode != 0 and result.record is None
    assert "router-1" in result.error and "nothing was restarted" in result.error, result.output[-3000:]
    assert fleet.pids() == before
    # The pending decode change is still pending everywhere.
    status = fleet.status()
    assert status["decode-1"].state == "drifted"


# --- status over SSH ------------------------------------------------------------------------------------


def test_status_over_ssh_reports_in_sync_drifted_and_down_then_a_deploy_repairs(fleet):
    status = fleet.status()
    for name in ("decode-1", "decode-2"):
        assert status[name].state == "drifted"
        assert status[name].differences == [f"{KNOB}: running 512, declared 256"]
    assert {status[n].state for n in ("prefill-1", "prefill-2", "router-1")} == {"in sync"}
    _ok(fleet.deploy())
    assert {s.state for s in fleet.status().values()} == {"in sync"}

    # By hand on decode-1: edit the launch script, restart the program. Stop prefill-1.
    launch = fleet.prefix("decode-1") / "services" / SERVICE["decode"] / "launch.sh"
    edit = fleet.ssh.ssh("127.0.0.4", f"sed -i 's/^export {KNOB}=256$/export {KNOB}=1024/' {launch}")
    assert edit.returncode == 0 and f"export {KNOB}=1024" in launch.read_text()
    assert fleet.ctl("decode-1", "restart", SERVICE["decode"]).returncode == 0
    assert fleet.ctl("prefill-1", "stop", SERVICE["prefill"]).returncode == 0

    done = fleet.cli("status", INVENTORY, "--json")
    assert done.returncode == 0, done.stderr
    rows = {r["host"]: r for r in json.loads(done.stdout)}
    assert rows["decode-1"]["state"] == "drifted"
    assert rows["decode-1"]["differences"] == [f"{KNOB}: running 1024, declared 256"]
    assert rows["prefill-1"]["state"] == "down"
    assert {rows[n]["state"] for n in ("prefill-2", "decode-2", "router-1")} == {"in sync"}
    text = fleet.cli("status", INVENTORY)
    assert "drifted" in text.stdout and "down" in text.stdout and KNOB in text.stdout

    record = _ok(fleet.deploy())
    assert _row(record, "prefill-1")["action"] == "started"
    assert _row(record, "decode-1")["action"] == "restarted"
    assert {s.state for s in fleet.status().values()} == {"in sync"}
    assert fleet.info("decode-1")["knobs"][KNOB] == "256"


# --- the pinned engine: installed, recorded, checked ----------------------------------------------------


def test_engine_step_installs_the_pinned_sglang_records_it_and_status_reports_a_version_drift(fleet):
    from tests.fleet_inventory import SGLANG_PIN, sglang_wheelhouse

    wheelhouse = sglang_wheelhouse()
    pin = {"engine_packages": [f"sglang=={SGLANG_PIN}"], "engine_wheelhouse": str(wheelhouse),
           "pip_install_args": ["--no-deps"]}
    fleet.write_inventory(overrides={"decode-1": pin}, message="pin sglang on decode-1")
    try:
        record = _ok(fleet.deploy())
        assert record.engine_versions == {"decode-1": {"sglang": SGLANG_PIN}}
        venv_python = fleet.prefix("decode-1") / "venv" / "bin" / "python"
        done = fleet.ssh.ssh(by_name("decode-1").address,
                             f"{venv_python} -c 'import importlib.metadata as m; print(m.version(\"sglang\"))'")
        assert done.stdout.strip() == SGLANG_PIN, done.stderr
        assert {s.state for s in stack_status(fleet.project, INVENTORY)} == {"in sync"}
        # The inventory now pins another version than the host has: decode-1 is drifted, nothing else.
        fleet.write_inventory(overrides={"decode-1": {**pin, "engine_packages": ["sglang==0.5.22"]}},
                              message="pin another sglang on decode-1")
        rows = {s.host: s for s in stack_status(fleet.project, INVENTORY)}
        assert rows["decode-1"].state == "drifted"
        assert f"engine sglang: installed {SGLANG_PIN}, declared 0.5.22" in rows["decode-1"].differences
        assert {h: r.state for h, r in rows.items() if h != "decode-1"} == {h.name: "in sync" for h in FLEET
                                                                             if h.name != "decode-1"}
    finally:
        fleet.write_inventory(message="fleet inventory without the sglang pin")
