"""Deploy records (changelog/deploys/<stamp>-<id>.json): one per deploy run, committed on its own.

A record says what a run did to every (host, service) and when, so that a restart can serve as a
reference point for later incidents. Its schema is declared once, below (DeployRecord and its rows:
ServiceRow with its Gate and Rollback, SlurmRecord, KubeRecord); reading, writing and validation
are made from that declaration (knobkeeper/declared.py), and so is its JSON Schema
(`knobkeeper schema deploy-record`, docs/schemas/deploy-record.json).

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
from dataclasses import field
from pathlib import Path
from typing import Any, Mapping

from knobkeeper import fmt
from knobkeeper.declared import Declared, declared, extra_field, fact
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


RESULTS = ("running", "ok", "failed", "interrupted")


class _ByField:
    """row["action"] reads row.action, for a declared field only: code written against the record's
    JSON reads the typed rows unchanged, and cannot read a key the declaration does not have."""

    def __getitem__(self, key: str) -> Any:
        if key == "extra" or key not in type(self).__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)


@declared
class Gate(_ByField, Declared):
    """A service's health gate in one run."""

    result: str = fact("not-run", choices=GATES)
    url: str | None = None
    status: str | None = None
    seconds: float | None = None
    checked_at: str | None = None
    extra: dict[str, Any] = extra_field()


@declared
class Rollback(_ByField, Declared):
    """What a rollback after a failed gate did (rollback=true)."""

    result: str = "failed"
    digest: str | None = None
    restart_issued_at: str | None = None
    healthy_at: str | None = None
    status: str | None = None
    extra: dict[str, Any] = extra_field()


@declared
class ServiceRow(_ByField, Declared):
    """What one run did to one (host, service), and when."""

    host: str = fact(required=True)
    service: str = fact(required=True)
    role: str = fact(required=True)
    engine: str = ""  # what the role pins, "vllm 0.32.0" (knobkeeper.engine.role_engine)
    action: str = fact("unchanged", choices=ACTIONS)
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
    extra: dict[str, Any] = extra_field()

    @classmethod
    def older(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """Records of earlier versions: a gate as its result's word, nulls for the empty lists."""
        gate = data.get("gate")
        return {**data, "gate": gate if isinstance(gate, dict) else {"result": str(gate)} if gate else {},
                "rollback": data.get("rollback") if isinstance(data.get("rollback"), dict) else None,
                "changes": data.get("changes") or [], "knobs": data.get("knobs") or {}}

    @property
    def key(self) -> str:
        return f"{self.host}/{self.service}"

    @property
    def acted(self) -> bool:
        return self.action in ("restarted", "started")


@declared
class SlurmJob(_ByField, Declared):
    """One Slurm job a run submitted, kept or cancelled."""

    id: str = fact(required=True)
    state: str | None = None
    digest: str | None = None
    submitted_at: str | None = None
    started_at: str | None = None
    cancelled_at: str | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # service -> node
    reason: str | None = None
    extra: dict[str, Any] = extra_field()


@declared
class SlurmRecord(_ByField, Declared):
    """What a run did with the stack's Slurm jobs."""

    job_name: str = fact(required=True)
    script: str = fact(required=True)
    decision: str = fact("none", choices=("new job", "kept", "none"))
    why: list[str] = field(default_factory=list)
    job: SlurmJob | None = None
    replaced: list[SlurmJob] = field(default_factory=list)
    client_calls: int = 0  # Slurm client calls of the run, and the seconds they took (where deploy time goes)
    client_seconds: float = 0.0
    extra: dict[str, Any] = extra_field()


@declared
class KubeApply(_ByField, Declared):
    """What a run did with one workload of a Kubernetes stack: the apply, the rollout it made, the gate."""

    role: str = fact(required=True)
    service: str = fact(required=True)
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
    extra: dict[str, Any] = extra_field()


@declared
class KubeRecord(_ByField, Declared):
    """What a run did in the stack's namespace."""

    namespace: str = fact(required=True)
    shape: str = "deployments"
    nodes: int | None = None
    applies: list[KubeApply] = field(default_factory=list)
    client_calls: int = 0
    client_seconds: float = 0.0
    extra: dict[str, Any] = extra_field()

    def apply_of(self, service: str) -> KubeApply:
        return next(a for a in self.applies if a.service == service)


@declared
class DeployRecord(Declared):
    """One deploy run: what it did to every (host, service) and when (the module doc says more)."""

    id: str = fact(required=True)
    inventory: str = fact(required=True)
    inventory_path: str = fact(required=True)
    commit: str = fact(required=True)
    dirty: bool = fact(required=True)
    allow_dirty: bool = fact(required=True)
    options: dict[str, Any] = fact(required=True)
    order: list[str] = fact(required=True)
    started_at: str = fact(required=True)
    finished_at: str | None = None
    result: str = fact("running", choices=RESULTS)
    error: str | None = None
    services: list[ServiceRow] = field(default_factory=list)
    engine_versions: dict[str, dict[str, str | None]] = field(default_factory=dict)  # host -> {dist: version}
    stack: str = ""  # the inventory's data `stack` ("" : none); its knobs are knobs.toml's [stack.role]
    slurm: SlurmRecord | None = None
    kubernetes: KubeRecord | None = None
    pd_proof: str | None = None  # per decode instance, what the PD proof saw (vLLM), or None
    extra: dict[str, Any] = extra_field()

    def __post_init__(self) -> None:
        """Rows given as JSON (a caller's dicts) are read as rows."""
        self.services = [ServiceRow.of(r) if isinstance(r, (dict, ServiceRow)) else r for r in self.services]
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

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2) + "\n"


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
    """The record in the file at `path`; ValueError naming the first way it is not one."""
    record, problems = DeployRecord.read(json.loads(plain_file(path).read_text()))
    if problems:
        raise ValueError(problems[0])
    return record


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
