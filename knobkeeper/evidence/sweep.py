"""`knobkeeper sweep`: find a knob's value, not only judge one — many values against the value the
stack runs, the plan committed before any data, a restart as the unit of replication, one
family-wise judgement with sequential elimination, "keep the control" a valid pick, the winner
re-measured, the pick committed with its evidence.

    knobkeeper sweep SGLANG_SM120_MMA_TARGET_CTAS=128,256,512,1024 --role decode --plan   # the budget
    knobkeeper sweep SGLANG_SM120_MMA_TARGET_CTAS=128,256,512,1024 --role decode --apply  # run, set the pick

The arms: the control "A" is always the value the stack runs now (declared in knobs.toml for the
inventory's stack and role, else the inventory's knob_defaults, else unset); the candidates "B",
"C", ... are the listed values (for several knobs, the grid of them: at most `max_arms`), less any
equal to the control. Every value is checked as `set` checks it (the catalog's type, the engine
registry of the role's pinned engine: a knob it does not read is refused) before anything is
written or restarted.

The plan (model.SweepPlan, changelog/plans/) is committed before the first restart: arms, levels,
the primary metric and the guards, alpha, delta (the indifference margin: the smallest gain worth a
change; default the larger of 5% and one restart-to-restart standard deviation of this stack's
measured noise, because a smaller gain costs more restarts to confirm than it returns), the budget
(blocks per arm, minutes), the looks and their alpha spending, the seed of the block order, the
confirming run's design. `check` refuses evidence that does not follow its committed plan
(`plan_problems`).

The search (knobkeeper.evidence.search, the code path `ab run` takes with one candidate): every
block restarts each surviving arm in a seeded random order, warms it up (recorded, never judged),
loads every level; the looks judge every (candidate, level, guard) against the control in one
Holm family, drop candidates whose upper bound against the leader falls below -delta, and stop as
search.py says. A failing candidate (gate timeout, start-up crash, errors over the gate) is an
outcome with its cause. The pick by rule (search.pick); then, with more than one candidate, the
winner is re-measured against the control on fresh restarts (a confirming A/B in ABBA order: the
winner of a search overstates its effect) and THAT A/B is the evidence's own arms, runs and
judgement: its effect is the one reported, and a winner it does not confirm is not adopted. With
one candidate the search is the A/B.

The evidence: one file (knobkeeper.evidence.model.SweepBlock in `sweep`): every arm, every
restart's runs, each look's decisions and eliminations, the plan and its commit, the family's
judgement, the pick, a fingerprint (engines and versions, the inventory's digest, the role's render
digest, hosts, git sha). `--apply` makes the pick one `set` commit with that evidence attached
(Evidence.backs binds it to the value picked); without it the command to run is printed.
Interrupted (Ctrl-C, SIGTERM): the stack is put back at once, the runs so far are written as
evidence marked interrupted ("no pick"); SIGKILL: the marker stays, `knobkeeper ab abort`
(knobkeeper.evidence.experiment).
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import secrets
import shlex
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from knobkeeper import fmt, gitio
from knobkeeper.changelog.ops import set_knob
from knobkeeper.deploy.api import terminate_as_interrupt
from knobkeeper.deploy.record import read_record
from knobkeeper.deploy.render import render_stack
from knobkeeper.deploy.stack import load_stack
from knobkeeper.engine.pins import evidence_setup
from knobkeeper.errors import UserError
from knobkeeper.deploy.experiment_state import ExperimentMarker
from knobkeeper.evidence import ab, experiment, judge, search, store, validity
from knobkeeper.evidence.ab import searched_doc
from knobkeeper.evidence.defaults import ALPHA, REAL_MAX_REPEATS
from knobkeeper.evidence.experiment import Experiment, refuse_if_abandoned
from knobkeeper.evidence.model import (GUARDS, KEEP, METRIC, NO_PICK, Arm, Evidence, Pick, Setup, SweepBlock,
                                       SweepPlan)
from knobkeeper.evidence.model import same_value
from knobkeeper.evidence.search import CONTROL, Design, Harness, Rules, Search, Searched, final_pick
from knobkeeper.evidence.store import write, write_plan
from knobkeeper.knobs.catalog import load_catalog
from knobkeeper.knobs.pinned import settable
from knobkeeper.knobs.state import read_declared, value_of
from knobkeeper.timeutil import iso, new_id, utcnow

MAX_ARMS = 8                  # the grid's default cap (--max-arms raises it)
SIM_NOISE = judge.DEFAULT_NOISE   # restart-to-restart log-sd assumed for the sim without stored evidence
# A real engine without stored evidence: the restart-to-restart log-sd measured on real vLLM (CPU
# build, a loaded 2-core machine: bench/real_noise/README.md, knobkeeper.evidence.judge "Real noise").
REAL_NOISE = 0.16
# Seconds a block's restart of one arm takes when the stack's own records say nothing: a decode
# deploy of the local sim stack (pyinfra, supervisord, the gate) took 8-10 s here; real vLLM 54-118 s
# loaded (judge.py "Real noise").
SIM_RESTART_S, REAL_RESTART_S = 10.0, 90.0
DEPLOY_OVERHEAD_S = 5.0       # pyinfra's start, the upload and the router's re-check around a gate
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
SWEEP_FIRST_LOOK = 2
# A sweep looks first after 2 blocks (an A/B after 3): every arm costs a restart per block, and an arm
# decisively worse than the leader (the real core binding's 10x) is dropped there, before its third
# restart; alpha spent at that look is small ((2/cap)^2), so only such arms go that early.


# ---------------------------------------------------------------- the arms

def parse_grid(project, specs: list[str], scope: str, max_arms: int,
               allow_undeclared: bool | None = None) -> tuple[list[str], list[dict[str, Any]], Any]:
    """(knobs, every arm's {knob: value} in the grid's order, the first knob's catalog entry) from
    `KNOB=V1,V2,...` specs, each value checked as `set` checks it; UserError (one line) otherwise."""
    if not specs:
        raise UserError("KNOB=V1,V2,...: give the values to sweep (e.g. SGLANG_SM120_MMA_TARGET_CTAS=256,512,1024)")
    catalog = load_catalog(project.catalog_path)
    knobs: list[str] = []
    values: list[list[Any]] = []
    first = None
    for spec in specs:
        name, eq, raw = spec.partition("=")
        name = name.strip()
        if not eq or not name or not raw.strip():
            raise UserError(f"{fmt.safe(spec)!r}: expected KNOB=V1,V2,... (e.g. SGLANG_SM120_MMA_TARGET_CTAS=256,512)")
        if name in knobs:
            raise UserError(f"{name}: given twice; give all its values in one KNOB=V1,V2,...")
        knob = catalog.for_role(name, scope)
        if knob.secret:
            raise UserError(f"{name} is a secret knob and cannot be swept (its value would enter git); value not shown")
        settable(project.inventory_dir, knob, scope, allow_undeclared)   # the role's engine must read it
        parsed: list[Any] = []
        for text in raw.split(","):
            try:
                value = knob.parse(text.strip())
            except UserError as exc:
                raise UserError(f"{name}={fmt.safe(text.strip())}: {exc}") from None
            if any(_same(value, v) for v in parsed):
                raise UserError(f"{name}={fmt.value(value)}: given twice")
            parsed.append(value)
        knobs.append(name)
        values.append(parsed)
        first = first or knob
    grid = [dict(zip(knobs, combo)) for combo in itertools.product(*values)]
    if len(grid) > max_arms:
        raise UserError(f"the grid has {len(grid)} candidates ({' x '.join(str(len(v)) for v in values)}), over "
                        f"--max-arms {max_arms}; raise --max-arms to run them all (each costs a restart per block)")
    return knobs, grid, first


def _same(a: Any, b: Any) -> bool:
    return same_value(a, b)


def control_knobs(project, stack, role: str, knobs: list[str]) -> tuple[dict[str, Any], str]:
    """(the value of each knob the stack runs now, where it comes from): declared for the stack's
    role, else the inventory's knob_defaults (what the stack renders), else unset (None)."""
    declared = read_declared(project.knobs_path) if project.knobs_path.exists() else {}
    out, said = {}, []
    for name in knobs:
        value = value_of(declared, stack.scope(role), name)
        if value is not None:
            out[name], _ = value, said.append("declared")
            continue
        running = {plan.data.get("knob_defaults", {}).get(role, {}).get(name) for plan in stack.hosts.values()
                   if plan.role_services(role)}
        value = running.pop() if len(running) == 1 else None
        out[name] = value
        said.append("inventory default" if value is not None else "unset")
    return out, "control (" + ", ".join(dict.fromkeys(said)) + ")"


def name_arms(control: dict[str, Any], label: str, grid: list[dict[str, Any]]) -> tuple[dict[str, dict], list[str]]:
    """({"A": control, "B": first candidate, ...}, notes on listed values equal to the control)."""
    arms = {CONTROL: Arm(label, dict(control)).to_json()}
    notes = []
    for knobs in grid:
        if all(_same(knobs[k], control.get(k)) for k in knobs):
            notes.append(f"{', '.join(f'{k}={fmt.value(v)}' for k, v in knobs.items())} is the control (the value "
                         f"the stack runs): measured as arm A")
            continue
        if len(arms) >= len(LETTERS):
            raise UserError(f"{len(grid)} candidates: at most {len(LETTERS) - 1}")
        arms[LETTERS[len(arms)]] = Arm("candidate", dict(knobs)).to_json()
    if len(arms) < 2:
        raise UserError("every value listed is the control (the value the stack runs): nothing to compare")
    return arms, notes


# ---------------------------------------------------------------- noise, delta, budget

def stack_noise(project, inventory: str | None, role: str, simulated: bool | None) -> tuple[float, str]:
    """(restart-to-restart log-sd of this stack's throughput, where the figure comes from): pooled over
    the arms and levels of this inventory's stored `ab run` and sweep evidence (each run a restart of
    its own), at least 8 degrees of freedom; else the assumed noise of the engine kind."""
    squares, dof, files, count = 0.0, 0, 0, 0
    for path in store.paths(project):
        try:
            doc = store.read(path, project.rel(path))
        except UserError:
            continue
        if inventory is None or doc.setup.inventory != inventory or doc.role != role or doc.canary is not None:
            continue
        groups: dict[tuple[str, int], list[float]] = {}
        for run in list(doc.runs) + (list(doc.sweep.runs) if doc.sweep is not None else []):
            value = run.value(doc.metric)
            if value is not None and not run.failed:
                groups.setdefault((run.arm, int(run.concurrency)), []).append(math.log(value))
        used = False
        for logs in groups.values():
            if len(logs) >= 2:
                mean = sum(logs) / len(logs)
                squares += sum((x - mean) ** 2 for x in logs)
                dof += len(logs) - 1
                count += len(logs)
                used = True
        files += used
    if dof >= 8:
        sd = math.sqrt(squares / dof)
        return sd, f"{sd:.3f} from {count} runs in {files} evidence file{'s' * (files != 1)} of {inventory}"
    if simulated is False:
        return REAL_NOISE, f"{REAL_NOISE:g} assumed for a real engine (restart to restart, bench/real_noise; no stored evidence of {inventory})"
    return SIM_NOISE, f"{SIM_NOISE:g} assumed (no stored evidence of {inventory} to measure it from)"


def default_delta(noise: float) -> float:
    """The larger of 5% and one restart-to-restart standard deviation (see the module doc)."""
    return round(max(judge.MDE, math.expm1(noise)), 3)


def restart_seconds(project, inventory: str | None, role: str, simulated: bool | None) -> tuple[float, str]:
    """(seconds one arm's restart takes, whence): the median gate time of the role's restarts in this
    inventory's committed deploy records plus DEPLOY_OVERHEAD_S, else the engine kind's default.
    Read only: the records as they are (deploy/record.read_record)."""
    seen = []
    folder = project.deploys_dir
    for path in sorted(folder.glob("*.json"))[-20:] if folder.is_dir() else []:
        try:
            record = read_record(path)
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if inventory and record.inventory_path not in ("", inventory):
            continue
        seen += [float(r.gate.seconds) for r in record.services if r.role == role and r.acted and r.gate.seconds]
    if len(seen) >= 2:
        return statistics.median(seen) + DEPLOY_OVERHEAD_S, (f"the median gate of {len(seen)} recorded restarts of "
                                                             f"{role}, plus {DEPLOY_OVERHEAD_S:g} s of deploy")
    default = REAL_RESTART_S if simulated is False else SIM_RESTART_S
    return default, f"{default:g} s assumed ({'a real engine' if simulated is False else 'the sim'}; no deploy records)"


def block_seconds(design: Design, arms: int, restart_s: float) -> float:
    """One block's wall time: every arm restarted, warmed up and loaded at every level."""
    run_s = design.duration if design.duration is not None else 10.0
    warm = design.warmup_duration if design.warmup_duration is not None else 2.0
    return arms * (restart_s + warm + len(set(design.levels)) * (run_s + 1.0))


# ---------------------------------------------------------------- the plan

def make_plan(*, knob: str, role: str, scope: str, inventory: str | None, arms: Mapping[str, Mapping],
              design: Design, delta: float, delta_source: str, noise: float, noise_source: str, alpha: float,
              minutes: float | None, seed: int, max_arms: int, confirm_repeats: int, engine_default: Any,
              estimate: Mapping[str, Any], guards: bool = True) -> SweepPlan:
    cap = design.cap
    candidates = len(arms) - 1
    rule = judge.sequential_rule(cap, SWEEP_FIRST_LOOK if candidates > 1 else judge.FIRST_LOOK)
    return SweepPlan(id=new_id(), created=iso(utcnow()), knob=knob, role=role, scope=scope, inventory=inventory,
                     arms={k: Arm.of(v) for k, v in arms.items()}, levels=sorted(set(design.levels)), metric=METRIC,
                     guards=list(GUARDS) if guards else [], alpha=alpha, delta=delta, delta_source=delta_source,
                     noise=round(noise, 6), noise_source=noise_source, max_repeats=cap, minutes=minutes,
                     planned_looks=list(rule.planned_looks), spending=rule.spending,
                     order="random" if candidates > 1 else "ABBA", seed=seed, max_arms=max_arms,
                     confirm={"max_repeats": confirm_repeats, "planned_looks": judge.planned_looks(confirm_repeats),
                              "order": "ABBA"} if candidates > 1 else {},
                     load=design.load_fields(), engine_default=engine_default, estimate=dict(estimate))


def plan_lines(plan: SweepPlan, notes: list[str] = ()) -> list[str]:
    """What `sweep --plan` prints (and a sweep before it starts): the arms, the design, the budget."""
    est = plan.estimate
    lines = [f"sweep {plan.knob} on {plan.scope or plan.role} ({plan.inventory}): {len(plan.candidates)} "
             f"candidate{'s' * (len(plan.candidates) != 1)} against the control"]
    lines += [f"  {plan.arm_text(name)}" for name in plan.arms]
    lines += [f"  note: {n}" for n in notes]
    lines.append(f"  levels {', '.join(map(str, plan.levels))}; {plan.metric} with guards "
                 f"{', '.join(GUARDS[g][2] for g in plan.guards) or 'none'}; family-wise alpha {plan.alpha:g}")
    lines.append(f"  delta {plan.delta:.1%} ({plan.delta_source}); noise {plan.noise_source}")
    lines.append(f"  blocks per arm: up to {plan.max_repeats} (looks after {', '.join(map(str, plan.planned_looks))}; "
                 f"order {plan.order}, seed {plan.seed})"
                 + (f"; confirm: up to {plan.confirm['max_repeats']} per arm, ABBA" if plan.confirm else ""))
    if est:
        lines.append(f"  a block: ~{est['block_s']:.0f} s ({len(plan.arms)} restarts at ~{est['restart_s']:.0f} s: "
                     f"{est['restart_source']}); to resolve ±{plan.delta:.1%} at 80% power at this noise a fixed design "
                     f"needs {est['needed_repeats']} blocks per arm (~{est['needed_minutes']:.0f} min); the cap "
                     f"{plan.max_repeats} costs at most ~{est['cap_minutes']:.0f} min"
                     + (f" plus the confirm's ~{est['confirm_minutes']:.0f} min" if plan.confirm else ""))
    if plan.minutes is not None:
        lines.append(f"  budget: {plan.minutes:g} min (the search stops before a block that would not fit)")
    return lines


def plan_summary(plan: SweepPlan) -> str:
    """The plan commit's summary line."""
    values = ", ".join(fmt.value(next(iter(plan.arms[a].knobs.values()), None)) if len(plan.arms[a].knobs) == 1
                       else plan.arm_text(a) for a in plan.candidates)
    control = fmt.value(next(iter(plan.arms[CONTROL].knobs.values()), None))
    return (f"sweep plan: {plan.knob} over {values} on {plan.role} (control {control}; delta {plan.delta:.1%}, up to "
            f"{plan.max_repeats} blocks)")


# ---------------------------------------------------------------- the evidence

def scores_of(runs, arms: list[str], levels: list[int]) -> dict[str, dict[str, Any]]:
    """{arm: {"effect": its score against the control (mean over levels of the per-restart ratio), "n"}}."""
    out = {}
    for arm in arms:
        n = len(search.block_scores(runs, arm, levels))
        effect = search.score_compare(runs, arm, CONTROL, levels).effect if arm != CONTROL else 0.0
        out[arm] = {"effect": effect, "n": n}
    return out


def sweep_doc(plan: SweepPlan, searched: Searched, pick: Pick, *, setup: Setup | Mapping, endpoint: str | None,
              loadgen: bool, plan_path: str, plan_commit: str | None, fingerprint: Mapping[str, Any],
              confirm: Searched | None = None, confirm_arm: str | None = None, status: str = "complete") -> Evidence:
    """The sweep's one evidence file (see the module doc): its own A/B is `confirm` (the control
    against `confirm_arm`) when there was one, else the search's runs of the control and the pick
    (or, kept the control, the leading candidate)."""
    design = Design(plan.levels, max_repeats=plan.max_repeats, **plan.load)
    arms = {k: v.to_json() for k, v in plan.arms.items()}
    if confirm is not None:
        confirm_design = Design(plan.levels, max_repeats=int(plan.confirm["max_repeats"]), **plan.load)
        doc = searched_doc(confirm, confirm_design, knob=plan.knob, role=plan.role,
                           arms={CONTROL: arms[CONTROL], "B": arms[confirm_arm or pick.arm]}, setup=setup,
                           endpoint=endpoint, loadgen=loadgen, keep_invalid=True, tool="knobkeeper sweep")
    else:
        pair = pick.arm if pick.adopted else (search.leader(searched.runs, [c for c in plan.candidates if any(
            r.arm == c for r in searched.runs)], plan.levels) or plan.candidates[0])
        doc = searched_doc(searched, design, knob=plan.knob, role=plan.role, arms=arms, setup=setup, endpoint=endpoint,
                           loadgen=loadgen, pair=pair, keep_invalid=True, tool="knobkeeper sweep")
    judged = search.judge_family(searched.runs, plan.candidates, searched.sequential, plan.metric, plan.alpha)
    doc.sweep = SweepBlock(plan=plan, plan_path=plan_path, plan_commit=plan_commit, status=status,
                           blocks=searched.blocks, runs=searched.runs, warmups=searched.warmups,
                           sequential=searched.sequential, looks=searched.looks, failed=searched.failed,
                           judgement=judged, scores=scores_of(searched.runs, list(plan.arms), plan.levels), pick=pick,
                           confirm={"arm": confirm_arm or pick.arm, "blocks": len(confirm.blocks),
                                    "wall_s": confirm.wall_s} if confirm is not None else None,
                           fingerprint=dict(fingerprint), stopped=searched.stopped, wall_s=searched.wall_s)
    return doc


def confirmed_pick(pick: Pick, plan: SweepPlan, confirm_doc: Evidence, confirm: Searched) -> Pick:
    """The pick after its confirming A/B: adopted only if the A/B alone beats the control by delta too."""
    ok = search.adoptable(confirm_doc.judgement, plan.delta) and "B" not in confirm.failed
    summary = confirm_doc.summary_line()
    if ok:
        return dataclasses.replace(pick, confirmed=True, confirm_summary=summary)
    why = (f"the confirming A/B of {pick.arm} failed ({confirm.failed['B'].cause}: {confirm.failed['B'].detail})"
           if "B" in confirm.failed else f"the confirming A/B did not confirm {pick.arm} ({summary})")
    return dataclasses.replace(pick, outcome=KEEP, arm=CONTROL, knobs=dict(plan.arms[CONTROL].knobs),
                               reason=f"{pick.reason}; {why}", confirmed=False, confirm_summary=summary)


def abort(project) -> tuple[ExperimentMarker, Any, Evidence | None]:
    """`knobkeeper ab abort` (knobkeeper.evidence.experiment.abort): the role an abandoned ab run or
    sweep left on an arm deployed back to the declared state, its runs kept as interrupted evidence.
    Here, not in ab.py: an ab run is a sweep with one candidate, so this module knows both kinds'
    partial evidence (ab.partial_doc and its own)."""
    partials = {"ab run": ab.partial_doc, "sweep": partial_doc}
    return experiment.abort(project, partials.__getitem__, lambda doc: write(project, doc))


def partial_doc(journal: Mapping[str, Any], by: str, at: str) -> Evidence | None:
    """The evidence of an interrupted (or killed) sweep from its journal: status "interrupted", no pick."""
    if not journal.get("searched"):
        return None
    searched = Searched.from_json(journal["searched"])
    if not searched.runs:
        return None
    plan = SweepPlan.from_json(journal["plan"])
    confirm = Searched.from_json(journal["confirm"]) if journal.get("confirm") else None
    arm = journal.get("confirm_arm")
    pick = Pick(outcome=NO_PICK, arm=CONTROL, knobs=dict(plan.arms[CONTROL].knobs),
                reason=f"interrupted by {by} after {len(searched.blocks)} blocks"
                       + (f" (during the confirming A/B of {arm})" if confirm is not None else ""), rule="")
    if confirm is None or not arm or not any(r.arm == "B" for r in confirm.runs):
        confirm = None
    doc = sweep_doc(plan, searched, pick, setup=journal.get("setup") or {}, endpoint=journal.get("endpoint"),
                    loadgen=bool(journal.get("loadgen")), plan_path=journal.get("plan_path", ""),
                    plan_commit=journal.get("plan_commit"), fingerprint=journal.get("fingerprint") or {},
                    confirm=confirm, confirm_arm=arm, status="interrupted")
    doc.interrupted = {"by": by, "at": at, "blocks": len(searched.blocks)}
    return doc


# ---------------------------------------------------------------- verify, and the plan it follows

def plan_problems(project, doc: Evidence, rel: str) -> list[str]:
    """Every way a sweep's evidence departs from its committed plan (`check`): the plan file, its
    commit (before the evidence's), and the data measured against what the plan said."""
    block = doc.sweep
    if block is None:
        return []
    plan = block.plan
    out: list[str] = []
    path = project.root / block.plan_path if block.plan_path else None
    if path is None or not path.is_file():
        return [f"its plan {block.plan_path or '(none named)'} is missing"]
    try:
        on_disk = store.read_plan(path, block.plan_path)
    except UserError as exc:
        return [str(exc)]
    if on_disk.to_json() != plan.to_json():
        differ = sorted(k for k in set(on_disk.to_json()) | set(plan.to_json())
                        if on_disk.to_json().get(k) != plan.to_json().get(k))
        out.append(f"does not match its committed plan {block.plan_path}: {', '.join(differ)} differ")
    if not block.plan_commit:
        out.append(f"names no commit of its plan {block.plan_path}")
    else:
        shown = gitio.run(project.root, "show", f"{block.plan_commit}:{block.plan_path}")
        if shown.returncode != 0:
            out.append(f"its plan was not committed at {block.plan_commit[:10]} (the commit it names)")
        elif json.loads(shown.stdout) != plan.to_json():
            out.append(f"its plan as committed at {block.plan_commit[:10]} is not the plan it followed")
        before = gitio.run(project.root, "cat-file", "-e", f"{block.plan_commit}:{rel}")
        if before.returncode == 0:
            out.append(f"it was already committed when its plan was ({block.plan_commit[:10]}): the plan came after the data")
    if doc.knob != plan.knob or doc.role != plan.role:
        out.append(f"tests {doc.knob} on {doc.role}, its plan {plan.knob} on {plan.role}")
    stray = sorted({r.arm for r in block.runs} - set(plan.arms))
    if stray:
        out.append(f"runs of arms {', '.join(stray)} the plan does not have")
    levels = sorted({int(r.concurrency) for r in block.runs} - set(plan.levels))
    if levels:
        out.append(f"runs at {', '.join(map(str, levels))}, not the plan's levels {plan.levels}")
    deepest = max((int(r.repeat) for r in block.runs), default=0)
    if deepest > plan.max_repeats:
        out.append(f"{deepest} blocks, over the plan's {plan.max_repeats}")
    if block.sequential is not None and (block.sequential.max_repeats != plan.max_repeats
                                         or block.sequential.planned_looks != plan.planned_looks):
        out.append("its looks are not the plan's")
    for look in block.looks:
        if look.repeat not in plan.planned_looks:
            out.append(f"a look after {look.repeat} blocks, not planned ({plan.planned_looks})")
    for row in block.blocks:
        order = list(row.get("order") or [])
        if CONTROL not in order or set(order) - set(plan.arms) or order != search.block_order(plan.order, plan.seed,
                                                                                              int(row["repeat"]), order):
            out.append(f"block {row.get('repeat')}'s restart order {order} is not the plan's (seed {plan.seed})")
            break
    for arm in (doc.sweep.judgement or {}).values():
        if not math.isclose(arm.alpha, plan.alpha):
            out.append(f"judged at alpha {arm.alpha:g}, the plan's is {plan.alpha:g}")
            break
    if block.confirm is not None:
        if doc.sequential is None or doc.sequential.max_repeats != int(plan.confirm.get("max_repeats") or 0):
            out.append("its confirming A/B is not the plan's design")
        want = plan.arms[block.confirm.get("arm") or CONTROL].knobs
        if doc.arms["A"].knobs != plan.arms[CONTROL].knobs or doc.arms["B"].knobs != want:
            out.append("its confirming A/B's arms are not the control and the arm picked")
    return out


# ---------------------------------------------------------------- knobkeeper sweep (project level)

@dataclass
class Outcome:
    """What `knobkeeper sweep` did: the plan, and unless --plan the evidence, the set it made or the
    command that would."""

    plan: SweepPlan
    notes: list[str] = field(default_factory=list)
    doc: Evidence | None = None
    path: Path | None = None
    plan_path: Path | None = None
    entry: str | None = None
    command: str | None = None

    def lines(self) -> list[str]:
        if self.doc is None:
            return plan_lines(self.plan, self.notes)
        return report_lines(self.doc, self.path, self.entry, self.command)


def report_lines(doc: Evidence, path: Path | None, entry: str | None, command: str | None) -> list[str]:
    """What a finished sweep prints: the arms with their effects, the eliminations, the pick."""
    block = doc.sweep
    assert block is not None
    plan, pick = block.plan, block.pick
    lines = [f"sweep {doc.id} of {plan.knob} on {plan.scope or plan.role}: "
             + (f"pick {plan.arm_text(pick.arm)}" if pick.adopted else pick.outcome)
             + (" (interrupted)" if block.status == "interrupted" else "")]
    lines += [f"  {line}" for line in block.arm_rows()]
    lines.append(f"  search: {len(block.blocks)} blocks, {block.stopped}; {block.wall_s or 0:.0f} s")
    lines += [f"    {line}" for line in block.timeline()]
    lines.append(f"  {block.pick_text()}")
    if pick.confirm_summary:
        lines.append(f"  confirming A/B ({doc.arms['B'].label or 'B'} vs control): {doc.summary_line()}")
    if path is not None:
        lines.append(f"  evidence {doc.id} ({path}), plan {plan.id} ({block.plan_path}, committed before the first run)")
    if entry:
        lines.append(f"  entry {entry}: set {plan.knob} with --evidence {doc.id}")
    elif command:
        lines.append(f"  to adopt it: {command}")
    return lines


def fingerprint_of(project, stack, inventory: str, role: str) -> dict[str, Any]:
    """Engines and versions per role, the inventory file's digest, the role's render digest (its
    services at the declared state), the role's hosts, the git sha."""
    engines = {}
    for name in stack.order:
        said = evidence_setup(stack, name)
        engines[name] = " ".join(str(x) for x in (said.get("engine"), said.get("engine_version")) if x)
    text = (project.root / inventory).read_bytes()
    try:
        rendered = render_stack(project, stack)
        digest = hashlib.sha256(json.dumps(sorted(r.digest for (_, _), r in rendered.items() if r.service.role == role))
                                .encode()).hexdigest()[:16]
    except UserError as exc:
        digest = f"unrendered ({fmt.safe(str(exc))[:80]})"
    return {"engines": engines, "inventory": inventory, "inventory_sha256": hashlib.sha256(text).hexdigest()[:16],
            "render_digest": digest, "hosts": sorted({s.host for s in stack.services if s.role == role}),
            "git_sha": gitio.head_sha(project.root)}


def sweep(project, specs: list[str], *, role: str, inventory: str, design: Design, stack_name: str | None = None,
          delta: float | None = None, alpha: float = ALPHA, max_arms: int = MAX_ARMS, minutes: float | None = None,
          seed: int | None = None, confirm_repeats: int | None = None, plan_only: bool = False,
          apply: bool = False, reason: str | None = None, no_commit: bool = False, progress: bool | Any = False,
          harness: Harness | None = None, endpoint: str | None = None,
          allow_undeclared: bool | None = None) -> Outcome:
    """`knobkeeper sweep`: everything checked, then the plan committed, the search, the pick, the
    confirming A/B, one evidence file, and with `apply` the pick `set` with it (see the module doc).
    `harness` replaces the deploy-backed one (tests); `plan_only`: the plan and budget, nothing written."""
    refuse_if_abandoned(project)
    stack = load_stack(project.root, inventory)
    if stack_name is not None and stack_name != stack.stack:
        raise UserError(f"--stack {stack_name}: {inventory} is stack {stack.stack or '(unnamed)'}")
    if role not in stack.roles:
        raise UserError(f"--role {role}: not a role of {inventory} (roles: {', '.join(stack.order)})")
    if not [s for s in stack.services if s.role == role]:
        raise UserError(f"--role {role}: {inventory} runs no service of it; nothing the sweep could restart")
    scope = stack.scope(role)
    if delta is not None and not delta > 0:
        raise UserError(f"--delta {delta:g}: expected a gain above 0 (the smallest worth a change, e.g. 0.05)")
    if not 0 < alpha < 0.5:
        raise UserError(f"--alpha {alpha:g}: expected a probability between 0 and 0.5")
    if max_arms < 1:
        raise UserError(f"--max-arms {max_arms}: expected at least 1")
    knobs, grid, first = parse_grid(project, specs, scope, max_arms, allow_undeclared)
    if apply and len(knobs) > 1:
        raise UserError("--apply: one `set` per knob; sweep several knobs without --apply and set the pick's values")
    control, label = control_knobs(project, stack, role, knobs)
    arms, notes = name_arms(control, label, grid)
    simulated = ab.role_simulated(project, inventory, role) if harness is None else None
    design = ab.engine_design(design, simulated)
    if design.requests is None and design.duration is None:
        raise UserError("--requests or --duration: give one (how long each level is measured; on a real "
                        "engine the default is --duration 25)")
    if design.repeats is not None:
        raise UserError("--repeats: a sweep is sequential (its looks drop arms); give --max-repeats (the cap)")
    noise, noise_source = stack_noise(project, inventory, role, simulated)
    delta_source = "given"
    if delta is None:
        delta, delta_source = default_delta(noise), "default: the larger of 5% and one restart-to-restart sd"
    candidates = len(arms) - 1
    levels = len(set(design.levels))
    if design.max_repeats is None:
        cap = REAL_MAX_REPEATS if simulated is False else judge.sequential_repeats(
            noise, delta, alpha, levels=levels * candidates, guards=True)
        design = dataclasses.replace(design, max_repeats=cap)
    if design.max_repeats < 2:
        raise UserError(f"--max-repeats {design.max_repeats}: a sweep needs at least 2 blocks (Welch's t needs two "
                        f"restarts of each arm)")
    confirm_cap = confirm_repeats if confirm_repeats is not None else (
        design.max_repeats if simulated is False else judge.sequential_repeats(noise, delta, alpha, levels=levels,
                                                                               guards=True))
    if confirm_cap < 2:
        raise UserError(f"--confirm-repeats {confirm_cap}: the confirming A/B needs at least 2 blocks")
    restart_s, restart_source = restart_seconds(project, inventory, role, simulated)
    block_s = block_seconds(design, len(arms), restart_s)
    if minutes is not None and minutes * 60 < block_s:
        raise UserError(f"--minutes {minutes:g}: the budget cannot hold one block (~{block_s:.0f} s: {len(arms)} "
                        f"restarts at ~{restart_s:.0f} s, {levels} levels each; {restart_source})")
    needed = judge.recommended_repeats(noise, delta, alpha, levels=levels * candidates, guards=True)
    estimate = {"block_s": round(block_s, 1), "restart_s": round(restart_s, 1), "restart_source": restart_source,
                "needed_repeats": needed, "needed_minutes": round(needed * block_s / 60, 1),
                "cap_minutes": round(design.max_repeats * block_s / 60, 1),
                "confirm_minutes": round(confirm_cap * block_seconds(design, 2, restart_s) / 60, 1)}
    plan = make_plan(knob=knobs[0], role=role, scope=scope, inventory=inventory, arms=arms, design=design,
                     delta=delta, delta_source=delta_source, noise=noise, noise_source=noise_source, alpha=alpha,
                     minutes=minutes, seed=secrets.randbelow(2 ** 31) if seed is None else seed, max_arms=max_arms,
                     confirm_repeats=confirm_cap, engine_default=first.default if first is not None else None,
                     estimate=estimate)
    if plan_only:
        return Outcome(plan, notes)
    engine = {"engine": "custom switcher"} if harness is not None else ab.engine_of(project, inventory, role)
    fingerprint = fingerprint_of(project, stack, inventory, role)
    harness = harness or _deploy_harness(project, inventory, role, knobs)
    if endpoint:
        harness = dataclasses.replace(harness, endpoint=endpoint)
    if not harness.endpoint:
        raise UserError("--endpoint: required (the inventory names no router endpoint)")
    setup = Setup.build(project, inventory=inventory, **engine)
    written = write_plan(project, plan, plan_summary(plan), no_commit=no_commit)

    commit = None if no_commit else gitio.head_sha(project.root)
    context = {"plan": plan.to_json(), "plan_path": project.rel(written), "plan_commit": commit,
               "setup": setup.to_json(), "endpoint": ab._endpoint(harness), "loadgen": harness.load is None,
               "fingerprint": fingerprint}
    exp = Experiment(project, kind="sweep", knob=plan.knob, role=role, scope=scope, inventory=inventory,
                     arms={k: v.to_json() for k, v in plan.arms.items()}, context=context, partial=partial_doc,
                     write=lambda doc: write(project, doc, no_commit=no_commit), plan=plan.id)
    out = Outcome(plan, notes, plan_path=written)
    with exp, terminate_as_interrupt():
        marked = exp.marked(harness)
        doc = run_plan(plan, marked, design, setup=setup, context=context, journal=exp.journal, progress=progress,
                       restore=False)
        out.doc, out.path = doc, Path(project.rel(write(project, doc, no_commit=no_commit)))
        pick = doc.sweep.pick
        if pick.adopted:
            value = fmt.value(pick.knobs[plan.knob])
            words = reason or f"sweep {doc.id}: {doc.summary_line()}"[:300]
            stack_flag = f" --stack {stack.stack}" if stack.stack else ""
            out.command = (f"knobkeeper set {plan.knob}={value} --role {role}{stack_flag} --reason "
                           f"{shlex.quote(words)} --evidence {doc.id}"
                           + (" --allow-undeclared" if allow_undeclared else ""))
            if apply:   # before the put-back: putting the stack back then deploys the pick (one restart, not two)

                change = set_knob(project, plan.knob, value, scope, words, [doc.id], allow_undeclared=allow_undeclared)
                out.entry = change.entry.id
        marked.restore()
    return out


def run_plan(plan: SweepPlan, harness: Harness, design: Design, *, setup: Setup | Mapping | None = None,
             context: Mapping[str, Any] | None = None, journal: Any = None, progress: bool | Any = False,
             restore: bool = True) -> Evidence:
    """The search, the pick, the confirming A/B, the evidence (unwritten); with `restore` the stack put
    back at the end (else the caller does: `sweep` sets the pick first, with --apply). `journal(searched, **more)`: after every arm's block (the experiment's marker); `context`:
    the plan's path and commit, the endpoint, the fingerprint (what the evidence records of them).
    The benchmark (bench/bench_sweep.py) runs this with a synthetic harness."""
    context = context or {}
    note = journal or (lambda searched, **more: None)
    arms = {k: v.to_json() for k, v in plan.arms.items()}
    rules = Rules(order=plan.order, seed=plan.seed, eliminate=len(plan.candidates) > 1, delta=plan.delta,
                  alpha=plan.alpha, fail_arms=True, minutes=plan.minutes, candidates=len(plan.candidates),
                  first_look=plan.planned_looks[0] if plan.planned_looks else judge.FIRST_LOOK)
    search = Search(harness, design, arms, rules, on_block=lambda s: note(s.so_far()), progress=progress,
                    label="sweep")
    searched = search.run(restore=False)
    pick = final_pick(plan, searched)
    confirm = None
    if pick.adopted and len(plan.candidates) > 1:
        confirm_design = dataclasses.replace(design, max_repeats=int(plan.confirm["max_repeats"]))
        confirm_search = Search(harness, confirm_design, {CONTROL: arms[CONTROL], "B": arms[pick.arm]},
                                Rules(order="ABBA", delta=plan.delta, alpha=plan.alpha, fail_arms=True),
                                on_block=lambda s: note(searched, confirm=s.so_far().to_json(), confirm_arm=pick.arm),
                                progress=progress, label=f"confirm {pick.arm}")
        confirm = confirm_search.run(restore=False)
    if restore:
        harness.restore()
    doc = sweep_doc(plan, searched, pick, setup=setup or {}, endpoint=context.get("endpoint"),
                    loadgen=bool(context.get("loadgen")), plan_path=context.get("plan_path", ""),
                    plan_commit=context.get("plan_commit"), fingerprint=context.get("fingerprint") or {},
                    confirm=confirm)
    if confirm is not None:
        doc.sweep.pick = confirmed_pick(pick, plan, doc, confirm)
    return doc


def _deploy_harness(project, inventory: str, role: str, knobs: list[str]) -> Harness:
    """ab.deploy_harness with a knob probe over every knob of the grid (the worst of them)."""
    harness = ab.deploy_harness(project, inventory, role, knobs[0], what="sweep")
    if len(knobs) == 1:
        return harness
    probes = [ab.deploy_probes(project, inventory, role, k).knob for k in knobs]

    def knob(arm: dict):
        seen = [p(arm) for p in probes]
        return next((s for s in seen if s.status == validity.NOT_CARRIED), None) or next(
            (s for s in seen if s.status == validity.UNVERIFIED), seen[0])

    return dataclasses.replace(harness, probes=dataclasses.replace(harness.probes, knob=knob))
