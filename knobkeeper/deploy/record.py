"""Deploy records (changelog/deploys/<stamp>-<id>.json): one per deploy run, committed on its own.

A record says what a run did to every (host, service) and when, so that a restart can serve as a
reference point for later incidents:

    {"id", "inventory", "inventory_path", "stack" ("" when the inventory names none), "commit", "dirty", "allow_dirty", "options",
     "order", "started_at", "finished_at", "result": "ok" | "failed", "error",
     "engine_versions": {host: {distribution: installed version}} (hosts with a pinned engine venv),
     "pd_proof": what the PD proof saw, per decode instance, after a run that restarted a vLLM worker, or null,
     "services": [{"host", "service", "role", "engine" (e.g. "vllm 0.32.0"), "action": "restarted" | "started" | "unchanged",
                   "reason", "changes": [what changed, in words], "digest", "previous_digest",
                   "knobs", "restart_issued_at", "batch", "rollback": {...} | null,
                   "healthy_at", "pid", "gate": {"result": "passed" | "failed" | "skipped" | "not-run",
                   "url", "status", "seconds", "checked_at"}, "stopped_at" (when the run stopped it
                   after the gate of the process it started failed, else null), "job", "node"}],
     "slurm": null | {"job_name", "script", "decision": "new job" | "kept" | "none", "why",
                      "job": {"id", "state", "digest", "submitted_at", "started_at", "cancelled_at",
                              "nodes": {service: node}, "reason"},
                      "replaced": [the jobs it cancelled after the gates, same shape],
                      "client_calls", "client_seconds"},
     "kubernetes": null | {"namespace", "shape", "nodes", "client_calls", "client_seconds",
                           "applies": [{"role", "service", "kind", "decision", "generation_before", "generation",
                                        "revision_before", "revision", "replica_set", "applied_at", "observed_at",
                                        "rollout", "rolled_back_to"}]}}

A Slurm stack (knobkeeper/deploy/slurm/) runs as one job: each service row is one of its components
(`job`, `node`: where it ran; restart_issued_at: when the job was submitted), `slurm` says which
job serves and which it replaced.

record=false keeps the record out of git: it is written under .knobkeeper-state/deploys/ instead,
so a caller (the A/B harness) still gets its timings.

A record survives a kill: the run writes it, as far as it got, to a journal
(.git/knobkeeper/deploys-running/<id>.json) before each restart it issues and after each gate, and
drops the journal once the record is saved. A deploy process that dies (SIGKILL, a reboot) leaves
its journal; the next deploy, and every reader of the records, completes it first
(`recover_interrupted`): result "interrupted", error "interrupted after restarting prefill at T",
saved where the run would have saved it. It runs only while no deploy holds the deploy lock, so a
live run's journal is never taken for a dead one's.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from knobkeeper import fmt
from knobkeeper.changelog.filecache import plain_file, refusal
from knobkeeper.changelog.store import Message, commit_change
from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write, lock_file, LOOK_GRACE_S, unlock_file
from knobkeeper.project import Project
from knobkeeper.timeutil import file_stem, iso, parse_time, utcnow

ACTIONS = ("restarted", "started", "unchanged")
JOURNAL = "deploys-running"
# "unobservable": a Kubernetes role was applied and its controller made the new ReplicaSet, but no pod
# can run (the cluster has no nodes): the gate says so instead of passing.
GATES = ("passed", "failed", "skipped", "not-run", "unobservable")


def _known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


class _ByField:
    """row["action"] reads row.action: the JSON field names are the attribute names, so code written
    against the record's JSON reads the typed rows unchanged."""

    def __getitem__(self, key: str) -> Any:
        if key not in {f.name for f in fields(self)}:  # type: ignore[arg-type]
            raise KeyError(key)
        return getattr(self, key)


@dataclass
class Gate(_ByField):
    """A service's health gate in one run."""

    result: str = "not-run"  # one of GATES
    url: str | None = None
    status: str | None = None
    seconds: float | None = None
    checked_at: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> "Gate":
        return cls(**_known(cls, data)) if isinstance(data, dict) else cls(result=str(data))


@dataclass
class Rollback(_ByField):
    """What a rollback after a failed gate did (rollback=true)."""

    result: str = "failed"
    digest: str | None = None
    restart_issued_at: str | None = None
    healthy_at: str | None = None
    status: str | None = None


