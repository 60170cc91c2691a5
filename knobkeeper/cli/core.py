"""Knob commands: knobs, set, unset, revert, restore, record, log, show.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import sys
from typing import Callable

import click

from knobkeeper import fmt
from knobkeeper.cli.common import console, emit_json, example, json_option, repo_option, say_abandoned_experiment, warn
from knobkeeper.errors import UserError
from knobkeeper.knobs.values import scope
from knobkeeper.project import find_project
from knobkeeper.timeutil import parse_time


def commit_options(fn: Callable) -> Callable:
    fn = click.option("--branch", metavar="NAME", default=None,
                      help="Commit on a new branch NAME (for a change-review PR).")(fn)
    fn = click.option("--no-commit", is_flag=True, help="Write and stage the files, but do not commit.")(fn)
    return repo_option(fn)


def stack_option(fn: Callable) -> Callable:
    return click.option("--stack", metavar="NAME", default=None,
                        help="The stack whose role it is, where the repo holds more than one (the inventories' "
                             "data `stack`; default: the stack that names none). Its knobs are [NAME.ROLE] in knobs.toml.")(fn)


def _scope(role: str | None, stack: str | None) -> str | None:
    if role is not None and "." in role:
        raise UserError(f"--role {role!r}: a role name holds no '.'; give the stack with --stack")
    return None if role is None else scope(stack, role)


def _options(no_commit: bool, branch: str | None):
    from knobkeeper.changelog.ops import CommitOptions

    return CommitOptions(no_commit=no_commit, branch=branch)


def _split_assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UserError(f"{text!r}: expected KNOB=VALUE")
    return name.strip(), value


def _report(change, verb: str) -> None:
    from knobkeeper.changelog.entries import shown_old

    if not change.entries:  # nothing declared changed (e.g. a secret's value stored on this machine)
        for text in change.warnings:
            warn(text)
        return
    where = f" on branch {change.branch}" if change.branch else ""
    committed = f"commit {change.commit[:10]}{where}" if change.commit else "staged, not committed"
    for extra in change.entries:
        click.echo(fmt.safe(f"{extra.scope}: {extra.action} {extra.knob}: {shown_old(extra)} -> {fmt.value(extra.new)}")
                   + f"  (entry {extra.id})")
    click.echo(committed)
    for text in change.warnings:
        warn(text)
    if verb:
        click.echo("next: knobkeeper review (the PR body), then pyinfra -y inventory/<env>.py deploy.py")


@click.command("knobs")
@click.option("--role", default=None, help="Only this role.")
@stack_option
@repo_option
@json_option
@example("knobkeeper knobs --role decode")
def knobs_cmd(role: str | None, stack: str | None, repo: str | None, as_json: bool) -> None:
    """Declared knob values, each with the entry that set it and when (role: STACK.ROLE for a named stack)."""
    from knobkeeper.changelog.queries import declared_knobs

    rows = declared_knobs(find_project(repo), _scope(role, stack))
    if as_json:
        emit_json([r.to_json() for r in rows])
        return
    if not rows:
        click.echo("no knobs declared" + (f" for {role}" if role else ""))
        return
    from rich.markup import escape
    from rich.table import Table

    def text(value) -> str:  # from files anyone can edit: no terminal escapes, no rich markup
        return escape(fmt.safe(value))

    table = Table("role", "knob", "value", "entry", "action", "when", "by", box=None)
    for r in rows:
        if r.entry:
            table.add_row(text(r.role), text(r.knob), text(r.shown), text(r.entry.id), text(r.entry.action),
                          text(r.entry.time[:19] + "Z"), text(r.entry.author))
        else:
            table.add_row(text(r.role), text(r.knob), text(r.shown), "-", "[bold]unrecorded[/]", "-", "run `knobkeeper record`")
    console().print(table)


@click.command("set")
@click.argument("assignment", metavar="KNOB=VALUE | KNOB --value-file PATH")
@click.option("--role", required=True, help="The role (inventory group) it applies to.")
@click.option("--reason", required=True, help="Why: kept in the entry and the commit.")
@click.option("--evidence", multiple=True, metavar="ID", help="Evidence id(s) behind the change (repeatable).")
@click.option("--value-file", "value_file", default=None, metavar="PATH",
              help="Read the value from PATH ('-' = stdin), byte for byte (trailing newlines kept). Use it for "
                   "secrets: a value on the command line shows in `ps` and the shell history.")
@click.option("--allow-undeclared", is_flag=True,
              help="Set a knob the pinned engine version does not declare (its catalog source must name a fork, build or PR).")
@stack_option
@commit_options
@example('knobkeeper set SGLANG_SM120_MMA_TARGET_CTAS=512 --role decode --reason "+12.8% @64" --evidence 1a2b3c4d --allow-undeclared\n'
         '  knobkeeper set HF_TOKEN --role decode --reason "gated weights" --value-file - < token.txt\n'
         '  knobkeeper set VLLM_CPU_OMP_THREADS_BIND=auto --stack vllm --role decode --reason "4x tok/s vs 0-1"')
def set_cmd(assignment: str, role: str, reason: str, evidence: tuple[str, ...], value_file, allow_undeclared: bool,
            stack, repo, no_commit, branch) -> None:
    """Declare KNOB=VALUE for a role: one entry, one commit.

    A secret knob's value is kept outside git (.knobkeeper-secrets/), and only its fingerprint in
    knobs.toml and the changelog; give it with --value-file rather than KNOB=VALUE, which other
    users of the machine can read in `ps` and which your shell history keeps. A knob the role's
    pinned engine version does not declare is refused unless its catalog entry names where it
    comes from and --allow-undeclared is given.
    """
    from knobkeeper.changelog.ops import set_knob

    if value_file is not None:
        if "=" in assignment:
            raise UserError(f"{assignment.split('=')[0]}=...: give KNOB alone with --value-file (the value comes from the file)")
        name, value = assignment.strip(), _read_value_file(value_file)
    else:
        name, value = _split_assignment(assignment)
    project = find_project(repo)
    change = set_knob(project, name, value, _scope(role, stack), reason, list(evidence),
                      _options(no_commit, branch), allow_undeclared=allow_undeclared)
    _report(change, "set")
    say_abandoned_experiment(project)


MAX_VALUE_BYTES = 64 * 1024


def _read_value_file(path: str) -> str:
    """The exact text of PATH (or stdin for '-'): UTF-8, at most 64 KiB, nothing stripped."""
    where = "--value-file -" if path == "-" else f"--value-file {path}"
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_VALUE_BYTES + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(MAX_VALUE_BYTES + 1)
    except OSError as exc:
        raise UserError(f"{where}: cannot read it ({exc.strerror})") from None
    if len(data) > MAX_VALUE_BYTES:
        raise UserError(f"{where}: longer than {MAX_VALUE_BYTES // 1024} KiB; a knob value is at most that")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: not UTF-8 text (byte {exc.start}); a knob value is text") from None


@click.command("unset")
@click.argument("knob")
@click.option("--role", required=True, help="The role to remove it from.")
@click.option("--reason", required=True, help="Why.")
@stack_option
@commit_options
@example('knobkeeper unset NCCL_DEBUG --role decode --reason "debug output no longer needed"')
def unset_cmd(knob: str, role: str, reason: str, stack, repo, no_commit, branch) -> None:
    """Remove a knob from a role's declared state (the engine default applies)."""
    from knobkeeper.changelog.ops import unset_knob

    project = find_project(repo)
    _report(unset_knob(project, knob, _scope(role, stack), reason, _options(no_commit, branch)), "unset")
    say_abandoned_experiment(project)


