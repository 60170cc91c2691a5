"""Health gates (knobkeeper/deploy/health.py): the answer on the port must come from the supervised
process, a (re)started one must stay the same PID for its settle time, a long wait says what it waits
for, and a partial deploy first checks the roles it does not restart. No deploy runs here: the
service manager is stood in for by shell commands, the service by a server in this process."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time
from pathlib import Path

import pytest

from knobkeeper.deploy.stack import load_stack
from knobkeeper.errors import UserError

LOCAL = "inventory/local.py"

# --- a gate ties the answer to the supervised process --------------------------------------------------


def _fake_service(port: int):
    from knobkeeper.deploy.model import Service

    return Service(host="@local", role="decode", name="fake-decode", index=0, prefix="/tmp/kk-fake",
                   manager="supervisord", engine="sim", listen_host="127.0.0.1", address="127.0.0.1", port=port,
                   bootstrap_port=None, metrics_port=None, health_path="/health", workers_path=None,
                   health_timeout=1.0, settle=0.0, user=None, stop_timeout=5, unit_dir="/tmp")


def _local_shell(command: str) -> list[str]:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines()


@pytest.fixture
def answering_server():
    """A server in THIS process answering 200 (a stray, unless this process is the service)."""
    from tests.procs import answering_server

    with answering_server() as port:
        yield port


def _age_of_this_process() -> float:
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    return float(Path("/proc/uptime").read_text().split()[0]) - ticks / os.sysconf("SC_CLK_TCK")


def test_gate_fails_when_another_process_answers_on_the_port(answering_server):
    from knobkeeper.deploy.health import wait_gate

    svc = _fake_service(answering_server)
    # `ctl pid NAME` stands for the service manager's answer. The "supervised" pid is 1 (init): it does not hold the port, this test process does.
    outcome = wait_gate(svc, 0, 30.0, _local_shell, "echo 1; :", say=lambda _: None)
    assert not outcome.ok
    # the holder is named: this test process, its PID and the start of its command line
    command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100].strip()
    assert outcome.status == (f"port {answering_server} answers, but not from fake-decode (pid 1): pid {os.getpid()} "
                              f"({command}) holds the port (stop it)")
    # The same answer from the supervised process passes, and stays the same PID over the settle time.
    settle = _age_of_this_process() + 0.3  # so that the gate waits out the rest, then looks again
    outcome = wait_gate(svc, 0, 30.0, _local_shell, f"echo {os.getpid()}; :", settle=settle, say=lambda _: None)
    assert outcome.ok and outcome.pid == os.getpid()


def test_gate_reports_a_pid_that_changes_while_settling(answering_server, tmp_path):
    from knobkeeper.deploy.health import Settling, settled, wait_gate

    counter = tmp_path / "n"
    counter.write_text("0")
    # Each look reports a new pid, as a crash loop does (only the first one holds the port).
    ctl = (f"n=$(cat {counter}); echo $((n+1)) > {counter}; "
           f"if [ $n = 0 ]; then echo {os.getpid()}; else echo 1; fi; :")
    # The settle time is far off (this process is an hour short of it at the first look, however busy
    # the machine), so the gate returns what it waits on; its due time is then brought to now instead
    # of sleeping an hour. (A settle 0.3 s ahead was already past by the first look under CI's load.)
    pending = wait_gate(_fake_service(answering_server), 0, 30.0, _local_shell, ctl,
                        settle=_age_of_this_process() + 3600.0, say=lambda _: None, defer=True)
    assert isinstance(pending, Settling) and pending.pid == os.getpid()
    outcome = settled(dataclasses.replace(pending, due=time.monotonic()), 0, _local_shell, ctl)
    assert not outcome.ok and outcome.status.startswith(f"restart loop: pid {os.getpid()} -> 1")


def test_a_long_wait_says_what_it_waits_for(monkeypatch):
    from knobkeeper.deploy import health
    from tests.procs import free_port

    monkeypatch.setattr(health, "QUIET_S", 0.2)
    monkeypatch.setattr(health, "PROGRESS_EVERY_S", 0.3)
    said: list[str] = []
    port = free_port()
    outcome = health.wait_gate(_fake_service(port), 0, 1.0, _local_shell, "true", say=said.append)
    assert not outcome.ok and outcome.status.startswith("no answer")
    assert said and said[0].startswith(f"waiting for decode 127.0.0.1:{port} /health (")
    assert " s of 1 s): last status no answer" in said[0]


def test_status_calls_a_changing_pid_a_restart_loop(monkeypatch):
    from knobkeeper.deploy import status

    monkeypatch.setattr(status, "LOOP_CHECK_S", 0.0)
    svc = _fake_service(1)

    class Shell:
        def run(self, host, command):
            return ["fake-decode                      RUNNING   pid 222, uptime 0:00:01"]

    class Plan:
        ctl = "supervisorctl"

    seen = {svc.key: {"running": True, "pid": 111, "state": "RUNNING"}}
    status._mark_restart_loops(Shell(), type("S", (), {"hosts": {"@local": Plan()}})(), [svc], seen)
    assert seen[svc.key]["running"] is False and seen[svc.key]["state"] == "RESTART-LOOP (pid 111 -> 222)"


def test_partial_deploy_check_names_the_role_that_is_not_up_and_what_to_run(shared):
    from knobkeeper.deploy.health import require_up
    from tests.procs import answering_server, free_port

    with answering_server() as prefill:
        ports = {"prefill_port": prefill, "prefill_bootstrap_port": free_port(), "decode_port": free_port(),
                 "router_port": free_port(), "router_metrics_port": free_port()}
        stack = load_stack(shared.root, LOCAL, ports)
        with pytest.raises(UserError) as err:
            require_up(stack, ["decode"], "inventory/local.py")
        assert str(err.value).startswith("the router is not running (@local/knobkeeper-router, http://127.0.0.1:")
        assert str(err.value).endswith(": run `knobkeeper deploy inventory/local.py` first")
        with answering_server(ports["router_port"]):
            require_up(stack, ["decode"], "inventory/local.py")  # prefill healthy, router running: go
    with pytest.raises(UserError, match="^the prefill is not running"):
        require_up(stack, ["decode"], "inventory/local.py")


# --- the settle, waited out later; a service manager that gave up ---------------------------------------


def test_a_deferred_settle_returns_at_once_and_is_checked_later(answering_server, tmp_path):
    """defer=True: healthy as the supervised PID, some settle left: a Settling comes back without
    waiting; settled() waits out the rest and looks again (a new PID by then is a restart loop)."""
    import time

    from knobkeeper.deploy.health import Settling, settled, wait_gate

    svc = _fake_service(answering_server)
    me = f"echo {os.getpid()}; :"
    began = time.monotonic()
    # 3 s ahead: still ahead at the first look on a busy machine (0.3 s was not, in CI)
    pending = wait_gate(svc, 0, 30.0, _local_shell, me, settle=_age_of_this_process() + 3.0, say=lambda _: None,
                        restarted=True, defer=True)
    assert isinstance(pending, Settling) and pending.pid == os.getpid()
    assert time.monotonic() - began < pending.due - began          # it did not wait the settle out
    outcome = settled(pending, 0, _local_shell, me)
    assert outcome.ok and outcome.pid == os.getpid() and time.monotonic() >= pending.due
    pending = wait_gate(svc, 0, 30.0, _local_shell, me, settle=_age_of_this_process() + 3600.0, say=lambda _: None,
                        defer=True)
    assert isinstance(pending, Settling)
    outcome = settled(dataclasses.replace(pending, due=time.monotonic()), 0, _local_shell,
                      "echo 1; :")                                # another process by then (an hour early)
    assert not outcome.ok and outcome.status.startswith(f"restart loop: pid {os.getpid()} -> 1")


def test_a_restarted_service_its_manager_gave_up_on_fails_at_once_with_its_log(tmp_path):
    """supervisord FATAL (it exited within startsecs, startretries times): the gate says so within
    seconds (its first look at GAVE_UP_FIRST_S), not at its timeout, naming the log."""
    import time

    from knobkeeper.deploy.health import wait_gate
    from tests.procs import free_port

    svc = _fake_service(free_port())                              # nothing answers
    fatal = "echo 'fake-decode                      FATAL     Exited too quickly (process log may have details)'; :"
    began = time.monotonic()
    outcome = wait_gate(svc, 0, 60.0, _local_shell, fatal, restarted=True, say=lambda _: None)
    assert not outcome.ok and time.monotonic() - began < 10
    assert outcome.status.startswith("fake-decode did not stay up (fatal); /tmp/kk-fake/supervisor/logs/fake-decode.log ends:")
    # not restarted by this run: a down service is waited for (a deploy that did not start it)
    outcome = wait_gate(svc, 0, 0.5, _local_shell, fatal, say=lambda _: None)
    assert not outcome.ok and outcome.status.startswith("no answer")


def test_a_port_held_by_what_an_earlier_run_left_is_told_from_a_strangers(tmp_path):
    """The identity names who holds a service's port when the supervised process does not: its PID,
    its command, and whether it is what the service's last run left (in that run's process group and
    the service's folder: the restart stops it) or a stranger (the deploy stops before the restart)."""
    import sys
    import time
    from dataclasses import replace

    from knobkeeper.deploy.health import identity_command, parse_identity
    from tests.procs import free_port

    port = free_port()
    svc = replace(_fake_service(port), prefix=str(tmp_path))
    Path(svc.service_dir).mkdir(parents=True)
    up = tmp_path / "up"
    server = (f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
              f"open({str(up)!r}, 'w').close(); time.sleep(600)")
    for cwd, leftover in ((svc.service_dir, True), (str(tmp_path), False)):
        up.unlink(missing_ok=True)
        holder = subprocess.Popen([sys.executable, "-c", server], cwd=cwd, start_new_session=True)
        Path(svc.group_path).write_text(f"{holder.pid}\n")
        try:
            for _ in range(600):
                if up.exists() or holder.poll() is not None:
                    break
                time.sleep(0.05)
            ident = parse_identity(_local_shell(identity_command(svc, "echo 1; :")), port)
            assert ident.stray and ident.other == holder.pid and ident.leftover is leftover, ident
            assert ident.other_command.startswith(f"{sys.executable} -c import socket"), ident
            words = f"pid {holder.pid} ({ident.other_command})" + (", left over from an earlier run of it" if leftover else "")
            assert ident.holder_words() == words
        finally:
            holder.kill()
            holder.wait()