@dataclass
class ServiceRow(_ByField):
    """What one run did to one (host, service), and when."""

    host: str
    service: str
    role: str
    engine: str = ""  # what the role pins, "vllm 0.32.0" (knobkeeper.engine.role_engine)
    action: str = "unchanged"  # one of ACTIONS
    reason: str = ""
    changes: list[str] = field(default_factory=list)  # what changed, in words (files-changed restarts)
    digest: str = ""
    previous_digest: str | None = None
    knobs: dict[str, str] = field(default_factory=dict)
    restart_issued_at: str | None = None
    healthy_at: str | None = None
    pid: int | None = None
    batch: int = 1
    rollback: Rollback | None = None
    gate: Gate = field(default_factory=Gate)
    stopped_at: str | None = None  # the run stopped it: the gate of the process it started failed
    job: str | None = None  # Slurm: the job the component ran in, and the node it got
    node: str | None = None

    @property
    def key(self) -> str:
        return f"{self.host}/{self.service}"

    @property
    def acted(self) -> bool:
        return self.action in ("restarted", "started")

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ServiceRow":
        known = _known(cls, data)
        known["gate"] = Gate.from_json(data.get("gate") or {})
        rollback = data.get("rollback")
        known["rollback"] = Rollback(**_known(Rollback, rollback)) if isinstance(rollback, dict) else None
        known["changes"] = list(data.get("changes") or [])
        known["knobs"] = dict(data.get("knobs") or {})
        return cls(**known)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SlurmJob(_ByField):
    """One Slurm job a run submitted, kept or cancelled."""

    id: str
    state: str | None = None
    digest: str | None = None
    submitted_at: str | None = None
    started_at: str | None = None
    cancelled_at: str | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # service -> node
    reason: str | None = None


@dataclass
class SlurmRecord(_ByField):
    """What a run did with the stack's Slurm jobs."""

    job_name: str
    script: str
    decision: str = "none"  # "new job" | "kept" | "none"
    why: list[str] = field(default_factory=list)
    job: SlurmJob | None = None
    replaced: list[SlurmJob] = field(default_factory=list)
    client_calls: int = 0  # Slurm client calls of the run, and the seconds they took (where deploy time goes)
    client_seconds: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SlurmRecord":
        known = _known(cls, data)
        known["job"] = SlurmJob(**_known(SlurmJob, data["job"])) if isinstance(data.get("job"), dict) else None
        known["replaced"] = [SlurmJob(**_known(SlurmJob, j)) for j in data.get("replaced") or [] if isinstance(j, dict)]
        return cls(**known)


@dataclass
class KubeApply(_ByField):
    """What a run did with one workload of a Kubernetes stack: the apply, the rollout it made, the gate."""

    role: str
    service: str
    kind: str = "Deployment"
    decision: str = "not run"  # "rolls" | "created" | "unchanged" | "co-restart" | "not run"
    generation_before: int | None = None
    generation: int | None = None
    revision_before: int | None = None
    revision: int | None = None  # deployment.kubernetes.io/revision after the apply
    replica_set: str | None = None  # the ReplicaSet of that revision (its pod-template-hash in its name)
    applied_at: str | None = None
    observed_at: str | None = None  # the controller's observedGeneration reached the applied generation
    rollout: str = "not run"  # "complete" | "not observable: no nodes" | "failed: ..." | "not run"
    rolled_back_to: int | None = None  # the revision `rollout undo` went back to (rollback=true)


@dataclass
class KubeRecord(_ByField):
    """What a run did in the stack's namespace."""

    namespace: str
    shape: str = "deployments"
    nodes: int | None = None
    applies: list[KubeApply] = field(default_factory=list)
    client_calls: int = 0
    client_seconds: float = 0.0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "KubeRecord":
        known = _known(cls, data)
        known["applies"] = [KubeApply(**_known(KubeApply, a)) for a in data.get("applies") or [] if isinstance(a, dict)]
        return cls(**known)

    def apply_of(self, service: str) -> KubeApply:
        return next(a for a in self.applies if a.service == service)


