"""The gates of a deploy run: what a started service must show before the run goes on, and what
happens to it when it does not (deploy/operations.py's DeployRun holds one, `run.gates`, built once
per pyinfra process and shared by every host; operations.py states the order the gates run in).

    gates.gate(host_name, role, batch)   the role's health gate on one host (every host runs it:
                                         also the batch's barrier)
    gates.settle_pending()               every pending settle waited out, before any restart and
                                         before the record
    gates.port_free(host, plan, svc)     before a (re)start: nothing else holds the service's ports
    gates.prove_pd()                     once, after the last role: the PD path works

Gates (health.wait_gate): the health URL answers 200, the process listening on the port is the one
the service manager supervises, and a process this run (re)started is still that PID after the
role's `settle` seconds. The settle runs while the deploy goes on with work that restarts nothing
(the gates of the roles downstream, the record): every pending settle is waited out before the next
restart of anything (`settle_pending`, the first command of every restart) and before the record is
written, so the guarantee is the one a gate that slept would give, at the cost of the longest
settle instead of their sum with everything after them.

A failed gate leaves no unproven process behind: when the gate of a service this run (re)started
fails (a timeout, a crash, a start-up that can never finish), the service is stopped and marked
(`failed_gate_path`: which deploy, when, the gate's last status), so that `status` calls it down
and says why, and the next deploy starts it again (plan.decide: also when it was started since by
hand). Rollback (--data rollback=true): the launch script and program/unit it ran before (kept as
previous.sh / previous.<conf|service> at the restart) are put back and the service is restarted and
gated again; only when that fails too is it stopped. The run fails either way, saying so.

Ports: before a (re)start nothing but the service itself may hold its port or its family's
per-instance ports; a taken port fails the run before that restart is issued (`port_free`).

PD proof: when this run restarted a prefill or decode whose family can prove its PD path (vLLM:
every decode instance's prompt tokens came over the connector), one request through the router;
a failure names the processes whose own logs say they died (`prove_pd`, `deaths_of`).

The rollback restarts with the run's one restart shell (operations.restart_shell), handed in when
the Gates are built: this module does not import operations.py, which imports it.
"""

from __future__ import annotations

import json
import shlex
import time
from typing import Any, Callable

from pyinfra import host as current_host
from pyinfra.api import StringCommand
from pyinfra.context import ctx_host

import gevent
import gevent.lock

from knobkeeper.deploy.health import (GateOutcome, Settling, identity_command, log_says, own_lines, parse_identity,
                                      settled, wait_gate)
from knobkeeper.deploy.model import HostPlan, Service
from knobkeeper.deploy.onhost import GateFailed, on_host, say
from knobkeeper.deploy.record import Rollback
from knobkeeper.timeutil import iso, utcnow


