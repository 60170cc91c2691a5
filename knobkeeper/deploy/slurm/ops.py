"""The deploy of a Slurm stack, inside pyinfra: deploy.py calls `run.target_run.operations(plan)`, a
SlurmRun for the login host (deploy/slurm/target.py), instead of the per-host restarts. A job's
environment cannot change (`scontrol update Environment=` is refused), so a change is a new job, and
the old one serves until the new one passed every gate:

    upload        the job script (and secrets, 0600) to {prefix}/slurm/ on the login host
    submit        the stack's jobs by name (squeue): one running the rendered digest -> keep it, submit
                  nothing; else check partition and resources against sinfo, then sbatch (new job)
    gate ROLE     per role in deploy order, each component of the job (new or kept) at the placement
                  it published: health 200 (a router: /readiness and every worker healthy), still the
                  same process after `settle`. A job that ends, is refused by the scheduler (a hopeless
                  pending reason) or stays pending too long fails the gate, naming the job, Slurm's
                  reason and the end of its output; a failed gate cancels the NEW job only
    retire        cancel the jobs the serving one replaced, wait until they have ended

restart=none uploads only; restart=co submits a new job whatever runs; only=ROLE still submits the
whole stack (one job carries every component), with that role's overrides; batch=N does not apply.
"""

from __future__ import annotations

import atexit
import io
import shlex
import time
from typing import Any

from pyinfra import host as current_host
from pyinfra.operations import files, python

from knobkeeper.changelog.secrets import secret_path
from knobkeeper.deploy.health import PROGRESS_EVERY_S, QUIET_S, healthy_now
from knobkeeper.deploy.onhost import GateFailed, on_host, say
from knobkeeper.deploy.record import SlurmJob, SlurmRecord
from knobkeeper.deploy.slurm.client import HOPELESS, Client, Job, SlurmError, no_reason
from knobkeeper.deploy.slurm.decide import decide
from knobkeeper.deploy.slurm.job import Placement, Resources, megabytes, parse_placement, settings_of
from knobkeeper.errors import UserError
from knobkeeper.timeutil import iso, utcnow

POLL_S = 0.1
CANCEL_WAIT_S = 60.0
# A job that ended passes through COMPLETING while slurmd cleans up (seconds); the line waits for
# the state it ends in (FAILED, CANCELLED, ...), up to this long, rather than name the passage.
ENDING_WAIT_S = 10.0


