"""The local stack, deployed for real: supervisord, two sim workers and the real sglang-router.

One stack is deployed per module (free ports, a temporary infra repo) and shared by the tests, which
run in file order and each leave it healthy. Teardown stops supervisord by its pidfile and checks
that no process of the stack is left. The co-restart in dependency order runs against real vLLM
processes in tests/test_real_evidence.py (the field story's last step).

Last in the file, without the module's stack: a deploy record that survives a kill of the deploy, and
a deploy that does not outlive its caller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from knobkeeper import pids
from knobkeeper.changelog.ops import set_knob
from knobkeeper.deploy import parent
from knobkeeper.deploy.api import deploy_command, run_deploy
from knobkeeper.deploy.local import program_pids, stop_local, supervisord_pid
from knobkeeper.deploy.options import DeployOptions
from knobkeeper.deploy.record import (DeployRecord, ServiceRow, journal_path, load_records, recover_interrupted,
                                      write_journal)
from knobkeeper.deploy.status import stack_status
from knobkeeper.project import Project
from knobkeeper.timeutil import parse_time
from tests.infra import FAST_ENGINE_ARGS, git, make_infra_repo
from tests.procs import free_port

PROGRAMS = ["knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router"]
NASTY = "it's \"quoted\" $(touch {marker}) `touch {marker}` $HOME; rm -rf nothing &\nline two\ttab \\ end"
FAST = {
    "engine_args": FAST_ENGINE_ARGS,
    "stop_timeout": 10,
}


class Stack:
    def __init__(self, project, ports):
        self.project = project
        self.ports = ports
        self.prefix = project.state_dir / "local"
        self.ctl = str(Path(os.sys.executable).parent / "supervisorctl")

    def deploy(self, **kwargs):
        extra = {**FAST, **kwargs.pop("extra_data", {})}
        kwargs.setdefault("timeout", 240)
        return run_deploy(self.project, "inventory/local.py", extra_data=extra, **kwargs)

    def pids(self) -> dict[str, int | None]:
        return program_pids(self.prefix, self.ctl, PROGRAMS)

    def info(self, role: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports[role]}/get_server_info", timeout=5) as resp:
            return json.loads(resp.read())


def _ok(result):
    assert result.ok, f"deploy failed: {result.error}\n{result.output[-4000:]}"
    return result.record


def _row(record, name):
    return record.service("@local", name)


def _t(text: str) -> datetime:
    return parse_time(text)


def _process_start(pid: int) -> float:
    """Unix time a process started (from /proc, independent of knobkeeper's records)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    # starttime counts clock ticks since boot on the boot-time clock (btime is only whole seconds).
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    project = make_infra_repo(tmp_path_factory.mktemp("stack"))
    ports = {"prefill": free_port(), "bootstrap": free_port(), "decode": free_port(), "router": free_port(),
             "router_metrics": free_port()}
    old = os.environ.get("KNOBKEEPER_LOCAL_PORTS")
    os.environ["KNOBKEEPER_LOCAL_PORTS"] = ",".join(f"{k}={v}" for k, v in ports.items())
    s = Stack(project, ports)
    try:
        yield s
    finally:
        stopped = stop_local(s.prefix)
        if old is None:
            os.environ.pop("KNOBKEEPER_LOCAL_PORTS", None)
        else:
            os.environ["KNOBKEEPER_LOCAL_PORTS"] = old
        left = subprocess.run(["pgrep", "-f", str(s.prefix)], capture_output=True, text=True).stdout.split()
        alive = [p for p in stopped if pids.alive(p)]
        assert not left and not alive, f"processes left behind: {left or alive}"


def test_partial_deploy_of_a_stack_that_is_not_up_says_what_to_run_first(stack):
    """Issue 18 item 17: only=ROLE stands on roles it does not restart; they are checked in seconds."""
    result = stack.deploy(only="decode", knob_overrides={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": 256}},
                          record=False, timeout=90)
    assert result.returncode == 2 and result.record is None, result.output[-2000:]
    assert result.error.startswith("knobkeeper: error: the prefill is not running (@local/knobkeeper-prefill, ")
    assert result.error.endswith("run `knobkeeper deploy inventory/local.py` first")
    assert supervisord_pid(stack.prefix) is None  # nothing was started


def test_sigterm_during_a_deploy_stops_the_run_and_runs_the_callers_finally(tmp_path, project):
    """Issue 18 item 17: SIGTERM is handled like Ctrl-C: the pyinfra run is stopped, `finally` runs."""
    pid_file, marker = tmp_path / "pyinfra.pid", tmp_path / "restored"
    # A deploy.py that never finishes: it stands for a long gate.
    (project.root / "deploy.py").write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    caller = tmp_path / "caller.py"
    caller.write_text(
        "from knobkeeper.deploy.api import run_deploy, terminate_as_interrupt\n"
        "from pathlib import Path\n"
        "from knobkeeper.project import Project\n"
        "try:\n"
        "    with terminate_as_interrupt():\n"
        f"        run_deploy(Project(Path({str(project.root)!r})), 'inventory/local.py', allow_dirty=True, timeout=600)\n"
        "finally:\n"
        f"    open({str(marker)!r}, 'w').write('restored')\n")
    proc = subprocess.Popen([os.sys.executable, str(caller)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        pyinfra_pid = int(pid_file.read_text())
        proc.send_signal(15)
        assert proc.wait(120) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert marker.read_text() == "restored"
    assert not pids.alive(pyinfra_pid)


def test_first_deploy_starts_roles_in_order_each_healthy_first(stack):
    record = _ok(stack.deploy())
    assert record.order == ["prefill", "decode", "router"]
    rows = [_row(record, name) for name in PROGRAMS]
    assert [r["action"] for r in rows] == ["started"] * 3
    assert [r["engine"] for r in rows] == ["sim", "sim", "smg"]  # the pin of each role (local.py pins no version)
    assert all(r["gate"]["result"] == "passed" for r in rows)
    # Records: each role's restart was issued only after the previous role was healthy.
    for before, after in zip(rows, rows[1:]):
        assert _t(before["healthy_at"]) <= _t(after["restart_issued_at"]), (before, after)
    # Processes: the sims' own start times and the router's start time from /proc agree.
    prefill, decode = stack.info("prefill"), stack.info("decode")
    assert prefill["pid"] == rows[0]["pid"] and decode["pid"] == rows[1]["pid"]
    assert decode["started_at"] >= _t(rows[0]["healthy_at"]).timestamp() - 0.05
    assert _process_start(rows[2]["pid"]) >= _t(rows[1]["healthy_at"]).timestamp() - 0.02
    assert rows[2]["gate"]["status"].endswith("2 workers healthy")
    # One commit holding the record, with trailers.
    log = git(stack.project.root, "log", "-1", "--format=%(trailers:key=Deploy,valueonly)%n%s", "--", "changelog/deploys")
    assert record.id in log
    assert git(stack.project.root, "status", "--porcelain") == ""


def test_noop_deploy_restarts_nothing(stack):
    before = stack.pids()
    record = _ok(stack.deploy())
    assert [_row(record, n)["action"] for n in PROGRAMS] == ["unchanged"] * 3
    assert stack.pids() == before
    assert all(_row(record, n)["gate"]["result"] == "passed" for n in PROGRAMS)


def test_set_decode_knob_restarts_decode_only_and_router_is_gated(stack):
    before = stack.pids()
    change = set_knob(stack.project, "SGLANG_SM120_MMA_TARGET_CTAS", "512", "decode", "A/B +12.8% at 64")
    [drifted] = [s for s in stack_status(stack.project, "inventory/local.py", FAST) if s.state != "in sync"]
    assert drifted.service == "knobkeeper-decode" and drifted.state == "drifted"
    assert drifted.differences == ["SGLANG_SM120_MMA_TARGET_CTAS: running (unset), declared 512"]
    from knobkeeper.deploy.plan import restart_plan

    words = "knob SGLANG_SM120_MMA_TARGET_CTAS: set to 512 (was unset)"
    planned = {s["service"]: s for role in restart_plan(stack.project, "inventory/local.py", FAST)["roles"]
               for batch in role["batches"] for s in batch}
    assert planned["knobkeeper-decode"]["reason"] == f"files changed: {words}"
    record = _ok(stack.deploy())
    prefill, decode, router = (_row(record, n) for n in PROGRAMS)
    assert (prefill["action"], decode["action"], router["action"]) == ("unchanged", "restarted", "unchanged")
    # Issue 17 item 2: the record says what changed in words, not two digests.
    assert decode.changes == [words] and decode.reason == f"files changed: {words}"
    after = stack.pids()
    assert after["knobkeeper-prefill"] == before["knobkeeper-prefill"]
    assert after["knobkeeper-router"] == before["knobkeeper-router"]
    assert after["knobkeeper-decode"] != before["knobkeeper-decode"]
    # The router kept running but was gated after decode came back: it reports both workers healthy.
    assert router["gate"]["result"] == "passed" and _t(router["gate"]["checked_at"]) >= _t(decode["healthy_at"])
    assert stack.info("decode")["knobs"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"
    launch = (stack.prefix / "services/knobkeeper-decode/started.sh").read_text()
    assert f"# knob SGLANG_SM120_MMA_TARGET_CTAS: entry {change.entries[0].id} (set" in launch
    assert {s.state for s in stack_status(stack.project, "inventory/local.py", FAST)} == {"in sync"}


def test_knob_with_shell_metacharacters_reaches_the_process_byte_for_byte(stack, tmp_path):
    marker = tmp_path / "pwned"
    value = NASTY.format(marker=marker)
    set_knob(stack.project, "KNOBKEEPER_SIM_EXTRA_ARGS", value, "decode", "quoting test")
    record = _ok(stack.deploy())
    assert _row(record, "knobkeeper-decode")["action"] == "restarted"
    pid = stack.pids()["knobkeeper-decode"]
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert b"KNOBKEEPER_SIM_EXTRA_ARGS=" + value.encode() in environ
    assert not marker.exists()


def test_stopped_service_is_started_and_status_says_down(stack):
    subprocess.run([stack.ctl, "-c", str(stack.prefix / "supervisor/supervisord.conf"), "stop", "knobkeeper-prefill"],
                   check=True, capture_output=True)
    states = {s.service: s.state for s in stack_status(stack.project, "inventory/local.py", FAST)}
    assert states["knobkeeper-prefill"] == "down"
    record = _ok(stack.deploy())
    prefill, decode, router = (_row(record, n) for n in PROGRAMS)
    assert prefill["action"] == "started" and decode["action"] == "unchanged" and router["action"] == "unchanged"
    assert router["gate"]["result"] == "passed"


def test_ab_override_for_one_run_is_not_recorded_in_git(stack):
    head = git(stack.project.root, "rev-parse", "HEAD")
    knobs = (stack.project.knobs_path).read_text()
    result = stack.deploy(only="decode", knob_overrides={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": 256}}, record=False)
    record = _ok(result)
    assert git(stack.project.root, "rev-parse", "HEAD") == head and stack.project.knobs_path.read_text() == knobs
    assert _row(record, "knobkeeper-decode")["action"] == "restarted"
    assert _row(record, "knobkeeper-prefill")["reason"] == "not in only=decode"
    assert _row(record, "knobkeeper-router")["gate"]["result"] == "passed"  # downstream of decode: gated
    assert stack.info("decode")["knobs"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "256"
    assert "override (A/B run)" in (stack.prefix / "services/knobkeeper-decode/started.sh").read_text()
    # The next plain deploy puts the declared value back.
    record = _ok(stack.deploy())
    assert _row(record, "knobkeeper-decode")["action"] == "restarted"
    assert stack.info("decode")["knobs"]["SGLANG_SM120_MMA_TARGET_CTAS"] == "512"


def test_uncommitted_changes_are_refused_unless_allowed(stack):
    path = stack.project.inventory_dir / "knobs.toml"
    original = path.read_text()
    path.write_text(original + "\n# hand edit\n")
    try:
        result = stack.deploy()
        assert result.returncode == 2 and result.record is None
        assert "uncommitted changes in inventory/knobs.toml" in result.error
        record = _ok(stack.deploy(allow_dirty=True))
        assert record.dirty and record.allow_dirty
        assert [_row(record, n)["action"] for n in PROGRAMS] == ["unchanged"] * 3
    finally:
        path.write_text(original)


def test_decode_that_never_gets_healthy_stops_the_run_before_the_router(stack):
    """A failed gate stops the run before the router, and (issue 38 item 6: a stuck start-up outlived
    its failed gate, `status` called it in sync, the next deploy said "unchanged" and waited its
    whole timeout) stops the decode it started and marks it: status says down and why, the next
    deploy starts it, also when it was started again by hand in between. Issue 38 item 9: the run
    also changes the router's flags, but stops before the router: its files on the host stay as they
    were (no new launch script beside a process started from the old one, which `status` took for a
    hand edit and the next deploy restarted the router for)."""
    before = stack.pids()
    router_files = {name: (stack.prefix / "services/knobkeeper-router" / name).read_text()
                    for name in ("launch.sh", "started.sh")}
    broken = {"engine_args": {**FAST["engine_args"], "decode": ["--time-scale", "0.05", "--never-healthy"],
                              "router": [*FAST["engine_args"]["router"], "--request-timeout-secs", "300"]},
              "health_timeout": 4}
    result = stack.deploy(extra_data=broken)
    assert not result.ok and result.returncode != 0
    record = result.record
    assert record.result == "failed"
    decode, router = _row(record, "knobkeeper-decode"), _row(record, "knobkeeper-router")
    assert decode["action"] == "restarted" and decode["gate"]["result"] == "failed"
    assert decode["gate"]["seconds"] >= 4  # it waited its whole (overridden) timeout, no longer
    assert router["action"] == "unchanged" and router["reason"] == "not run" and router["restart_issued_at"] is None
    url = f"http://127.0.0.1:{stack.ports['decode']}/health"
    assert result.error.startswith(f"gate failed: host @local, service knobkeeper-decode, {url}: last status HTTP 503")
    assert result.error.endswith("; stopped knobkeeper-decode (marked failed: the next deploy starts it again)")
    assert stack.pids()["knobkeeper-router"] == before["knobkeeper-router"]
    # The router's files are as they were, and status calls it in sync (the declared flags are FAST's).
    # The decode it started is stopped, and status says why; a plan starts it.
    assert {name: (stack.prefix / "services/knobkeeper-router" / name).read_text() for name in router_files} \
        == router_files
    assert stack.pids()["knobkeeper-decode"] is None and decode.stopped_at is not None
    why = f"its gate failed in deploy {record.id} at "
    states = {s.service: s for s in stack_status(stack.project, "inventory/local.py", FAST)}
    assert states["knobkeeper-router"].state == "in sync", states["knobkeeper-router"]
    seen = states["knobkeeper-decode"]
    assert seen.state == "down" and seen.differences[0].startswith(f"stopped: {why}"), seen
    assert "HTTP 503" in seen.differences[0]
    planned = _planned(stack, {})["knobkeeper-decode"]
    assert planned["action"] == "start" and why in planned["reason"], planned
    # Started by hand (it runs, never healthy): still not "unchanged" for the next deploy.
    subprocess.run([stack.ctl, "-c", str(stack.prefix / "supervisor/supervisord.conf"), "start", "knobkeeper-decode"],
                   check=True, capture_output=True)
    [seen] = [s for s in stack_status(stack.project, "inventory/local.py", {**FAST, **broken})
              if s.service == "knobkeeper-decode"]
    assert seen.state == "drifted" and len(seen.differences) == 1, seen   # running what is declared, but unproven
    assert seen.differences[0].startswith(f"running without a passed gate ({why}"), seen
    assert seen.differences[0].endswith("): a deploy restarts it"), seen
    # Recovery: the next good deploy restarts decode and gates the router, which it leaves running.
    record = _ok(stack.deploy())
    assert _row(record, "knobkeeper-decode")["action"] == "restarted"
    assert _row(record, "knobkeeper-decode")["reason"].startswith(f"running without a passed gate: {why}")
    assert _row(record, "knobkeeper-router")["gate"]["result"] == "passed"
    assert _row(record, "knobkeeper-router")["action"] == "unchanged", _row(record, "knobkeeper-router")
    assert not (stack.prefix / "services/knobkeeper-decode/failed-gate.json").exists()
    assert supervisord_pid(stack.prefix)


def _planned(stack, data: dict) -> dict[str, dict]:
    """{service: its row of `knobkeeper plan`} for the local stack with `data`."""
    from knobkeeper.deploy.plan import restart_plan

    plan = restart_plan(stack.project, "inventory/local.py", {**FAST, **data})
    return {s["service"]: s for role in plan["roles"] for batch in role["batches"] for s in batch}


def test_stray_server_on_the_decode_port_fails_the_deploy_before_the_router(stack):
    """Issue 18 item 7: an answer on the port from another process is not a healthy decode."""
    from tests.procs import answering_server

    conf = str(stack.prefix / "supervisor/supervisord.conf")
    subprocess.run([stack.ctl, "-c", conf, "stop", "knobkeeper-decode"], check=True, capture_output=True)
    with answering_server(stack.ports["decode"]):
        before = stack.pids()
        result = stack.deploy(restart="co")
        assert not result.ok and result.record is not None and result.record.result == "failed"
        decode, router = _row(result.record, "knobkeeper-decode"), _row(result.record, "knobkeeper-router")
        assert decode.gate.result != "passed"
        assert router.restart_issued_at is None and router.action == "unchanged"
        # Issue 38 item 19: nothing was started, and neither the record nor the summary says it was.
        port = stack.ports["decode"]
        assert decode.action == "unchanged" and decode.restart_issued_at is None
        # ... and the port's holder is named (the answering server is this test's own thread)
        assert decode.reason.startswith(f"not started: port {port} taken by pid {os.getpid()} ("), decode.reason
        assert decode.reason.endswith("); it was to be started: not running (stopped)"), decode.reason
        from knobkeeper.cli.deploy import _summary

        assert f"  @local/knobkeeper-decode: unchanged ({decode.reason}); gate failed" in _summary(result).splitlines()
        trailers = git(stack.project.root, "log", "-1", "--format=%(trailers:key=Started,valueonly)", "--",
                       "changelog/deploys")
        assert "knobkeeper-decode" not in trailers
        assert stack.pids()["knobkeeper-router"] == before["knobkeeper-router"]
        states = {s.service: s for s in stack_status(stack.project, "inventory/local.py", FAST)}
        assert states["knobkeeper-decode"].state == "down", states["knobkeeper-decode"]
    # With the port free again the next deploy repairs decode (or finds that one of supervisord's
    # bounded retries already did) and gates the router.
    record = _ok(stack.deploy())
    assert _row(record, "knobkeeper-decode")["action"] in ("started", "unchanged")
    assert _row(record, "knobkeeper-decode")["gate"]["result"] == "passed"
    assert _row(record, "knobkeeper-router")["gate"]["result"] == "passed"


# --- a deploy record survives a kill (issue 25, finding 8) ---------------------------------------
# The run journals its record under .git/knobkeeper/ before each restart it issues; a SIGKILLed deploy
# leaves that journal, and the next command completes the record: "interrupted after restarting
# prefill at T", committed like any other. One real deploy of the local stack (supervisord, the sim
# prefill), killed by PID once the prefill's restart is issued; everything it started is stopped by
# supervisord's pidfile at the end.

def test_a_record_journal_left_by_a_live_deploy_is_not_touched_and_a_dead_one_s_is_completed(project):
    record = DeployRecord(id="0a0a0a0a", inventory="local", inventory_path="inventory/local.py", commit="x",
                          dirty=False, allow_dirty=False, options={}, order=["prefill", "decode"],
                          started_at="2026-12-01T10:00:00.000000Z",
                          services=[ServiceRow(host="@local", service="p", role="prefill", action="started",
                                               restart_issued_at="2026-12-01T10:00:01.000000Z"),
                                    ServiceRow(host="@local", service="d", role="decode", reason="not run")])
    write_journal(project, record, commit=True)
    project.state_dir.mkdir(exist_ok=True)
    # A live deploy holds the deploy lock (a real second process): its journal is left alone.
    holder = subprocess.Popen([sys.executable, "-c",
                               "import fcntl, sys, time; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
                               "print('locked', flush=True); time.sleep(60)", str(project.state_dir / "deploy.lock")],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert recover_interrupted(project) == [] and journal_path(project, record.id).exists()
    finally:
        holder.kill()
        holder.wait()
    (done,) = [r for r in load_records(project) if r.id == record.id]
    assert done.result == "interrupted"
    assert done.error.startswith("interrupted after restarting prefill at 2026-12-01T10:00:01.000000Z")
    assert "not seen healthy since: @local/p" in done.error
    assert not journal_path(project, record.id).exists()
    assert "deploy local: @local/p (interrupted)" in git(project.root, "log", "-1", "--format=%s")
    assert recover_interrupted(project) == []


def test_a_sigkilled_deploy_leaves_a_record_the_next_command_completes(project):
    prefix = project.state_dir / "local"
    ports = {"prefill": free_port(), "bootstrap": free_port(), "decode": free_port(), "router": free_port(),
             "router_metrics": free_port()}
    env = {**os.environ, "KNOBKEEPER_LOCAL_PORTS": ",".join(f"{k}={v}" for k, v in ports.items())}
    options = DeployOptions(deploy_id="5151ab1e")
    cmd = deploy_command("inventory/local.py", options, {"engine_args": {"prefill": ["--time-scale", "0.05"]}})
    proc = subprocess.Popen(cmd, cwd=project.root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    journal = journal_path(project, "5151ab1e")
    issued = None
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and issued is None:
            try:
                rows = json.loads(journal.read_text())["record"]["services"]
                issued = next((r["restart_issued_at"] for r in rows if r["role"] == "prefill" and r["restart_issued_at"]),
                              None)
            except (OSError, ValueError, KeyError):
                time.sleep(0.05)
        assert issued is not None, f"no journal of the prefill's restart (deploy exit {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)          # the deploy process, by its PID
        proc.wait(30)
        assert journal.exists() and not list(project.deploys_dir.glob("*-5151ab1e.json"))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        time.sleep(1)   # the killed run's restart command may still be starting its program
        stopped = stop_local(prefix)
    assert not [p for p in stopped if pids.alive(p)]

    # The next command (any reader of the records: log, timeline, report, the next deploy) completes it.
    records = load_records(Project(project.root))
    (record,) = [r for r in records if r.id == "5151ab1e"]
    assert record.result == "interrupted" and record.started_at and record.finished_at
    assert record.error.startswith(f"interrupted after restarting prefill at {issued}"), record.error
    assert [r.role for r in record.services if r.restart_issued_at] == ["prefill"]
    assert not journal.exists()
    assert git(project.root, "log", "-1", "--format=%(trailers:key=Deploy,valueonly)").strip() == "5151ab1e"


# --- a deploy dies with its caller (issue 25, finding 4) -----------------------------------------
# A deploy must not outlive a caller killed outright (a canary's, say). Where Linux's PR_SET_PDEATHSIG
# exists the pyinfra run gets SIGTERM when its parent dies; on any OS the deploy's process also
# watches its parent PID itself (knobkeeper/deploy/parent.py, started from config.py):
# - real processes, no prctl anywhere: a middle process starts a child that watches it (in its own
#   session, as run_deploy's pyinfra is), the middle is SIGKILLed by PID, the child goes;
# - run_deploy's real pyinfra run starts the watch (deploy.py stood in for by one that reports it).

def test_a_deploy_dies_with_its_sigkilled_caller(tmp_path, project):
    """Finding 4's second half: the pyinfra run is in its own session, yet it must not outlive a
    canary (or any caller) killed outright: it gets SIGTERM when its parent dies."""
    pid_file = tmp_path / "pyinfra.pid"
    (project.root / "deploy.py").write_text(   # stands for a long candidate deploy
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)\n")
    caller = subprocess.Popen([sys.executable, "-c",
                               "import sys; from pathlib import Path; from knobkeeper.deploy.api import run_deploy; "
                               "from knobkeeper.project import Project; "
                               "run_deploy(Project(Path(sys.argv[1])), 'inventory/local.py', allow_dirty=True, timeout=600)",
                               str(project.root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pyinfra_pid = None
    try:
        deadline = time.monotonic() + 120
        while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline and caller.poll() is None:
            time.sleep(0.1)
        pyinfra_pid = int(pid_file.read_text())
        _sigkill_then_wait_for(caller, pyinfra_pid)
        assert not pids.alive(pyinfra_pid), "the deploy outlived its killed caller"
    finally:
        if caller.poll() is None:
            caller.kill()
        if pyinfra_pid and pids.alive(pyinfra_pid):
            os.kill(pyinfra_pid, signal.SIGKILL)


def _sigkill_then_wait_for(parent: subprocess.Popen, child: int, seconds: float = 30) -> None:
    """SIGKILL `parent`, reap it, then give `child` up to `seconds` to be gone (the caller asserts)."""
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(30)
    deadline = time.monotonic() + seconds
    while pids.alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)


MIDDLE = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import time; from knobkeeper.deploy.parent import watch_parent; "
    "print(watch_parent(0.2), flush=True); time.sleep(300)"],
    env={{**os.environ, {parent.PARENT_ENV!r}: str(os.getpid())}}, start_new_session=True, stdout=sys.stdout)
print(child.pid, flush=True)
time.sleep(300)
"""


def test_a_watched_child_dies_with_its_sigkilled_parent_without_prctl():
    middle = subprocess.Popen([sys.executable, "-c", MIDDLE], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        first, second = middle.stdout.readline().strip(), middle.stdout.readline().strip()
        child = int(first if first.isdigit() else second)
        assert "True" in (first, second)           # watching
        _sigkill_then_wait_for(middle, child)
        assert not pids.alive(child), "the child outlived its SIGKILLed parent"
    finally:
        if middle.poll() is None:
            middle.kill()
            middle.wait()
        if child and pids.alive(child):
            os.kill(child, signal.SIGKILL)
    # not started by run_deploy: nothing to watch
    assert parent.PARENT_ENV not in os.environ and parent.watch_parent() is False


def test_run_deploy_s_pyinfra_watches_its_parent(tmp_path, project):
    report = tmp_path / "threads.json"
    (project.root / "deploy.py").write_text(   # stands for the deploy: what config.py started, then done
        "import json, os, threading\n"
        f"json.dump({{'threads': [t.name for t in threading.enumerate()], "
        f"'env': os.environ.get({parent.PARENT_ENV!r})}}, open({str(report)!r}, 'w'))\n")
    run_deploy(project, "inventory/local.py", allow_dirty=True, timeout=300)
    seen = json.loads(report.read_text())
    assert parent.THREAD_NAME in seen["threads"], seen
    assert seen["env"] is None                    # removed: what the deploy starts does not inherit it
