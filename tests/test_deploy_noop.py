"""What a no-op deploy reads from a host, against a real supervisord (no SSH: `sh -c` here is the host):
the supervisord query answers as supervisorctl does, the service's state and identity come in one
command as they would in two, and the host snapshot says what the steps before the services check."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from knobkeeper.deploy.model import Service, Supervisor

BIN = Path(sys.executable).parent
NAME = "kk-noop-svc"


def _sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def supervisor():
    """A supervisord with one program listening on a port (running) and one never started (stopped)."""
    from tests.procs import free_port

    root = Path(tempfile.mkdtemp(prefix="kk-noop-", dir="/tmp"))   # a short socket path
    port = free_port()
    sup = Supervisor(root=str(root / "supervisor"), supervisord=str(BIN / "supervisord"),
                     supervisorctl=str(BIN / "supervisorctl"))
    Path(sup.root).mkdir()
    Path(sup.conf).write_text(f"""[unix_http_server]
file={sup.socket}
[supervisord]
logfile={sup.root}/supervisord.log
pidfile={sup.pidfile}
directory={sup.root}
[rpcinterface:supervisor]
supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface
[supervisorctl]
serverurl=unix://{sup.socket}
[program:{NAME}]
command={sys.executable} -m http.server {port} --bind 127.0.0.1
startsecs=0
[program:kk-noop-idle]
command=sleep 600
autostart=false
""")
    subprocess.run([sup.supervisord, "-c", sup.conf], check=True)
    try:
        for _ in range(200):
            if _sh(f"{sup.ctl('status', NAME)}").stdout.split()[1:2] == ["RUNNING"]:
                break
            time.sleep(0.05)
        yield sup, port, root
    finally:
        subprocess.run([sup.supervisorctl, "-c", sup.conf, "shutdown"], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _without_uptime(text: str) -> str:
    return text.split(", uptime")[0]


@pytest.mark.parametrize("args", [f"pid {NAME}", f"status {NAME}", "pid kk-noop-idle", "status kk-noop-idle",
                                  "pid nosuch", "status nosuch", "pid", f"status {NAME} kk-noop-idle"])
def test_the_query_answers_as_supervisorctl_does(supervisor, args):
    sup, _, _ = supervisor
    fast, slow = _sh(f"{sup.query} {args}"), _sh(f"{sup.ctl()} {args}")
    assert (fast.returncode, _without_uptime(fast.stdout), fast.stderr) == \
           (slow.returncode, _without_uptime(slow.stdout), slow.stderr)


def test_the_query_without_supervisord_is_supervisorctl_s_answer(tmp_path):
    sup = Supervisor(root=str(tmp_path), supervisord=str(BIN / "supervisord"), supervisorctl=str(BIN / "supervisorctl"))
    Path(sup.conf).write_text(f"[supervisorctl]\nserverurl=unix://{sup.socket}\n")
    fast, slow = _sh(f"{sup.query} status {NAME}"), _sh(f"{sup.ctl()} status {NAME}")
    assert (fast.returncode, fast.stdout) == (slow.returncode, slow.stdout)
    assert "no such file" in fast.stdout


def _service(root: Path, port: int) -> Service:
    return Service(host="@local", role="decode", name=NAME, index=0, prefix=str(root), manager="supervisord",
                   engine="sim", listen_host="127.0.0.1", address="127.0.0.1", port=port, bootstrap_port=None,
                   metrics_port=None, health_path="/", workers_path=None, health_timeout=5.0, settle=0.0, user=None,
                   stop_timeout=5, unit_dir="/tmp")


def test_state_and_identity_in_one_command_read_as_in_two(supervisor):
    from knobkeeper.deploy.health import identity_command, parse_identity
    from knobkeeper.deploy.observe import parse_service_state, state_command
    from knobkeeper.deploy.operations import ServiceState

    sup, port, root = supervisor
    svc = _service(root, port)
    Path(svc.service_dir).mkdir(parents=True, exist_ok=True)
    Path(svc.launch_path).write_text("#!/bin/sh\n# knobkeeper: {\"digest\": \"abc\"}\nexec true\n")
    Path(svc.started_path).write_text(Path(svc.launch_path).read_text())
    fact = ServiceState()
    one = fact.process(_sh(fact.command(svc, sup.query)).stdout.splitlines())
    two = parse_service_state(_sh(state_command(svc, sup.ctl(), with_launch=True)).stdout.splitlines())
    assert {k: v for k, v in one.items() if k != "identity"} == two and two["running"] and two["launch"]
    ident, again = parse_identity(one["identity"]), parse_identity(_sh(identity_command(svc, sup.ctl())).stdout.splitlines())
    assert ident.pid == again.pid == two["pid"] and ident.holder and ident.listening and ident.problem(svc) is None
    # not RUNNING: the identity says not running (the service is restarted, its gate asks again)
    idle = replace(svc, name="kk-noop-idle")
    assert parse_identity(fact.process(_sh(fact.command(idle, sup.query)).stdout.splitlines())["identity"]).pid is None
    # a launch script without its last newline swallows the marker: no identity, the gate asks the host itself
    Path(svc.launch_path).write_text("#!/bin/sh\nexec true")
    assert fact.process(_sh(fact.command(svc, sup.query)).stdout.splitlines())["identity"] is None


def test_the_host_snapshot_says_what_each_step_checks(supervisor, tmp_path):
    from knobkeeper.deploy.operations import HostSnapshot

    sup, _, _ = supervisor
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages" / "kkdist-1.0.dist-info"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "bin" / "activate").write_text("")
    (site / "direct_url.json").write_text(json.dumps({"url": "file:///w/kkdist-1.0-py3-none-any.whl",
                                                      "archive_info": {"hashes": {"sha256": "ab" * 32}}}, indent=1))
    conf = tmp_path / "conf"
    conf.write_text("text\n")
    os.chmod(conf, 0o640)
    fact = HostSnapshot()
    args = dict(venv=str(venv), paths=(str(conf), str(tmp_path / "absent"), str(tmp_path)), wheels=("kkdist", "other"),
                pidfile=sup.pidfile, socket=sup.socket)
    seen = fact.process(_sh(fact.command(**args)).stdout.splitlines())
    assert seen == {"venv": True, "files": {0: (640, hashlib.sha1(b"text\n").hexdigest())},
                    "wheels": {0: "ab" * 32, 1: None}, "supervisord": int(Path(sup.pidfile).read_text())}
    (venv / "bin" / "activate").unlink()
    seen = fact.process(_sh(fact.command(**{**args, "pidfile": str(tmp_path / "no.pid")})).stdout.splitlines())
    assert seen["venv"] is False and seen["supervisord"] is None


def test_the_host_snapshot_reads_each_service_as_its_own_look_would(supervisor):
    from knobkeeper.deploy.health import parse_identity
    from knobkeeper.deploy.operations import HostSnapshot, ServiceState

    sup, port, root = supervisor
    svc = _service(root, port)
    idle = replace(svc, name="kk-noop-idle")
    for one in (svc, idle):
        Path(one.service_dir).mkdir(parents=True, exist_ok=True)
        Path(one.launch_path).write_text(f"#!/bin/sh\n# {one.name}\nexec true\n")
    # the first one's launch script without its last newline: the marker after it still starts a line
    Path(svc.launch_path).write_text("#!/bin/sh\nexec true")
    fact, look = HostSnapshot(), ServiceState()
    seen = fact.process(_sh(fact.command(venv=None, paths=(), wheels=(), pidfile=sup.pidfile, socket=sup.socket,
                                         services=(svc, idle), ctl=sup.query)).stdout.splitlines())
    assert seen["supervisord"] == int(Path(sup.pidfile).read_text()) and sorted(seen["services"]) == [0, 1]
    for i, one in enumerate((svc, idle)):
        alone = look.process(_sh(look.command(one, sup.query)).stdout.splitlines())
        snapped = seen["services"][i]
        timed = ("identity", "launch") if i == 0 else ("identity",)   # the swallowed marker: the identity's age in it
        assert {k: v for k, v in snapped.items() if k not in timed} == {k: v for k, v in alone.items() if k not in timed}
        assert snapped["launch"].split("--knobkeeper-identity")[0] == alone["launch"].split("--knobkeeper-identity")[0]
        assert (snapped["identity"] is None) == (alone["identity"] is None)
        if alone["identity"] is not None:
            assert parse_identity(snapped["identity"]).pid == parse_identity(alone["identity"]).pid
    assert seen["services"][0]["state"] == "RUNNING" and seen["services"][0]["identity"] is None   # swallowed marker
    assert seen["services"][1]["state"] == "STOPPED" and seen["services"][1]["launch"].endswith("exec true\n")


def test_a_service_step_decides_on_the_snapshot_only_while_it_is_the_host_as_it_is(monkeypatch):
    """DeployRun.observe: the snapshot's reading when nothing was restarted since it was taken and it
    is young enough; else a look of its own (a restart upstream, or a slow run, may have changed it)."""
    from knobkeeper.deploy import operations

    asked: list[str] = []

    class Host:
        def get_fact(self, fact, svc, ctl):
            asked.append(svc.name)
            return {"state": "fresh"}

    monkeypatch.setattr(operations, "current_host", Host())
    run = object.__new__(operations.DeployRun)
    svc = _service(Path("/tmp/kk-none"), 1)
    plan = type("Plan", (), {"name": "h", "ctl": ""})()
    run.snapshot = lambda plan: snap   # type: ignore[method-assign]
    run.last_restart_at = float("-inf")
    snap = {"taken": time.monotonic(), "services": {svc.name: {"state": "snapped"}}}
    assert run.observe(plan, svc) == {"state": "snapped"} and asked == []
    assert run.observe(plan, svc) == {"state": "fresh"} and asked == [svc.name]   # a part is read once
    snap["services"][svc.name] = {"state": "snapped"}
    run.last_restart_at = time.monotonic()            # something of this run was restarted since
    assert run.observe(plan, svc) == {"state": "fresh"}
    snap.update(taken=time.monotonic() - operations.SNAPSHOT_FRESH_S - 1, services={svc.name: {"state": "snapped"}})
    run.last_restart_at = float("-inf")               # nothing restarted, but the reading is old
    assert run.observe(plan, svc) == {"state": "fresh"} and len(asked) == 3