@click.command("revert")
@click.argument("knob")
@click.option("--role", required=True, help="The role.")
@click.option("--reason", required=True, help="Why it is reverted.")
@click.option("--incident", default=None, metavar="ID", help="The incident this revert is a suspect for.")
@click.option("--hypothesis", default=None, help="What the revert is expected to show (e.g. 'the hang stops').")
@stack_option
@commit_options
@example('knobkeeper revert SGLANG_SM120_MMA_TARGET_CTAS --role decode --reason "suspect for the hang" --incident 9f8e7d6c')
def revert_cmd(knob: str, role: str, reason: str, incident, hypothesis, stack, repo, no_commit, branch) -> None:
    """Take back the latest set/restore of a knob; the entry records which one it reverts."""
    from knobkeeper import audit

    project = find_project(repo)
    change = audit.revert(project, knob, _scope(role, stack), reason, incident, hypothesis,
                          _options(no_commit, branch))
    _report(change, "revert")
    say_abandoned_experiment(project)


@click.command("restore")
@click.argument("knob")
@click.option("--role", required=True, help="The role.")
@click.option("--reason", default=None, help="Why (default: names the revert it takes back).")
@click.option("--evidence", multiple=True, metavar="ID", help="More evidence, added to the original entry's.")
@click.option("--force", is_flag=True, help="Restore even though the revert was confirmed as the cause.")
@stack_option
@commit_options
@example("knobkeeper restore SGLANG_SM120_MMA_TARGET_CTAS --role decode")
def restore_cmd(knob: str, role: str, reason, evidence, force: bool, stack, repo, no_commit, branch) -> None:
    """Re-apply the value a revert removed, carrying over the original evidence."""
    from knobkeeper import audit

    project = find_project(repo)
    change = audit.restore(project, knob, _scope(role, stack), reason, list(evidence), force,
                           _options(no_commit, branch))
    _report(change, "restore")
    say_abandoned_experiment(project)


