"""`knobkeeper report`: the changelog as one self-contained HTML page.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import click

from knobkeeper.cli.common import example, repo_option
from knobkeeper.project import find_project


@click.command("report")
@click.option("-o", "--output", default=None, metavar="PATH",
              help="Where to write the HTML (default: .knobkeeper-state/knobkeeper-report.html in the repo, git-ignored).")
@click.option("--since", default=None, metavar="DATE", help="Draw the timeline from DATE (ISO 8601; default: all history).")
@click.option("--role", default=None, metavar="R", help="Only this role's knobs, deploys, reverts and evidence.")
@click.option("--status-json", default=None, metavar="FILE",
              help="The output of `knobkeeper status --json`, for the running state of each service.")
@click.option("--open", "open_it", is_flag=True, help="Open the written page in the default browser.")
@repo_option
@example("knobkeeper report -o report.html --since 2026-11-01 --open")
def report_cmd(output, since, role, status_json, open_it: bool, repo) -> None:
    """One HTML page (inline CSS and SVG, no network): knobs now, the timeline drawn, evidence plots, knobs over time."""
    from knobkeeper.report import write_report

    written = write_report(find_project(repo), output, since, role, status_json)
    click.echo(f"report: {written.path} ({written.size / 1024:.0f} KiB, {written.events} timeline events)")
    if open_it:
        click.launch(written.path.as_uri())