def test_a_failed_pd_proof_names_the_workers_whose_logs_say_they_died(monkeypatch):
    """Gates.deaths_of: the words a failed PD proof adds, one per service whose own log says a
    process died (read on its host through onhost.on_host); none for a service whose log is clean."""
    from types import SimpleNamespace

    from knobkeeper.deploy import gates

    hosts = {}
    monkeypatch.setattr(gates, "on_host", lambda host: hosts.setdefault(host, f"runner of {host}"))
    monkeypatch.setattr(gates, "own_lines", lambda svc, pid, runner: [f"{svc.name} {pid} {runner}"])
    monkeypatch.setattr(gates, "log_says", lambda svc, pid, runner: f"its log says: VllmWorker-0 died ({runner})")
    died = SimpleNamespace(host="h1", role="decode", name="knobkeeper-decode",
                           family=SimpleNamespace(deaths=lambda lines: ["VllmWorker-0"] if "h1" in lines[0] else []))
    clean = SimpleNamespace(host="h2", role="decode", name="knobkeeper-decode-2", family=died.family)
    run = SimpleNamespace(state=SimpleNamespace(inventory=SimpleNamespace(get_host=lambda name: name)),
                          row=lambda svc: SimpleNamespace(pid=7))
    words = gates.Gates(run, restart_shell=lambda plan, svc: "").deaths_of([died, clean])
    assert words == "; decode knobkeeper-decode: its log says: VllmWorker-0 died (runner of h1)"
    assert set(hosts) == {"h1", "h2"}
