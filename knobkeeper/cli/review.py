"""Review commands: review (the body of a change-review PR) and check (the CI / pre-commit gate).

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from knobkeeper.cli.common import emit_json, example, json_option, repo_option
from knobkeeper.project import find_project


@click.command("review")
@click.option("--base", metavar="REF", default=None,
              help="Compare from REF (default: the merge-base of HEAD with origin/main or main).")
@click.option("--head", metavar="REF", default=None, help="Compare to REF (default: HEAD).")
@click.option("--output", "-o", metavar="FILE", default=None, help="Write the Markdown to FILE instead of stdout.")
@click.option("--gh", "gh", is_flag=True,
              help="Also print the `gh pr create` command that uses the body file (default file: .git/knobkeeper/review.md).")
@repo_option
@example("knobkeeper review --base main --output pr.md --gh")
def review(base: str | None, head: str | None, output: str | None, gh: bool, repo: str | None) -> None:
    """Write the body of a change-review PR for the commits base..head.

    Knob changes (the changelog entries added in the range), their evidence, reverts with their
    incident and status, the rendered diff of every service file that changes (rendered at base and
    head by the deploy's own render), the restart plan in dependency order with what changed for
    each restart, and warnings. A --base that is not an ancestor of --head is compared from their
    merge-base, and the body says so.
    """
    from knobkeeper import review

    project = find_project(repo)
    data = review.collect(project, base, head)
    body = review.to_markdown(data)
    if gh and output is None:
        output = str(project.private_dir / "review.md")
    if output:
        path = Path(output)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)
        click.echo(f"wrote {output}: {review.summary_line(data)}", err=gh)
    else:
        click.echo(body, nl=False)
    if gh:
        base_branch = base if base and "/" not in base and not _is_sha(base) else "main"
        click.echo(review.gh_command(output, data, base_branch))


def _is_sha(text: str) -> bool:
    return len(text) >= 7 and all(c in "0123456789abcdef" for c in text.lower())


@click.command("check")
@click.option("--base", metavar="REF", default=None,
              help="Also check that no entry committed at REF was modified or deleted since.")
@repo_option
@json_option
@example("knobkeeper check --base origin/main")
def check(base: str | None, repo: str | None, as_json: bool) -> None:
    """The CI / pre-commit gate: exit 1 with one line per problem (file, what, how to fix).

    Checks: knobs.toml matches what the changelog explains (no hand edit without `record`); values
    obey the catalog, and a secret knob holds only its fingerprint (a pasted value is named, never
    shown); knob names are shell variable names; nothing under .knobkeeper-secrets/ is tracked by
    git; entries name existing evidence and incidents; evidence files pass their schema and their
    judgements follow from their runs; every template renders for every host of every inventory;
    rendered launch scripts pass `bash -n` and shellcheck, units pass `systemd-analyze verify`,
    supervisord sections parse. A linter that is not installed is skipped and said so. A change
    that failed before its commit (a full disk, a killed process) is rolled back first, and said.
    """
    from knobkeeper import review

    result = review.check(find_project(repo), base)
    if as_json:
        emit_json({"ok": result.ok, "problems": [p.__dict__ | {"line": p.line()} for p in result.problems],
                   "ran": result.ran, "skipped": result.skipped, "warnings": result.warnings, "counts": result.counts})
    else:
        for problem in result.problems:
            click.echo(problem.line())
        for line in result.warnings:
            click.echo(f"warning: {line}", err=True)
        if result.ok:
            click.echo(result.summary())
        else:
            click.echo(f"check: {len(result.problems)} problem{'s' if len(result.problems) != 1 else ''}"
                       + (f" (skipped: {', '.join(result.skipped)})" if result.skipped else ""), err=True)
    if not result.ok:
        sys.exit(1)




@click.command("schema")
@click.argument("name", required=False)
@click.option("--write", "write", metavar="DIR", default=None,
              help="Write every record's schema to DIR/<name>.json instead (the repo keeps them in docs/schemas/).")
@example("knobkeeper schema evidence > evidence.schema.json")
def schema(name: str | None, write: str | None) -> None:
    """Print the JSON Schema of a record knobkeeper writes: evidence, deploy-record, canary-marker,
    experiment-marker or sweep-plan (no NAME: list them).

    Each schema is made from the record's one declaration, the same one `check`, `ab import` and
    every reader validate with, so it says exactly what the tool accepts.
    """
    from knobkeeper.review import schemas

    if write:
        for path in schemas.write_files(Path(write)):
            click.echo(f"wrote {path}")
        return
    if name is None:
        for known, (where, _) in schemas.RECORDS.items():
            click.echo(f"{known:<18} {where}")
        return
    click.echo(schemas.schema_text(name), nl=False)


COMMANDS = [review, check, schema]
