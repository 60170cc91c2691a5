"""`knobkeeper sweep`: many values of a knob against the one the stack runs; the plan, the pick, its evidence.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import sys

import click

from knobkeeper.cli.ab import _levels as levels
from knobkeeper.cli.common import emit_json, example, json_option, repo_option
from knobkeeper.deploy.options import DEFAULT_INVENTORY
from knobkeeper.errors import UserError
from knobkeeper.evidence import defaults
from knobkeeper.project import find_project


def _levels(text: str) -> list[int]:
    return levels(text)


@click.command("sweep")
@click.argument("specs", nargs=-1, metavar="KNOB=V1,V2,... [KNOB2=...]")
@click.option("--role", required=True, help="The role whose knob is swept (only it restarts), e.g. decode.")
@click.option("--inventory", default=DEFAULT_INVENTORY, show_default=True, help="The inventory to deploy.")
@click.option("--stack", "stack_name", default=None,
              help="The stack the inventory must be (a repo with several: the knob is its [stack.role]'s).")
@click.option("--plan", "plan_only", is_flag=True,
              help="Print the plan and its budget (blocks per arm, minutes) from this stack's noise; run nothing.")
@click.option("--apply", "apply", is_flag=True,
              help="Make the pick one `set` commit with the sweep's evidence (without it the command is printed).")
@click.option("--concurrency", "levels", default="64,80,96", show_default=True, help="Levels, comma-separated.")
@click.option("--max-repeats", type=int, default=None,
              help="Blocks per arm at most (the budget; default: the sequential design's cap for delta at this "
                   "noise, 10 on a real engine).")
@click.option("--minutes", type=float, default=None,
              help="Wall-time budget: the search stops before a block that would not fit.")
@click.option("--delta", type=float, default=None,
              help="The indifference margin, the smallest gain worth a change (0.05 = 5%%; default: the larger of 5%% "
                   "and one restart-to-restart sd of this stack's measured noise).")
@click.option("--alpha", type=float, default=defaults.ALPHA, show_default=True,
              help="Family-wise error rate over every (candidate, level, guard).")
@click.option("--max-arms", type=int, default=8, show_default=True, help="The cap on the grid's candidates.")
@click.option("--confirm-repeats", type=int, default=None,
              help="The confirming A/B's cap (blocks per arm; default: as an ab run's).")
@click.option("--order-seed", type=int, default=None, help="The seed of the blocks' random order (default: drawn, recorded).")
@click.option("--requests", type=int, default=None, help="Measured requests per level and block.")
@click.option("--duration", type=float, default=None,
              help="Measured seconds per level and block (default on a real engine: 25, after a 5-s warm-up "
                   "that is recorded, not judged).")
@click.option("--api", type=click.Choice(["chat", "completions", "generate"]), default="chat", show_default=True)
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="The prompts' seed: the same for every arm.")
@click.option("--endpoint", default=None, help="Router base URL (default: from the inventory).")
@click.option("--reason", default=None, help="The reason of the entry --apply writes (default: the sweep's summary).")
@click.option("--allow-undeclared", is_flag=True,
              help="Sweep a knob the pinned engine does not declare (its catalog source names a fork or a PR).")
@click.option("--no-commit", is_flag=True,
              help="Write and stage the plan and the evidence but do not commit (check then refuses the evidence: "
                   "its plan was not committed before the data).")
@repo_option
@json_option
@example("knobkeeper sweep SGLANG_SM120_MMA_TARGET_CTAS=128,256,512,1024 --role decode --concurrency 64,96 "
         "--duration 2 --plan\n"
         "  knobkeeper sweep SGLANG_SM120_MMA_TARGET_CTAS=128,256,512,1024 --role decode --concurrency 64,96 "
         "--duration 2 --apply\n"
         "  knobkeeper sweep VLLM_CPU_OMP_THREADS_BIND=0-1,nobind --role decode --inventory inventory/local_vllm.py "
         "--concurrency 4")
def sweep_cmd(specs, role, inventory, stack_name, plan_only, apply, levels, max_repeats, minutes, delta, alpha,
              max_arms, confirm_repeats, order_seed, requests, duration, api, input_len, output_len, seed, endpoint,
              reason, allow_undeclared, no_commit, repo, as_json):
    """Find a knob's value: every listed value against the one the stack runs, restarts as replicates.

    The control is the value the stack runs now (declared, or the inventory's default); the
    candidates are the values listed (the grid of them for several knobs, at most --max-arms).
    Everything is checked first (the catalog's type, the role's engine registry, the budget); then
    the plan (arms, levels, guards, alpha, delta, budget, looks, the order's seed) is committed
    BEFORE any data, and `check` refuses evidence that does not follow it.

    \b
    Each block restarts every surviving arm in a seeded random order, warms it up (recorded,
    never judged) and loads every level. After 3, 5, 7, 10, ... blocks one family (Holm over
    every candidate, level and TTFT/TPOT guard, with alpha spending over the looks) judges the
    candidates against the control, and an arm whose upper bound against the best falls below
    -delta is dropped. A candidate that fails (gate timeout, crash, errors) is recorded with its
    cause. The pick: a candidate better than the control by more than delta at the family level
    with no guard regression, else "keep the control"; ties toward the value closest to the
    engine's default. The winner is then re-measured against the control on fresh restarts (a
    confirming A/B; its effect is the one reported). One evidence file holds it all; --apply
    makes the pick one `set` commit with it. The declared state is ALWAYS restored (also on
    Ctrl-C or SIGTERM, which keep the runs as evidence marked interrupted; after a SIGKILL run
    `knobkeeper ab abort`).
    """
    from knobkeeper.evidence.experiment import Interrupted
    from knobkeeper.evidence.search import Design
    from knobkeeper.evidence.sweep import sweep

    if requests is not None and duration is not None:
        raise UserError("--requests and --duration: give only one")
    project = find_project(repo)
    design = Design(_levels(levels), max_repeats=max_repeats, requests=requests, duration=duration, api=api,
                    input_len=input_len, output_len=output_len, seed=seed)
    try:
        out = sweep(project, list(specs), role=role, inventory=inventory, design=design, stack_name=stack_name,
                    delta=delta, alpha=alpha, max_arms=max_arms, minutes=minutes, seed=order_seed,
                    confirm_repeats=confirm_repeats, plan_only=plan_only, apply=apply, reason=reason,
                    no_commit=no_commit, progress=not as_json, endpoint=endpoint, allow_undeclared=allow_undeclared)
    except Interrupted as stopped:   # one line saying what was put back and kept, not click's "Aborted!"
        click.echo(stopped.line, err=True)
        sys.exit(130)
    if as_json:
        emit_json({"plan": out.plan.to_json(), "notes": out.notes,
                   "evidence": out.doc.to_json() if out.doc is not None else None,
                   "entry": out.entry, "command": out.command})
        return
    for line in out.lines():
        click.echo(line)


COMMANDS = [sweep_cmd]