class Gates:
    """The gates of one deploy run and their settle state. `run` is the DeployRun (its record's rows,
    stack, options, the roles gated, the journal, the run's first error); `restart_shell(plan, svc)`
    is the run's one restart command, which the rollback reissues."""

    def __init__(self, run: Any, restart_shell: Callable[[HostPlan, Service], str]) -> None:
        self.run = run
        self.restart_shell = restart_shell
        # (re)started services healthy as their supervised PID whose settle is not over yet
        self.settling: dict[str, tuple[Any, HostPlan, Service, Settling, float, str]] = {}
        self._settle_lock = gevent.lock.Semaphore()
        self._settle_failure: GateFailed | None = None
        self.gated_early: set[str] = set()   # services gated in their restart step (gate_unchanged)

    def wait(self, plan: HostPlan, svc: Service, settle: float, host: Any = None, restarted: bool = False,
             defer: bool = False, identity: list[str] | None = None) -> GateOutcome | Settling:
        return wait_gate(svc, self.expected_workers(), svc.health_timeout, on_host(host), plan.ctl, settle=settle,
                         restarted=restarted, defer=defer, identity=identity)

    def gate_unchanged(self, host_name: str, svc: Service, identity: list[str] | None) -> None:
        """The gate of a service this run leaves as it is, run in its restart step right after its
        state was read, with the identity read in that same command (ServiceState): the same gate
        (health answered 200 by the supervised PID; waited for up to the timeout; a failure raises
        GateFailed and fails the run), one round trip to the host sooner. Only where the role's gate
        would gate it; the role's gate then passes over it (nothing of it is left to wait for, and a
        service this run leaves alone cannot be settling)."""
        plan = self.run.stack.hosts[host_name]
        if svc.role not in self.run.gated or self.run.options.restart == "none" or self.run.row(svc).acted:
            return
        started = time.monotonic()
        self.gated_early.add(svc.key)
        outcome = self.wait(plan, svc, 0.0, identity=identity)
        self.gated_outcome(plan, svc, outcome, started)   # type: ignore[arg-type]  (no settle: a GateOutcome)

    def gate(self, host_name: str, role: str, batch: int = 0) -> None:
        """Wait until every service of `role` on this host is healthy (when the host is in `batch`);
        raise GateFailed on timeout, after a rollback when rollback=true. A service this run
        (re)started that is healthy before its settle is over is left settling (see settle_pending)."""
        plan = self.run.stack.hosts[host_name]
        if self.run.batch_of(host_name, role) != batch:
            return
        for svc in plan.role_services(role):
            row = self.run.row(svc)
            if svc.key in self.gated_early:   # gated in its restart step (gate_unchanged)
                continue
            if role not in self.run.gated or self.run.options.restart == "none":
                row.gate.result = "skipped"
                continue
            started = time.monotonic()
            outcome = self.wait(plan, svc, svc.settle if row.acted else 0.0, restarted=row.acted, defer=row.acted)
            if isinstance(outcome, Settling):
                # healthy_at: when the new process first answered healthy as the supervised PID; the
                # gate's checked_at comes when its settle is over (settle_pending)
                self.settling[svc.key] = (ctx_host.get(), plan, svc, outcome, started, iso(utcnow()))
                row.gate.status, row.pid = f"{outcome.status}; settling", outcome.pid
                continue
            self.gated_outcome(plan, svc, outcome, started)

    def gated_outcome(self, plan: HostPlan, svc: Service, outcome: GateOutcome, started: float,
                      host: Any = None, healthy_at: str | None = None) -> None:
        """Record a gate's outcome in the service's row; on failure roll back (rollback=true) and raise."""
        row = self.run.row(svc)
        seconds = round(time.monotonic() - started, 3)
        row.gate.status, row.gate.seconds, row.gate.checked_at = outcome.status, seconds, iso(utcnow())
        if not outcome.ok:
            row.gate.result = "failed"
            url = svc.health_url if not outcome.status.startswith("workers") else svc.workers_url
            error = (f"gate failed: host {svc.host}, service {svc.name}, {url}: last status {outcome.status} "
                     f"after {seconds:.1f} s (timeout {svc.health_timeout:g} s)")
            if "log says" not in outcome.status and " ends: " not in outcome.status:
                error += "; " + log_says(svc, outcome.pid or row.pid, on_host(host))   # e.g. its worker's SIGILL
            if row.acted:   # a process this run started: rolled back (rollback=true) or stopped, never left
                back = self.roll_back(plan, svc, host) if self.run.options.rollback else None
                if back is not None:
                    error += "; " + back
                if row.rollback is None or row.rollback.result != "passed":
                    error += "; " + self.stop_failed(plan, svc, outcome.status, host)
            self.run.error = self.run.error or error
            raise GateFailed(error)
        row.gate.result = "passed"
        row.pid = outcome.pid
        if row.acted:
            row.healthy_at = healthy_at or row.gate.checked_at
            self.run.journal()

    def settle_pending(self) -> None:
        """Wait out every pending settle, all at once (each on its own host), and record each gate;
        GateFailed (the first failure, also for every later caller) when a process did not stay up.
        Runs before any restart and before the record: nothing is restarted, and no run reports
        success, before every process this run started stayed up its settle time."""
        with self._settle_lock:
            if self._settle_failure is not None:
                raise self._settle_failure
            pending, self.settling = list(self.settling.values()), {}
            looks = [gevent.spawn(settled, p, self.expected_workers(), on_host(host), plan.ctl)
                     for host, plan, _, p, _, _ in pending]
            gevent.joinall(looks)
            for (host, plan, svc, _, started, healthy_at), look in zip(pending, looks):
                outcome = look.value if look.successful() else GateOutcome(False, f"settle check failed: {look.exception}")
                try:
                    self.gated_outcome(plan, svc, outcome, started, host, healthy_at)
                except GateFailed as exc:
                    self._settle_failure = self._settle_failure or exc
            if self._settle_failure is not None:
                raise self._settle_failure

    def stop_failed(self, plan: HostPlan, svc: Service, status: str, host: Any = None) -> str:
        """Stop a service whose gate failed after this run (re)started it, and mark it
        (`failed_gate_path`), on `host` (default the host whose operation runs): a process that never
        passed its gate neither lingers as "in sync" (a stuck start-up lives on; one that came up
        later would serve unproven) nor makes the next deploy say "unchanged" (plan.decide starts it
        again). Returns the words for the run's error; the row gets `stopped_at`."""
        row = self.run.row(svc)
        ok, output = (host or current_host).run_shell_command(
            StringCommand(stop_shell(plan, svc, self.run.record.id, status)))
        if not ok:
            text = " ".join((list(output.stdout_lines) + list(output.stderr_lines))[-3:])
            return f"stopping {svc.name} FAILED ({text}): stop it by hand"
        row.stopped_at = iso(utcnow())
        self.run.journal()
        return f"stopped {svc.name} (marked failed: the next deploy starts it again)"

    def roll_back(self, plan: HostPlan, svc: Service, host: Any = None) -> str:
        """Put back the launch script and program/unit `svc` ran before this run restarted it, restart
        it and gate it again (on `host`, default the host whose operation runs). Returns the words for
        the run's error; the row gets a Rollback."""
        row = self.run.row(svc)
        rollback = row.rollback = Rollback(digest=row.previous_digest)
        if not row.previous_digest:
            rollback.status = "nothing to roll back to (no previous started.sh)"
            return f"no rollback of {svc.key}: it had no previous launch script"
        rollback.restart_issued_at = iso(utcnow())
        self.run.journal()
        ok, output = (host or current_host).run_shell_command(
            StringCommand(f"{restore_shell(svc)} && {self.restart_shell(plan, svc)}"))
        if not ok:
            text = " ".join((list(output.stdout_lines) + list(output.stderr_lines))[-3:])
            rollback.status = f"restore failed: {text}"
            return f"rollback of {svc.key} to {row.previous_digest} FAILED ({text})"
        outcome = self.wait(plan, svc, svc.settle, host, restarted=True)
        rollback.status = outcome.status
        if not outcome.ok:
            return f"rolled back {svc.key} to {row.previous_digest}, but it is not healthy either ({outcome.status})"
        rollback.result, rollback.healthy_at = "passed", iso(utcnow())
        return f"rolled back {svc.key} to {row.previous_digest} (healthy again)"

    def prove_pd(self) -> None:
        """Every decode instance's prompt tokens came over the connector (Family.prove_pd: one
        request through the router, one from a prefill to each other decode instance; the prefills
        this run restarted are used first); the record's `pd_proof` says per instance what it saw.
        Only after a run that (re)started a worker: cheap, not free."""
        self.settle_pending()
        workers = [s for s in self.run.stack.services if s.family.kind == "worker" and hasattr(s.family, "prove_pd")]
        routers = [s for s in self.run.stack.services if s.family.kind == "router"]
        prefills = sorted((s for s in workers if s.role == "prefill"), key=lambda s: not self.run.row(s).acted)
        decodes = [s for s in workers if s.role == "decode"]
        if not prefills or not decodes or not routers or not any(self.run.row(s).acted for s in workers):
            return
        data = self.run.stack.hosts[routers[0].host].data
        ok, words = workers[0].family.prove_pd(routers[0].url, [(s.key, s.url) for s in prefills],
                                               [(s.key, s.url) for s in decodes],
                                               str(data.get("served_model_name") or ""))
        self.run.record.pd_proof = words
        say(words)
        if not ok:
            words += self.deaths_of(workers)
            self.run.record.pd_proof = words
            self.run.error = self.run.error or f"host {routers[0].host}, service {routers[0].name}: {words}"
            raise GateFailed(self.run.error)

    def deaths_of(self, services: list[Service]) -> str:
        """"; decode knobkeeper-decode: its log says: VllmWorker-0 died of SIGILL (...)" for each
        service whose own log says one of its processes died (the router's HTTP 500 says only that
        something behind it failed); "" when none did."""
        out = ""
        for svc in services:
            runner, pid = on_host(self.run.state.inventory.get_host(svc.host)), self.run.row(svc).pid
            if svc.family.deaths(own_lines(svc, pid, runner)):
                out += f"; {svc.role} {svc.name}: {log_says(svc, pid, runner)}"
        return out

    def port_free(self, host: Any, plan: HostPlan, svc: Service) -> None:
        """Before a (re)start: nothing but the service itself may hold its port (a stray server would
        answer its health URL while the new process dies on "address already in use"), nor any of its
        family's per-instance ports (vLLM's NIXL side channel: taken, vLLM waits at start-up forever)."""
        lines = on_host(host)(identity_command(svc, plan.ctl, [port for _, port in svc.ports]))
        for name, port in (("", svc.port), *svc.ports):
            ident = parse_identity(lines, port)
            what = f"port {port}" + (f" ({name.replace('_', ' ')})" if name else "")
            if ident.stray and ident.leftover:
                # what a killed run of this very service left: its launch script stops it first
                say(f"{svc.key}: {what} is held by {ident.holder_words()}; the restart stops it")
                continue
            if not ident.stray:
                continue
            row = self.run.row(svc)
            row.gate.result, row.gate.status = "failed", f"{what} taken by {ident.holder_words()}"
            self.run.error = self.run.error or (f"host {svc.host}, service {svc.name}: {what} is taken by "
                                                f"{ident.holder_words()}, not {svc.name}: stop it or move the port; "
                                                f"nothing was restarted")
            raise GateFailed(self.run.error)

    def expected_workers(self) -> int:
        return sum(1 for s in self.run.stack.services if s.family.kind == "worker")