class SlurmRun:
    """The Slurm target's part of one deploy run (SlurmTarget.begin, while deploy.py loads)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.stack = run.stack
        self.settings = settings_of(self.stack)
        if run.options.batch:
            raise UserError(f"--data batch={run.options.batch}: a Slurm stack is one job; batches do not apply "
                            "(the old job serves until the new one passed every gate)")
        key = (self.settings.host, self.settings.job_name)
        self.job = run.rendered[key]
        self.digest = self.job.digest
        self.script = self.job.files[self.settings.script_path]
        self.services = list(self.stack.services)
        self.client: Client | None = None
        self.target: Job | None = None  # the job that serves after this run: new or kept
        self.submitted = False
        self.promoted = False
        self.submitted_mono = 0.0
        self.replaced: list[Job] = []
        self.placements: dict[str, Placement] = {}
        self.record = SlurmRecord(job_name=self.settings.job_name, script=self.settings.script_path)
        run.record.slurm = self.record
        if run.options.restart != "none":
            # While deploy.py loads, before anything is uploaded: bad input is one line and exit 2.
            self.preflight(self._client())
        atexit.register(self.abandon)  # after a failure or an interrupt: a new job never outlives its run

    # --- the operations ------------------------------------------------------------------------------

    def operations(self, plan: Any) -> None:
        s = self.settings
        files.directory(name="knobkeeper: slurm folders", path=s.logs_dir, present=True)
        files.put(name=f"knobkeeper: {s.script_path}", src=io.StringIO(self.script), dest=s.script_path, mode="644",
                  create_remote_dir=True)
        for svc in current_host.loop(self.services):  # each launch script starts with `cd` there
            files.directory(name=f"knobkeeper: {svc.service_dir}", path=svc.service_dir, present=True)
        for svc in current_host.loop(self.services):
            rendered = self.run.rendered[(svc.host, svc.name)]
            for path in current_host.loop(sorted(rendered.secrets)):
                role, knob = rendered.secrets[path]
                files.put(name=f"knobkeeper: secret {knob} of {role}", src=str(secret_path(
                    self.run.project, role, knob, rendered.knobs[knob])), dest=path, mode="600", create_remote_dir=True)
        python.call(name=f"knobkeeper: slurm job {s.job_name}", function=self.submit)
        for role in current_host.loop(self.run.order):
            python.call(name=f"knobkeeper: gate {role} (slurm)", function=self.gate, role=role)
        python.call(name="knobkeeper: slurm: cancel the replaced jobs", function=self.retire)

    def _client(self) -> Client:
        if self.client is None:

            self.client = Client(self.settings, lambda command: on_host()(command))  # the host whose operation runs, at each call
        return self.client

    # --- submit -----------------------------------------------------------------------------------------

    def submit(self) -> None:
        """Keep the job that runs this digest, or submit a new one (decided now, from squeue)."""
        client = self._client()
        options = self.run.options
        try:
            jobs = [j for j in client.jobs() if j.pending or j.state == "RUNNING"]
        except SlurmError as exc:
            self._fail(str(exc))
        d = decide(options.restart, jobs, self.digest, self.services, self.run.rendered, self.script,
                   self.settings.job_name, client.batch_script)
        self.record.decision = {"keep": "kept"}.get(d.action, d.action)
        self.record.why = d.why
        if d.action != "new job":
            self.target, self.replaced = d.keep, d.replace
            if d.keep is not None and d.action == "keep":
                self.record.job = SlurmJob(id=d.keep.id, state=d.keep.state, digest=d.keep.digest,
                                           submitted_at=d.keep.submitted, started_at=d.keep.started)
            for svc in self.services:
                action, reason, _ = d.services[svc.name]
                self._row(svc, action, reason, job=d.keep.id if d.keep else None)
            return
        self.submitted_mono = time.monotonic()
        issued = iso(utcnow())
        try:
            ident = client.submit(self.settings.script_path, self.digest)
        except SlurmError as exc:
            self._fail(str(exc))
        self.submitted = True
        self.target = Job(id=ident, name=self.settings.job_name, digest=self.digest, submitted=issued, started=None)
        self.replaced = d.replace
        self.record.job = SlurmJob(id=ident, state="PENDING", digest=self.digest, submitted_at=issued)
        say(f"submitted job {ident} ({self.settings.job_name}): " + "; ".join(d.why))
        for svc in self.services:
            action, reason, changes = d.services[svc.name]
            row = self._row(svc, action, f"new job {ident}: {reason}", job=ident)
            row.changes, row.restart_issued_at = changes, issued
            row.previous_digest = d.old_digests.get(svc.name)

    def preflight(self, client: Client) -> None:
        """Refuse what no node of the partition can give, naming the field (sinfo), then whatever else
        Slurm would refuse of this very script (`sbatch --test-only`: nothing is submitted)."""
        s = self.settings
        seen: dict[str | None, Any] = {}
        for role in self.run.order:
            res = s.resources.get(role, Resources())
            name = res.partition or s.partition
            if name not in seen:
                seen[name] = client.partition(name)
                if seen[name] is None:
                    field = f"{role}_slurm['partition']" if res.partition else "slurm_partition"
                    known = ", ".join(client.partition_names()) or "none"
                    raise UserError(f"slurm: partition {name!r} is not one slurmctld knows (data {field}; partitions: "
                                    f"{known})" if name else "slurm: the cluster has no default partition (set data "
                                    "slurm_partition)")
            part = seen[name]
            if res.cpus > part.cpus:
                raise UserError(f"slurm: data {role}_slurm['cpus'] = {res.cpus}: no node of partition {part.name} has "
                                f"more than {part.cpus} CPUs")
            mem = megabytes(res.mem)
            if mem and part.memory_mb and mem > part.memory_mb:
                raise UserError(f"slurm: data {role}_slurm['mem'] = {res.mem!r}: no node of partition {part.name} has "
                                f"more than {part.memory_mb} MB")
            if res.gpus and "gpu" not in part.gres:
                raise UserError(f"slurm: data {role}_slurm['gpus'] = {res.gpus}: partition {part.name} has no gpu gres "
                                f"({part.gres})")
        # The script travels as a file, as sbatch will read it: inline in the shell line, a large knob
        # value (its text is in the script up to 3 times) made that line "Argument list too long".

        copy = _put_temp(self.script)
        try:
            client.test(copy, s.script_path)
        finally:
            on_host()(f"rm -f {shlex.quote(copy)}")

    # --- gates -------------------------------------------------------------------------------------------

    def gate(self, role: str) -> None:
        """Every component of `role` healthy where the job placed it (the new job's or the kept one's)."""
        for svc in self.stack.services:
            if svc.role != role:
                continue
            row = self.run.row(svc)
            if self.run.options.restart == "none" or self.target is None:
                row.gate.result = "skipped"
                continue
            started = time.monotonic()
            try:
                placed, status, pid = self._wait(svc, settle=svc.settle if self.submitted else 0.0)
            except _GateError as exc:
                seconds = round(time.monotonic() - started, 3)
                row.gate.result, row.gate.status, row.gate.seconds = "failed", exc.status, seconds
                row.gate.checked_at = iso(utcnow())
                self._fail(f"gate failed: job {self.target.id}, {svc.name} ({role}): {exc}", gate=True)
            row.gate.result, row.gate.status = "passed", status
            row.gate.seconds, row.gate.checked_at = round(time.monotonic() - started, 3), iso(utcnow())
            row.gate.url = placed.health_url
            row.pid, row.node = pid, self.placements[svc.name].node
            if self.record.job is not None:
                self.record.job.nodes[svc.name] = row.node
            if row.acted:
                row.healthy_at = row.gate.checked_at

    def _wait(self, svc: Any, settle: float) -> tuple[Any, str, int | None]:
        client = self._client()
        job = self.target
        deadline = time.monotonic() + svc.health_timeout
        pending_deadline = (self.submitted_mono or time.monotonic()) + self.settings.pending_timeout
        last = "not checked"
        place_path = f"{self.settings.job_dir(job.id)}/{svc.name}.placement"
        began = time.monotonic()
        next_say = began + QUIET_S
        while True:
            now = time.monotonic()
            if now >= next_say:
                say(f"waiting for job {job.id} {svc.name} ({now - began:.0f} s of {svc.health_timeout:g} s): "
                     f"last status {last}")
                next_say = now + PROGRESS_EVERY_S
            state = self._state(client, job)
            if state is None or not (state.pending or state.state == "RUNNING"):
                raise _GateError(self._ended(client, job, state), "job ended")
            if state.pending:
                reason = state.reason
                hopeless = [h for h in HOPELESS if h in reason]
                if state.state == "PENDING" and hopeless:
                    raise _GateError(f"job {job.id} cannot start: pending with reason {reason!r} from Slurm"
                                     + _reason_field(reason, self.settings), f"pending ({reason})")
                if time.monotonic() > pending_deadline:
                    raise _GateError(f"job {job.id} still {state.state} ({reason or 'no reason given'}) after "
                                     f"{self.settings.pending_timeout:g} s (data slurm_pending_timeout)",
                                     f"pending ({reason})")
                last = f"job {state.state.lower()} ({reason})"
            else:
                self._note_start(state)
                placement = self.placements.get(svc.name) or _read_placement(place_path)
                if placement is None:
                    last = "running, not yet placed"
                else:
                    self.placements[svc.name] = placement
                    placed = placement.place(svc)
                    ok, last = healthy_now(placed, self.run.gates.expected_workers())
                    if ok:
                        age = time.time() - (placement.started or time.time())
                        if age < settle:
                            time.sleep(settle - age)
                            again = _read_placement(place_path)
                            still, last = healthy_now(placed, self.run.gates.expected_workers())
                            after = self._state(client, job)
                            if again is None or again.pid != placement.pid:
                                raise _GateError(f"restarted within its settle time ({placement.pid} -> "
                                                 f"{again.pid if again else 'gone'})", "restart loop")
                            if after is None or after.state != "RUNNING":
                                raise _GateError(self._ended(client, job, after), "job ended")
                            if not still:
                                continue
                        return placed, last, placement.pid
            if time.monotonic() >= deadline:
                raise _GateError(f"{last} after {svc.health_timeout:g} s (timeout)", last)
            time.sleep(POLL_S)

    def _state(self, client: Client, job: Job) -> Job | None:
        try:
            return next((j for j in client.jobs() if j.id == job.id), None)
        except SlurmError as exc:
            raise _GateError(str(exc), "slurmctld unreachable") from None

    def _note_start(self, state: Job) -> None:
        if self.record.job is not None and self.record.job.id == state.id:
            self.record.job.state = state.state
            self.record.job.started_at = self.record.job.started_at or state.started

    def _ended(self, client: Client, job: Job, state: Job | None) -> str:
        """One line: the job ended (how, why, from Slurm) and the last lines of its output."""
        rows = client.show(job.id)
        deadline = time.monotonic() + ENDING_WAIT_S
        while rows and rows[0].get("JobState") == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(POLL_S * 5)
            rows = client.show(job.id)
        tail = self._output_tail(job.id)
        return ended_words(job.id, rows, state) + (f"; its output ends: {tail}" if tail else "")

    def _output_tail(self, job_id: str, lines: int = 4) -> str:

        path = self.settings.output_of(job_id)
        out = on_host()(f"tail -n 40 {path} 2>/dev/null || true")
        mine = [line.strip() for line in out if line.strip()]
        told = [line for line in mine if line.startswith("knobkeeper:")]
        return " | ".join((told or mine)[-lines:])

    # --- the end ---------------------------------------------------------------------------------------

    def retire(self) -> None:
        """Cancel the jobs the serving job replaces (every gate passed), and wait until Slurm has them
        cancelled (no longer running: their processes get SIGTERM, then SIGKILL after KillWait; the
        deploy does not wait for them to exit: the new job already serves)."""
        self.promoted = True  # every gate passed: from here on the new job serves, whatever happens
        try:
            self._retire()
        finally:
            self._note_calls()

    def _note_calls(self) -> None:
        if self.client is not None:
            self.record.client_calls = len(self.client.calls)
            self.record.client_seconds = round(sum(seconds for _, seconds in self.client.calls), 3)

    def _retire(self) -> None:
        if self.target is None or not self.replaced:
            return
        client = self._client()
        ids = [j.id for j in self.replaced]
        cancelled = iso(utcnow())
        try:
            client.cancel(ids)
        except SlurmError as exc:
            self._fail(f"the new job {self.target.id} serves, but cancelling {', '.join(ids)} failed: {exc}")
        deadline = time.monotonic() + CANCEL_WAIT_S
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            listed = {j.id: j for j in client.jobs()}
            states = {i: (listed[i].state if i in listed else "gone") for i in ids}
            if not any(i in listed and (listed[i].pending or listed[i].state == "RUNNING") for i in ids):
                break
            time.sleep(POLL_S)
        for job in self.replaced:
            self.record.replaced.append(SlurmJob(id=job.id, state=states.get(job.id), digest=job.digest,
                                                 submitted_at=job.submitted, started_at=job.started,
                                                 cancelled_at=cancelled))

    def abandon(self) -> None:
        """At exit: a new job whose run did not get past its gates is cancelled (the old one serves)."""
        if self.submitted and not self.promoted:
            self._cancel_new("the run stopped before every gate passed")

    def _cancel_new(self, why: str) -> None:
        job = self.target
        if job is None or not self.submitted or (self.record.job and self.record.job.cancelled_at):
            return
        try:
            self._client().cancel([job.id])
        except SlurmError:
            pass
        if self.record.job is not None:
            self.record.job.cancelled_at, self.record.job.reason = iso(utcnow()), why

    def _fail(self, error: str, gate: bool = False) -> None:

        self._note_calls()
        if self.submitted and not self.promoted:
            self._cancel_new(error)
            error += f"; cancelled the new job {self.target.id}" + (
                f", job {', '.join(j.id for j in self.replaced)} still serves" if self.replaced else "")
        self.run.error = self.run.error or error
        raise GateFailed(error) if gate else UserError(error)

    def _row(self, svc: Any, action: str, reason: str, job: str | None = None):
        row = self.run.row(svc)
        row.action, row.reason, row.job = action, reason, job
        return row


def ended_words(job_id: str, rows: list[dict[str, str]], state: Job | None) -> str:
    """How a job ended, "job 12 ended FAILED (reason NonZeroExitCode, exit 1:0)", from `scontrol show
    job` (Client.show's rows; squeue's view when scontrol no longer knows the job). A cancelled job's
    Reason is "None" (scontrol's word for none), which is no reason."""
    lead = rows[0] if rows else {}
    how = lead.get("JobState") or (state.state if state else None) or "gone"
    reason = no_reason(lead.get("Reason")) or (state.reason if state else "")
    code = lead.get("ExitCode")
    said = ([f"reason {reason}"] if reason else []) + ([f"exit {code}"] if code else [])
    return f"job {job_id} ended {how}" + (f" ({', '.join(said)})" if said else "")


class _GateError(Exception):
    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


def _put_temp(text: str) -> str:
    """`text` in a new temporary file on the login host (through pyinfra's connector: a copy on this
    machine, SFTP over SSH), and its path there."""
    path = current_host.get_temp_filename()
    if not current_host.put_file(io.BytesIO(text.encode()), path):
        raise SlurmError(f"slurm: cannot write a temporary copy of the job script to {path} on {current_host.name}")
    return path


def _read_placement(path: str) -> Placement | None:

    lines = on_host()(f"cat {path} 2>/dev/null || true")
    return parse_placement(" ".join(lines)) if lines else None


def _reason_field(reason: str, settings: Any) -> str:
    low = reason.lower()
    if "account" in low:
        return f" (data slurm_account = {settings.account!r})"
    if "partition" in low:
        return " (data slurm_partition or <role>_slurm: the partition refuses what the job asks)"
    if "qos" in low:
        return " (data slurm_qos)"
    if "constraint" in low:
        return " (data <role>_slurm['constraint'])"
    return ""
