"""Audit commands: incident open/note/resolve/list/show/snapshot, reclaimable, timeline.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import click

from knobkeeper import fmt
from knobkeeper.cli.common import KKGroup, emit_json, example, json_option, repo_option, warn
from knobkeeper.errors import UserError
from knobkeeper.project import find_project


def _incident_lines(incident) -> list[str]:
    """The human text of one incident; titles, notes and causes are shown through fmt.safe."""
    lines = [f"incident {incident.id}: {incident.title}",
             f"   status: {incident.status}",
             f"  started: {incident.started[:19]}Z (when the symptom began)",
             f"   opened: {incident.opened[:19]}Z by {incident.opened_by}"]
    for note in incident.notes:
        judged = "".join(f" [{k} {v}]" for k, v in (("refutes", note.refutes), ("confirms", note.confirms)) if v)
        lines.append(f"     note: {note.time[:19]}Z {note.author}: {note.text}{judged}")
    if incident.resolution:
        res = incident.resolution
        imp = f" [implicates {', '.join(res.implicates)}]" if res.implicates else ""
        lines.append(f" resolved: {res.time[:19]}Z by {res.author}: root cause: {res.root_cause}{imp}")
    return [fmt.safe(line) for line in lines]


def _report(change) -> None:
    click.echo(f"incident {change.incident.id}: {change.action} ({change.incident.status})")
    click.echo(f"commit {change.commit[:10]}" if change.commit else "staged, not committed")
    for text in change.warnings:
        warn(text)


@click.group("incident", cls=KKGroup)
def incident_group() -> None:
    """Incidents: open one, note what is learned, resolve it with a root cause.

    A revert made with --incident ID is a hypothesis; notes refute or confirm it, and the
    resolution decides it (see `knobkeeper reclaimable`).

    \b
    Example:
      knobkeeper incident open "multi-round harness hangs" --started 2026-11-29T17:55Z
    """


@incident_group.command("open")
@click.argument("title")
@click.option("--started", default=None, metavar="TIME", help="When the symptom began (ISO 8601; default: now).")
@click.option("--no-commit", is_flag=True, help="Write and stage the file, but do not commit.")
@repo_option
@json_option
@example('knobkeeper incident open "multi-round harness hangs" --started 2026-11-29T17:55Z')
def open_cmd(title: str, started: str | None, no_commit: bool, repo, as_json: bool) -> None:
    """Open an incident (one file, one commit) and print its id."""
    from knobkeeper.changelog.incidents import open_incident

    change = open_incident(find_project(repo), title, started, no_commit=no_commit)
    if as_json:
        emit_json(change.incident.to_json() | {"commit": change.commit})
        return
    _report(change)
    click.echo(f"next: knobkeeper revert KNOB --role ROLE --reason \"suspect\" --incident {change.incident.id} "
               f"--hypothesis \"the symptom stops\"")


@incident_group.command("note")
@click.argument("incident_id", metavar="ID")
@click.argument("text")
@click.option("--refutes", default=None, metavar="ENTRY", help="A revert made for this incident that the note refutes.")
@click.option("--confirms", default=None, metavar="ENTRY", help="A revert made for this incident that the note confirms.")
@click.option("--no-commit", is_flag=True, help="Write and stage the file, but do not commit.")
@repo_option
@json_option
@example('knobkeeper incident note 9f8e7d6c "hang persisted after the revert" --refutes 1a2b3c4d')
def note_cmd(incident_id: str, text: str, refutes, confirms, no_commit: bool, repo, as_json: bool) -> None:
    """Add a note to an incident; it may refute or confirm a revert made for it."""
    from knobkeeper.changelog.incidents import note_incident

    change = note_incident(find_project(repo), incident_id, text, refutes, confirms, no_commit=no_commit)
    if as_json:
        emit_json(change.incident.to_json() | {"commit": change.commit, "warnings": change.warnings})
        return
    _report(change)


@incident_group.command("resolve")
@click.argument("incident_id", metavar="ID")
@click.option("--root-cause", required=True, help="What caused it.")
@click.option("--implicates", multiple=True, metavar="ENTRY",
              help="A revert made for this incident that was the cause (repeatable); every other revert for it is refuted.")
@click.option("--no-commit", is_flag=True, help="Write and stage the file, but do not commit.")
@repo_option
@json_option
@example('knobkeeper incident resolve 9f8e7d6c --root-cause "faulty client proxy"')
def resolve_cmd(incident_id: str, root_cause: str, implicates: tuple[str, ...], no_commit: bool, repo, as_json: bool) -> None:
    """Resolve an incident once, with its root cause; this decides every revert made for it."""
    from knobkeeper.changelog.incidents import resolve_incident

    change = resolve_incident(find_project(repo), incident_id, root_cause, list(implicates), no_commit=no_commit)
    if as_json:
        emit_json(change.incident.to_json() | {"commit": change.commit, "warnings": change.warnings})
        return
    _report(change)
    click.echo("next: knobkeeper reclaimable")


@incident_group.command("list")
@click.option("--status", "status", type=click.Choice(["open", "resolved", "all"]), default="all", show_default=True,
              help="Only incidents with this status.")
@repo_option
@json_option
@example("knobkeeper incident list --status open")
def list_cmd(status: str, repo, as_json: bool) -> None:
    """Incidents, newest first, with their status and the reverts made for them."""
    from knobkeeper.audit import reverts_by_incident
    from knobkeeper.changelog.incidents import load_incidents

    project = find_project(repo)
    incidents = [i for i in reversed(load_incidents(project)) if status == "all" or i.status == status]
    per = reverts_by_incident(project, incidents)
    if as_json:
        emit_json([i.to_json() | {"reverts": [s.to_json() for s in per.get(i.id, [])]} for i in incidents])
        return
    if not incidents:
        click.echo("no incidents" + ("" if status == "all" else f" {status}"))
        return
    for i in incidents:
        reverts = ", ".join(f"{s.revert.knob} {s.status}" for s in per.get(i.id, [])) or "no reverts"
        cause = f"  root cause: {i.resolution.root_cause}" if i.resolution else ""
        click.echo(fmt.safe(f"{i.id}  {i.status:<8}  {i.opened[:19]}Z  {i.title}  ({reverts}){cause}"))


@incident_group.command("snapshot")
@click.argument("incident_id", metavar="ID")
@click.option("--inventory", default=None, metavar="PATH",
              help="The stack to read (default: the one the incident's last snapshot read, else the one last deployed).")
@click.option("--window", type=float, default=5.0, show_default=True,
              help="Seconds between the two scrapes that give each engine's tokens/s.")
@repo_option
@example("knobkeeper incident snapshot 1a2b3c4d --inventory inventory/local_vllm.py")
def snapshot_cmd(incident_id, inventory, window, repo):
    """Record every service's engine and router gauges now (running, queued, tokens/s, in-flight,
    workers as the router sees them) into the incident: a note plus the full JSON, one commit.
    Refused when there is no stack to read, or when nothing answers in a stack never deployed here."""
    from knobkeeper.audit.snapshot import snapshot_incident

    change = snapshot_incident(find_project(repo), incident_id, inventory, window)
    click.echo(fmt.safe(f"incident {change.incident.id}: {change.incident.notes[-1].text}"))
    click.echo(f"commit {change.commit[:10]}" if change.commit else "staged, not committed")


@incident_group.command("show")
@click.argument("incident_id", metavar="ID")
@repo_option
@json_option
@example("knobkeeper incident show 9f8e7d6c")
def show_cmd(incident_id: str, repo, as_json: bool) -> None:
    """One incident: its notes, its resolution, and the status of each revert made for it."""
    from knobkeeper.audit import reverts_by_incident
    from knobkeeper.changelog.incidents import find_incident

    project = find_project(repo)
    incident = find_incident(project, incident_id)
    statuses = reverts_by_incident(project, [incident])[incident.id]
    if as_json:
        emit_json(incident.to_json() | {"reverts": [s.to_json() for s in statuses]})
        return
    for line in _incident_lines(incident):
        click.echo(line)
    for s in statuses:
        r = s.revert
        click.echo(fmt.safe(f"   revert: {r.id} {r.role}: {r.knob} at {r.time[:19]}Z: {s.status.upper()} ({s.why})"))
        if r.hypothesis:
            click.echo(fmt.safe(f"           hypothesis: {r.hypothesis}"))


@click.command("reclaimable")
@click.option("--stale-days", type=float, default=30, show_default=True, metavar="N",
              help="Evidence older than N days is flagged stale.")
@click.option("--engine-version", default=None, metavar="V",
              help="The engine version now deployed; evidence measured on another is flagged stale "
                   "(default: the engine and version each evidence's inventory pins for its role today).")
@repo_option
@json_option
@example("knobkeeper reclaimable --stale-days 14")
def reclaimable_cmd(stale_days: float, engine_version: str | None, repo, as_json: bool) -> None:
    """Performance removed by reverts that can be taken back: each knob with its evidence per
    concurrency level, the revert's status, and the exact command that restores it."""
    from knobkeeper.audit import format_reclaimable, reclaimable

    if stale_days < 0:
        raise UserError(f"--stale-days {stale_days:g}: expected 0 or more days")
    report = reclaimable(find_project(repo), stale_days, engine_version)
    if as_json:
        emit_json(report.to_json())
        return
    click.echo("\n".join(format_reclaimable(report)))


