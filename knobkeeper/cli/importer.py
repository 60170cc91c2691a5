"""`knobkeeper import srtctl RECIPE`: an srt-slurm recipe as a Slurm inventory plus knobs.toml.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import click

from knobkeeper.cli.common import KKGroup, emit_json, example, json_option, repo_option
from knobkeeper.project import find_project


@click.group("import", cls=KKGroup)
def import_group() -> None:
    """Import a stack described by another tool.

    \b
    Example:
      knobkeeper import srtctl recipes/gb200-fp4/1k1k/low-latency.yaml --router sglang-router
    """


@import_group.command("srtctl")
@click.argument("recipe", type=click.Path(dir_okay=False))
@click.option("--name", default=None, help="Job and inventory name (default: the recipe's name).")
@click.option("--router", type=click.Choice(["sglang-router", "smg"]), default=None,
              help="The router that replaces a Dynamo frontend (required for those recipes).")
@click.option("--srtslurm", default=None, type=click.Path(dir_okay=False),
              help="The cluster's srtslurm.yaml: resolves model and container aliases, default account etc.")
@click.option("--sglang-version", default=None, help="The sglang version the container runs (pins its parser for `check`).")
@click.option("--prefix", default=None, help="Where on the shared filesystem the job's files go "
              "(default: <repo>/.knobkeeper-state/<name>).")
@click.option("--login", default="@local", show_default=True, help="The pyinfra host that submits the job.")
@click.option("--no-commit", is_flag=True, help="Write the files, do not commit them.")
@repo_option
@json_option
@example("knobkeeper import srtctl 1p1d.yaml --srtslurm srtslurm.yaml --router sglang-router --sglang-version 0.5.23")
def srtctl_cmd(recipe, name, router, srtslurm, sglang_version, prefix, login, no_commit, repo, as_json) -> None:
    """Write inventory/<name>.py (a Slurm stack) and the recipe's knobs (one entry each) in one commit;
    exit 2, naming the field, on anything that does not map."""
    from knobkeeper.changelog.ops import import_srtctl

    done = import_srtctl(find_project(repo), recipe, name=name, router=router, srtslurm=srtslurm,
                         sglang_version=sglang_version, prefix=prefix, login=login, commit=not no_commit)
    if as_json:
        emit_json({"inventory": done.inventory, "knobs": done.knobs, "notes": done.notes, "commit": done.commit})
        return
    click.echo(f"{done.inventory}: Slurm job {done.name}, {len(done.knobs)} knobs declared"
               + (f" (commit {done.commit[:10]})" if done.commit else " (not committed)"))
    for role, knob, value in done.knobs:
        click.echo(f"  [{role}] {knob} = {value}")
    for note in done.notes:
        click.echo(f"note: {note}")
    click.echo(f"next: knobkeeper plan {done.inventory}, then knobkeeper deploy {done.inventory}")