@dataclass
class DeployRecord:
    id: str
    inventory: str
    inventory_path: str
    commit: str
    dirty: bool
    allow_dirty: bool
    options: dict[str, Any]
    order: list[str]
    started_at: str
    finished_at: str | None = None
    result: str = "running"
    error: str | None = None
    services: list[ServiceRow] = field(default_factory=list)
    engine_versions: dict[str, dict[str, str | None]] = field(default_factory=dict)  # host -> {dist: version}
    stack: str = ""  # the inventory's data `stack` ("" : none); its knobs are knobs.toml's [stack.role]
    slurm: SlurmRecord | None = None
    kubernetes: KubeRecord | None = None
    pd_proof: str | None = None  # per decode instance, what the PD proof saw (vLLM), or None

    def __post_init__(self) -> None:
        self.services = [r if isinstance(r, ServiceRow) else ServiceRow.from_json(r) for r in self.services]
        if isinstance(self.slurm, dict):
            self.slurm = SlurmRecord.from_json(self.slurm)
        if isinstance(self.kubernetes, dict):
            self.kubernetes = KubeRecord.from_json(self.kubernetes)

    @property
    def stem(self) -> str:
        return file_stem(parse_time(self.started_at), self.id)

    def service(self, host: str, name: str) -> ServiceRow:
        for row in self.services:
            if row.host == host and row.service == name:
                return row
        raise KeyError((host, name))

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["services"] = [r.to_json() for r in self.services]
        out["slurm"] = asdict(self.slurm) if self.slurm is not None else None
        out["kubernetes"] = asdict(self.kubernetes) if self.kubernetes is not None else None
        return out

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DeployRecord":
        return cls(**_known(cls, data))


def record_path(project: Project, record: DeployRecord, committed: bool) -> Path:
    folder = project.deploys_dir if committed else project.state_dir / "deploys"
    return folder / f"{record.stem}.json"


def message(record: DeployRecord) -> Message:
    acted = [r.key for r in record.services if r.acted]
    what = ", ".join(acted) if acted else "nothing restarted"
    canary = (record.options or {}).get("canary") or {}
    # A canary's deploys say which phase they are, so `git log` reads candidate -> rollback/promote.
    phase = (f" (canary {canary['phase']} {canary.get('knob')}={fmt.value(canary.get('value'))})"
             if canary.get("phase") else "")
    summary = f"deploy {record.inventory}{phase}: {what} ({record.result})"
    body = f"Deploy {record.id} of {record.inventory_path} at {record.commit}"
    if record.dirty:
        body += " with uncommitted changes (allow_dirty=true)"
    if record.error:
        body += f"\n\n{record.error}"
    trailers = [("Deploy", record.id), ("Inventory", record.inventory), ("Result", record.result)]
    trailers += [("Canary", str(canary["phase"]))] if phase else []
    if record.slurm is not None and record.slurm.job is not None:
        body += f"\n\nSlurm job {record.slurm.job.id} ({record.slurm.decision})" + "".join(
            f", cancelled job {j.id}" for j in record.slurm.replaced if j.cancelled_at)
        trailers += [("Slurm-Job", record.slurm.job.id)]
    if record.kubernetes is not None:
        rolled = [f"{a.service} revision {a.revision}" for a in record.kubernetes.applies if a.decision in ("rolls", "created", "co-restart")]
        body += f"\n\nKubernetes namespace {record.kubernetes.namespace}: " + (", ".join(rolled) or "nothing rolled")
    trailers += [("Restarted" if r.action == "restarted" else "Started", r.key) for r in record.services if r.acted]
    return Message(summary=summary, body=body, trailers=trailers)


def save(project: Project, record: DeployRecord, commit: bool) -> Path:
    """Commit the record (one commit holding just this file), or write it to the state dir."""
    path = record_path(project, record, committed=commit)
    if commit:
        commit_change(project, {path: record.text()}, message(record))
    else:
        atomic_write(path, record.text())
    return path


def read_record(path: Path) -> DeployRecord:
    return DeployRecord.from_json(json.loads(plain_file(path).read_text()))


def find_record(project: Project, deploy_id: str) -> DeployRecord | None:
    for folder in (project.deploys_dir, project.state_dir / "deploys"):
        for path in sorted(folder.glob(f"*-{deploy_id}.json")) if folder.is_dir() else []:
            if not refusal(path, project.root):
                return read_record(path)
    return None


