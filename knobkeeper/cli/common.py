"""What every command shares: --repo, --json, and turning a UserError into one line and exit 2.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import inspect
import json
import sys
from typing import Any, Callable

import click

from knobkeeper import fmt
from knobkeeper.errors import UserError


class KKGroup(click.Group):
    """A group whose commands print UserError as one line on stderr and exit 2."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # Python decodes argv bytes that are not UTF-8 to lone surrogates, which fail much later
        # (writing a file, a commit message); refuse them here, naming the argument.
        for index, arg in enumerate(args, 1):
            try:
                arg.encode("utf-8")
            except UnicodeEncodeError:
                click.echo(f"error: argument {index} ({fmt.safe(arg.encode('utf-8', 'backslashreplace').decode())}): "
                           f"not valid UTF-8; knobkeeper takes UTF-8 text", err=True)
                ctx.exit(UserError.exit_code)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except UserError as exc:
            click.echo(f"error: {fmt.safe(exc)}", err=True)
            ctx.exit(exc.exit_code)


def repo_option(fn: Callable) -> Callable:
    return click.option(
        "--repo", "repo", default=None, metavar="PATH",
        help="The infra repo (default: the git root above the current directory).",
    )(fn)


def json_option(fn: Callable) -> Callable:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts instead of a table.")(fn)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def console():
    """A rich Console writing to click's stdout (so CliRunner captures it); imported lazily for speed."""
    from rich.console import Console

    stream = sys.stdout  # looked up at call time, so CliRunner captures it
    # Piped or captured output gets a wide fixed width so tables are not cut to 80 columns.
    width = None if stream.isatty() else 200
    return Console(file=stream, soft_wrap=True, highlight=False, width=width)


def warn(text: str) -> None:
    click.echo(f"warning: {text}", err=True)


def example(text: str) -> Callable:
    """Append an 'Example' section to a command's --help (every command has one)."""

    def decorate(fn: Callable) -> Callable:
        # Dedent first: the appended lines have no indent, which would keep the body's.
        doc = inspect.cleandoc(fn.__doc__ or "")
        fn.__doc__ = f"{doc}\n\n\b\nExample:\n  {text}\n"
        return fn

    return decorate


def say_abandoned_experiment(project) -> None:
    """`warning: ab run of K on decode (...) abandoned at T with decode on arm B (K=V); put the stack back
    with `knobkeeper ab abort` ...` on stderr (deploy/experiment_state), when there is one."""
    from knobkeeper.deploy.experiment_state import abandoned_line

    line = abandoned_line(project)
    if line:
        warn(line)