@click.command("timeline")
@click.option("--since", default=None, metavar="TIME", help="From TIME (default: 7 days ago).")
@click.option("--until", default=None, metavar="TIME", help="Until TIME (default: now).")
@click.option("--around", default=None, metavar="TIME", help="Centre the window on TIME (instead of --since/--until).")
@click.option("--window", "width", default=None, metavar="D", help="With --around: TIME ± D (default 2h).")
@click.option("--lookback", default="72h", show_default=True, metavar="D",
              help="For an open incident: how far before the symptom to look for candidate changes.")
@repo_option
@json_option
@example("knobkeeper timeline --around 2026-11-29T17:55Z --window 6h")
def timeline_cmd(since, until, around, width, lookback: str, repo, as_json: bool) -> None:
    """Knob changes, deploy restarts and incident events in one time-ordered view; for each open
    incident, the changes before its symptom as candidates (coincidence in time is not cause)."""
    from knobkeeper.audit import duration, format_timeline, timeline, window

    lo, hi = window(since, until, around, width)
    tl = timeline(find_project(repo), lo, hi, duration(lookback, "--lookback"))
    if as_json:
        emit_json(tl.to_json())
        return
    click.echo("\n".join(format_timeline(tl)))


COMMANDS = [incident_group, reclaimable_cmd, timeline_cmd]