@click.command("record")
@click.option("--reason", required=True, help="Why the hand edits were made.")
@commit_options
@example('knobkeeper record --reason "hot fix applied by hand during incident 9f8e7d6c"')
def record_cmd(reason: str, repo, no_commit, branch) -> None:
    """Record hand edits of knobs.toml as entries, one per changed knob, in one commit."""
    from knobkeeper.changelog.ops import record_edits

    _report(record_edits(find_project(repo), reason, _options(no_commit, branch)), "record")


@click.command("log")
@click.argument("knob", required=False)
@click.option("--role", default=None, help="Only this role.")
@click.option("--since", default=None, metavar="DATE", help="Only entries at or after DATE (ISO 8601).")
@stack_option
@repo_option
@json_option
@example("knobkeeper log SGLANG_SM120_MMA_TARGET_CTAS --role decode --since 2026-11-01")
def log_cmd(knob, role, since, stack, repo, as_json: bool) -> None:
    """The changelog, newest first, with each change's evidence judgement."""
    from knobkeeper.changelog.entries import shown_old
    from knobkeeper.changelog.queries import filter_log

    project = find_project(repo)
    try:
        moment = parse_time(since) if since else None
    except ValueError as exc:
        raise UserError(f"--since: {exc}") from None
    rows = filter_log(project, knob, _scope(role, stack), moment)
    if as_json:
        emit_json([e.to_json() | {"evidence_summary": _evidence_lines(project, e)} for e in rows])
        return
    for e in rows:
        links = "".join(f" {k}={v}" for k, v in (("reverts", e.reverts), ("restores", e.restores), ("incident", e.incident)) if v)
        click.echo(fmt.safe(f"{e.time[:19]}Z {e.id} {e.scope}: {e.action} {e.knob} {shown_old(e)} -> {fmt.value(e.new)}{links}"))
        click.echo(f"    {fmt.safe(e.author)}: {fmt.safe(e.reason)}")
        for line in _evidence_lines(project, e):
            click.echo(f"    evidence {fmt.safe(line)}")


def _evidence_lines(project, entry) -> list[str]:
    if not entry.evidence:
        return []
    from knobkeeper.evidence import store

    lines = []
    for ident in entry.evidence:
        try:
            lines.append(f"{ident}: {store.summary_line(store.load(project, ident))}")
        except UserError as exc:
            lines.append(f"{ident}: unreadable ({exc})")
    return lines


@click.command("show")
@click.argument("entry_id", metavar="ID")
@repo_option
@json_option
@example("knobkeeper show 1a2b3c4d")
def show_cmd(entry_id: str, repo, as_json: bool) -> None:
    """One changelog entry, its links and its evidence judgement."""
    from knobkeeper.changelog.entries import find_entry

    project = find_project(repo)
    entry = find_entry(project, entry_id)
    if as_json:
        emit_json(entry.to_json() | {"evidence_summary": _evidence_lines(project, entry)})
        return
    for key, value in entry.to_json().items():
        if key == "evidence":
            value = ", ".join(value)
        elif key in ("old", "new"):
            value = fmt.value(value)
        click.echo(f"{key:>10}: {fmt.safe(value)}")
    for line in _evidence_lines(project, entry):
        click.echo(f"  evidence {fmt.safe(line)}")


COMMANDS = [knobs_cmd, set_cmd, unset_cmd, revert_cmd, restore_cmd, record_cmd, log_cmd, show_cmd]