# How a deploy that found the deploy lock held fails (operations.DeployRun; the canary waits and retries on it).
DEPLOY_BUSY = "another deploy of this repo is running"


def deploy_lock(project: Project) -> Path:
    """The lock every deploy run holds from its start to its record (deploy/operations.py)."""
    return project.state_dir / "deploy.lock"


def take_deploy_lock(project: Project):
    """The deploy lock for a run (an open handle), or UserError(DEPLOY_BUSY ...) while another deploy
    holds it. Others take it for an instant only to look (a canary waiting for it to be free,
    `recover_interrupted` asking whether a journal's run is alive): the run waits out such a look
    (fsio.LOOK_GRACE_S) instead of failing "another deploy of this repo is running" on it."""
    lock = deploy_lock(project)
    return lock_file(lock, wait=LOOK_GRACE_S, busy=f"{DEPLOY_BUSY} (lock {lock})")


def journal_path(project: Project, deploy_id: str) -> Path:
    return project.private_dir / JOURNAL / f"{deploy_id}.json"


def write_journal(project: Project, record: DeployRecord, commit: bool) -> None:
    """The run's record as far as it got, where the next command finds it if this process dies."""
    atomic_write(journal_path(project, record.id),
                 json.dumps({"commit": commit, "pid": os.getpid(), "record": record.to_json()}))


def drop_journal(project: Project, deploy_id: str) -> None:
    journal_path(project, deploy_id).unlink(missing_ok=True)


def interrupted_error(record: DeployRecord) -> str:
    """`interrupted after restarting prefill at T` (the roles whose restart was issued, the last time),
    or `interrupted before restarting anything`."""
    issued = [r for r in record.services if r.restart_issued_at]
    if not issued:
        return "interrupted before restarting anything (the deploy process died)"
    last = max(r.restart_issued_at for r in issued if r.restart_issued_at)
    roles = list(dict.fromkeys(r.role for r in sorted(issued, key=lambda r: r.restart_issued_at or "")))
    unhealthy = [r.key for r in issued if not r.healthy_at]
    tail = f"; not seen healthy since: {', '.join(unhealthy)}" if unhealthy else ""
    return (f"interrupted after restarting {', '.join(roles)} at {last} (the deploy process died{tail}; "
            f"see `knobkeeper status`)")


def recover_interrupted(project: Project, locked: bool = False) -> list[DeployRecord]:
    """Complete and save the record of every deploy whose process died (see the module doc); the
    records it saved. `locked`: the caller holds the deploy lock; otherwise it is tried without
    waiting, and nothing is done while a deploy is running."""
    folder = project.private_dir / JOURNAL
    if not folder.is_dir() or not any(folder.glob("*.json")):
        return []
    handle = None
    if not locked:
        try:
            handle = lock_file(deploy_lock(project), wait=False)
        except UserError:
            return []   # a deploy is running: its journal is alive
    saved = []
    try:
        for path in sorted(folder.glob("*.json")):
            try:
                data = json.loads(path.read_text())
                record = DeployRecord.from_json(data["record"])
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)   # torn while written: the run had not restarted anything yet
                continue
            if find_record(project, record.id) is None:
                record.result, record.error = "interrupted", interrupted_error(record)
                record.finished_at = record.finished_at or iso(utcnow())
                try:
                    save(project, record, commit=bool(data.get("commit", True)))
                except UserError:
                    continue   # cannot commit here (a detached HEAD, a merge): kept for a later command
                saved.append(record)
            path.unlink(missing_ok=True)
    finally:
        if handle is not None:
            unlock_file(handle)
    return saved


def load_records(project: Project, problems: list[str] | None = None) -> list[DeployRecord]:
    """Committed records, oldest first, as typed rows (a dead deploy's completed first). A file that
    does not read as a record is left out and named in `problems` (when given)."""
    recover_interrupted(project)
    folder = project.deploys_dir
    if not folder.is_dir():
        return []
    out = []
    for path in sorted(folder.glob("*.json")):
        if path.name.startswith(".") or refusal(path, project.root):
            continue   # a link is no record (check and report name it: filecache.refused_files)
        try:
            out.append(read_record(path))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            if problems is not None:
                problems.append(f"{project.rel(path)}: not a deploy record ({exc})")
    return out
