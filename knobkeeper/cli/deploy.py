"""Deploy commands: `deploy` (pyinfra, ordered and health-gated), `status` (declared vs running) and
`plan` (what a deploy would restart, and why, changing nothing).

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import json

import click

from knobkeeper import fmt
from knobkeeper.cli.common import console, emit_json, example, json_option, repo_option, say_abandoned_experiment
from knobkeeper.deploy.options import DEFAULT_INVENTORY, RESTART_MODES, DeployOptions
from knobkeeper.errors import UserError
from knobkeeper.project import find_project


@click.command("deploy")
@click.argument("inventory", default=DEFAULT_INVENTORY, required=False)
@click.option("--restart", type=click.Choice(RESTART_MODES), default="changed", show_default=True,
              help="changed: services whose files changed or that are down; co: all, in order; none: upload only.")
@click.option("--only", default=None, metavar="ROLE", help="Upload and restart this role only.")
@click.option("--override", "overrides", multiple=True, metavar="WHERE:KNOB=VALUE",
              help="A knob value for this run only, never written to knobs.toml (repeatable); WHERE is a "
                   "role (decode) or one service (HOST/SERVICE, e.g. @local/knobkeeper-decode-2).")
@click.option("--batch", type=click.IntRange(min=1), default=None, metavar="N",
              help="Rolling restart: N hosts of a role at a time, each batch gated (default: the whole role).")
@click.option("--rollback", is_flag=True,
              help="When a gate fails, put the service's previous files back and restart it (the run still fails).")
@click.option("--no-record", is_flag=True, help="Do not commit the deploy record.")
@click.option("--allow-dirty", is_flag=True, help="Deploy uncommitted changes to inventory/ or templates/ (recorded).")
@repo_option
@json_option
@example("knobkeeper deploy inventory/local.py --restart co")
def deploy_cmd(inventory: str, restart: str, only: str | None, overrides: tuple[str, ...], batch: int | None,
               rollback: bool, no_record: bool, allow_dirty: bool, repo: str | None, as_json: bool) -> None:
    """Deploy INVENTORY: upload rendered files, restart in dependency order, gate on health, record."""
    from knobkeeper.deploy.api import run_deploy

    table: dict[str, dict[str, str]] = {}
    for item in overrides:
        role, sep, rest = item.partition(":")
        name, eq, value = rest.partition("=")
        if not sep or not eq or not role or not name:
            raise UserError(f"--override {item!r}: expected ROLE:KNOB=VALUE or HOST/SERVICE:KNOB=VALUE")
        table.setdefault(role, {})[name] = value
    options = DeployOptions(restart=restart, only=only, batch=batch, rollback=rollback, knob_overrides=table or None,
                            record=not no_record, allow_dirty=allow_dirty)
    project = find_project(repo)

    say_abandoned_experiment(project)   # this deploy puts back what it deploys; `ab abort` also keeps the runs
    result = run_deploy(project, inventory, options=options, echo=not as_json)
    if as_json:
        emit_json({"ok": result.ok, "returncode": result.returncode, "error": result.error,
                   "record": result.record.to_json() if result.record else None})
    else:
        click.echo(_summary(result))
    if not result.ok:
        raise SystemExit(1)


def _summary(result) -> str:
    if result.record is None:
        return f"deploy failed before it started: {result.error}"
    lines = [f"deploy {result.record.id}: {result.record.result} in {result.seconds:.1f} s"]
    job = result.record.slurm.job if result.record.slurm else None
    if job is not None:  # a Slurm stack: which job serves, and what it replaced
        gone = [j.id for j in result.record.slurm.replaced if j.cancelled_at]
        lines.append(f"  slurm job {job.id} ({result.record.slurm.decision})"
                     + (f"; cancelled job {', '.join(gone)} after the gates" if gone else "")
                     + (f"; the new job was cancelled ({fmt.safe(job.reason or '')[:80]})" if job.cancelled_at else ""))
    for row in result.record.services:
        where = f" [job {row.job} on {row.node}]" if row.job and row.node else ""
        lines.append(f"  {row.key}{where}: {row.action} ({fmt.safe(row.reason)}); gate {row.gate.result}")
    kube = result.record.kubernetes
    if kube is not None:  # a Kubernetes stack: the revision each workload rolled to
        rolled = [f"{a.service} revision {a.revision_before or '-'} -> {a.revision or '?'}"
                  + (f" (ReplicaSet {a.replica_set})" if a.replica_set else "")
                  for a in kube.applies if a.decision in ("rolls", "created", "co-restart")]
        lines.append(f"  kubernetes namespace {kube.namespace}: " + ("; ".join(rolled) or "nothing rolled")
                     + (" (no nodes: rollouts not observable)" if kube.nodes == 0 else ""))
    if result.error:
        lines.append(f"error: {result.error}")
    return "\n".join(lines)


@click.command("status")
@click.argument("inventory", default=DEFAULT_INVENTORY, required=False)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
              help="Inventory data as the deploy got it with pyinfra --data (JSON values), e.g. engine_args.")
@repo_option
@json_option
@example("knobkeeper status inventory/local.py")
def status_cmd(inventory: str, data: tuple[str, ...], repo: str | None, as_json: bool) -> None:
    """Per host and service: in sync, drifted (which knobs differ) or down."""
    from knobkeeper.deploy.status import stack_status, status_table

    project = find_project(repo)
    rows = stack_status(project, inventory, _data(data))
    _say_abandoned_canary(project)
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    console().print(status_table(rows))


@click.command("plan")
@click.argument("inventory", default=DEFAULT_INVENTORY, required=False)
@click.option("--data", "data", multiple=True, metavar="KEY=VALUE",
              help="Deploy options and inventory data as pyinfra --data (JSON values): restart=co, batch=1, only=ROLE.")
@repo_option
@json_option
@example("knobkeeper plan inventory/example_prod.py --data batch=1")
def plan_cmd(inventory: str, data: tuple[str, ...], repo: str | None, as_json: bool) -> None:
    """The restart plan of a deploy: roles in order, hosts in batches, why each service restarts."""
    from knobkeeper.deploy.plan import plan_text, restart_plan

    project = find_project(repo)
    plan = restart_plan(project, inventory, _data(data))
    _say_abandoned_canary(project)
    if as_json:
        emit_json(plan)
    else:
        click.echo(plan_text(plan))


@click.command("render")
@click.argument("inventory", default=DEFAULT_INVENTORY, required=False)
@click.option("--write", is_flag=True, help="Write the files that differ into the repo (commit them with the change).")
@repo_option
@json_option
@example("knobkeeper render inventory/example_k8s.py --write")
def render_cmd(inventory: str, write: bool, repo: str | None, as_json: bool) -> None:
    """The rendered files INVENTORY keeps in the repo (a Kubernetes stack's manifests, for Argo CD or
    Flux): printed, or with --write written where they belong; `check` fails when the committed ones
    are not what the knobs render."""
    from knobkeeper.deploy import repo_files

    project = find_project(repo)
    files = repo_files.repo_files(project, inventory)
    if not files:
        raise UserError(f"{inventory}: its target keeps no rendered file in the repo (its files go to its hosts: "
                        f"`knobkeeper review` shows them)")
    states = dict(repo_files.stale(project, inventory, files))
    written = repo_files.write(project, inventory) if write else []
    if as_json:
        emit_json({"files": {p: ("written" if p in written else states.get(p, "up to date")) for p in sorted(files)}})
    elif write:
        for path in sorted(files):
            click.echo(f"{path}: {'written (' + states[path] + ')' if path in written else 'up to date'}")
    else:
        click.echo("\n".join(files[p] for p in sorted(files)), nl=False)


def _say_abandoned_canary(project) -> None:
    """`warning: canary X=V on S abandoned at T; put back with ...` on stderr (deploy/canary_state), and
    the same of an abandoned ab run or sweep (deploy/experiment_state)."""
    from knobkeeper.deploy.canary_state import abandoned_line

    line = abandoned_line(project)
    if line:
        click.echo(f"warning: {line}", err=True)
    say_abandoned_experiment(project)


def _data(items: tuple[str, ...]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"--data {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


COMMANDS = [deploy_cmd, status_cmd, plan_cmd, render_cmd]

__all__ = ["COMMANDS"]