def restore_shell(svc: Service) -> str:
    """Put previous.* back as the launch script / program / unit, and as started.* (what will run)."""
    q = shlex.quote
    return (f"test -f {q(svc.previous_launch_path)} && "
            f"cp -f {q(svc.previous_launch_path)} {q(svc.launch_path)} && "
            f"cp -f {q(svc.previous_launch_path)} {q(svc.started_path)} && "
            f"{{ ! test -f {q(svc.previous_manager_path)} || "
            f"{{ cp -f {q(svc.previous_manager_path)} {q(svc.manager_file)} && "
            f"cp -f {q(svc.previous_manager_path)} {q(svc.started_manager_path)}; }}; }}")


def stop_shell(plan: HostPlan, svc: Service, deploy_id: str, status: str) -> str:
    """Mark the service's failed gate (which deploy, when, the gate's last status) and stop it. A
    program supervisord already gave up on is not running: that is no failure to stop it."""
    q = shlex.quote
    mark = json.dumps({"deploy": deploy_id, "at": iso(utcnow()), "status": " ".join(status.split())})
    write = f"mkdir -p {q(svc.service_dir)} && printf '%s\\n' {q(mark)} > {q(svc.failed_gate_path)}"
    if svc.manager == "supervisord":
        stop = (f"out=$({plan.supervisor.ctl('stop', svc.name)} 2>&1) || "
                f"case \"$out\" in *'not running'*) ;; *) echo \"$out\" >&2; exit 1;; esac")
    else:
        stop = f"systemctl stop {q(svc.name + '.service')}"
    return f"{write} && {{ {stop}; }}"

