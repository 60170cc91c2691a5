"""`ab run`: switch the stack between two arms, load it at every level, judge, always restore.

`measure(harness, design, ...)` runs one A/B and returns its judged evidence (unwritten); `ab_run`
is `knobkeeper ab run`: the deploy as the harness, then the evidence written and committed. An A/B
is a sweep with one candidate: both are knobkeeper.evidence.search (the harness, the design, the
blocks, the looks); an A/B orders its blocks ABBA, never drops its candidate (there is no other arm
to give the budget to) and raises where a sweep records a failed candidate and goes on.
The harness (how to switch arms, restore, reach the endpoint, load it) is a parameter, so the same
orchestration drives the real deploy (the deploy with knob_overrides: only the role restarts,
gates included) and tests (a switcher that restarts a sim process with the arm's environment).
The design (levels, repeats, how long each run is, the prompt shape) is one object, `Design`.

Schedule: repeats are blocks of both arms in ABBA order (AB, BA, AB, ...), so a linear drift
(thermal, a neighbour, a cache filling) lands equally on both arms. Each block: switch to the
arm (a restart, also of the arm already running: restart-to-restart variation is part of what the
repeats measure), check that the running engine carries the arm's knob value (`Probes.knob`), one
warm-up load that is measured and recorded (`schedule.extra["warmups"]`) but never judged (on a
real engine the first window after a restart is the noisiest piece: knobkeeper.evidence.judge,
"Real noise"), then every open level once, in ascending order (around each level, the prefill's
prompt-token counter when the stack is disaggregated: `Probes.prefill_tokens`). Whatever
happens — a failed switch, a failed load, Ctrl-C — `restore()` runs at the end, and a failure in
restore is reported above the original error, never swallowed.

Stopping: with `max_repeats` the design is sequential (knobkeeper.evidence.judge: looks after
3, 5, 7, 10, 14, ... repeats, alpha spending, weighted Holm over the family): after each planned
look the settled levels (better/worse, no detectable change, or invalid) are no longer loaded,
and the run ends when every level is settled or at the cap. The rule and every look are
recorded in the evidence's `sequential`, so `verify` can recompute the p-values. With
`repeats` the design is fixed (one look at the end).
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Callable, Mapping

from knobkeeper import __version__
from knobkeeper.deploy import api as deploy_api
from knobkeeper.deploy.api import terminate_as_interrupt
from knobkeeper.deploy.stack import load_stack, running_stack
from knobkeeper.deploy.status import started_knobs
from knobkeeper.deploy.target import target_of
from knobkeeper.engine.pins import evidence_setup
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge, metrics, validity
from knobkeeper.evidence.bench import ToolLoad
from knobkeeper.evidence.defaults import REAL_MAX_REPEATS, REAL_RUN_S, REAL_WARMUP_S
from knobkeeper.evidence.experiment import Experiment, refuse_if_abandoned
from knobkeeper.evidence.metrics import ProcessWatch
from knobkeeper.evidence.model import Arm, Evidence, KnobSeen, Run, Schedule, Sequential, Setup
from knobkeeper.evidence.search import (
    CONTROL,
    Design,
    Harness,
    LoadFn,
    Probes,
    Rules,
    Search,
    Searched,
    Switch,
    _url,
    schedule,
    take_look,
)
from knobkeeper.evidence.store import build_doc, parse_knob_spec, write
from knobkeeper.knobs.state import read_declared, value_of
from knobkeeper.loadgen import run_load

__all__ = ["Design", "Harness", "LoadFn", "Probes", "Stopping", "Switch", "ab_run", "measure", "schedule"]


def knob_seen(arm: Mapping, knob: str, running: dict | None, source: str) -> KnobSeen:
    """knob_seen of a run of `arm` (see validity.knob_seen): `running` is the engine's environment."""
    return validity.knob_seen(arm["knobs"].get(knob), knob, running, source)


class Stopping:
    """The sequential A/B's bookkeeping outside a harness (the benchmarks drive it with synthetic
    runs): which levels are still open, the looks taken — the search's look (search.take_look)."""

    def __init__(self, levels: list[int], max_repeats: int, metric: str = judge.METRIC):
        self.levels, self.metric = sorted(set(levels)), metric
        self.record: Sequential = judge.sequential_rule(max_repeats)
        self.open = list(self.levels)

    def after_repeat(self, repeat: int, runs: list[Run]) -> None:
        """Take the planned look after `repeat` complete repeats (if one is planned there)."""
        if repeat not in self.record.planned_looks or not self.open:
            return
        _, opened, _, _ = take_look(repeat, [Run.of(r) for r in runs], ["B"], ["B"], {"B": self.open}, self.levels,
                                    self.record, Rules(), self.metric)
        self.open = opened.get("B", [])


def measure(harness: Harness, design: Design, *, knob: str, role: str, arms: Mapping[str, Mapping],
            setup: Setup | Mapping | None = None, progress: bool | Any = False,
            raw_files: list[tuple[str, Path]] | None = None,
            on_block: Callable[[Search], Any] | None = None) -> Evidence:
    """Run the A/B and return the judged evidence (not yet written).

    `arms`: {"A": {"label":..., "knobs": {...}}, "B": {...}}; `setup`: what the caller knows of the
    stack (the workload and the schedule are filled in here). `progress`: True for a rich progress
    bar on stderr, or a rich Console to draw it on. `raw_files`: where the result files a benchmark
    tool wrote are listed, as (`A-r1-c8-<file>`, path), for `store.write` to keep beside the evidence.
    `on_block(search)`: after every block (the marker's journal of the runs so far).
    """
    design.check()
    arms = {name: Arm.of(arm).to_json() for name, arm in arms.items()}
    search = Search(harness, design, arms, Rules(order="ABBA"), on_block=on_block, raw_files=raw_files,
                    progress=progress, label="A/B")
    searched = search.run()
    return searched_doc(searched, design, knob=knob, role=role, arms=arms, setup=setup,
                        endpoint=_endpoint(harness), loadgen=harness.load is None)


def searched_doc(searched: Searched, design: Design, *, knob: str, role: str, arms: Mapping[str, Mapping],
                 setup: Setup | Mapping | None, endpoint: str | None, loadgen: bool, pair: str = "B",
                 keep_invalid: bool | None = None, tool: str = "knobkeeper ab run") -> Evidence:
    """The A/B evidence of a search: the control (A) against arm `pair` (as B), with the search's
    schedule, warm-ups and sequential record; `loadgen`: knobkeeper's load generator measured."""
    levels = sorted(set(design.levels))
    runs = [r if r.arm == CONTROL else dataclasses.replace(r, arm="B") for r in searched.runs
            if r.arm in (CONTROL, pair)]
    setup = Setup.of(setup or {})
    setup.workload = design.workload()
    setup.schedule = Schedule(order="ABBA", repeats=design.cap, levels=levels, endpoint=endpoint,
                              design="sequential" if searched.sequential is not None else "fixed",
                              blocks=searched.switches,
                              warmup_requests=None if design.warmup_duration else design.warmup_requests or max(levels),
                              wall_s=searched.wall_s)
    setup.schedule.extra["warmups"] = [dict(w, arm="B") if w["arm"] == pair else w for w in searched.warmups
                                       if w["arm"] in (CONTROL, pair)]   # measured, recorded, never judged
    if design.warmup_duration:
        setup.schedule.extra["warmup_s"] = design.warmup_duration
    if loadgen and setup.bench_tool is None:
        setup.bench_tool, setup.bench_version = "knobkeeper.loadgen", __version__
    return build_doc(knob=knob, role=role, arms={"A": arms[CONTROL], "B": arms[pair]}, runs=runs, setup=setup,
                     source={"tool": tool, "format": None}, sequential=searched.sequential,
                     keep_invalid=design.keep_invalid if keep_invalid is None else keep_invalid)


def partial_doc(journal: Mapping[str, Any], by: str, at: str) -> Evidence | None:
    """The evidence of the runs an interrupted (or killed) `ab run` measured, from its journal
    (knobkeeper.evidence.experiment), marked `interrupted`; None before the first run."""
    if not journal.get("searched"):
        return None
    searched = Searched.from_json(journal["searched"])
    if not searched.runs:
        return None
    design = Design(**journal["design"])
    doc = searched_doc(searched, design, knob=journal["knob"], role=journal["role"], arms=journal["arms"],
                       setup=journal.get("setup"), endpoint=journal.get("endpoint"), loadgen=bool(journal.get("loadgen")),
                       keep_invalid=True)
    doc.interrupted = {"by": by, "at": at, "blocks": len(searched.blocks)}
    return doc


def _endpoint(harness: Harness) -> str | None:
    return _url(harness.endpoint) if harness.endpoint else None


# ---------------------------------------------------------------- `knobkeeper ab run` (project level)

def arms_from_specs(project, role: str, set_spec: str, baseline: str = "current",
                    scope: str | None = None) -> tuple[str, dict[str, dict]]:
    """(knob, arms) from `--set KNOB=VALUE` and `--baseline current|KNOB=VALUE`.

    `current` is the declared value in inventory/knobs.toml (None when unset), in the table of
    `scope` (the inventory's stack and the role: "vllm.decode"; default: the role's own table).
    """
    knob, value = parse_knob_spec(project, set_spec, role, "--set")
    if baseline == "current":
        base = value_of(read_declared(project.knobs_path), scope or role, knob) if project.knobs_path.exists() else None
        label = "baseline (declared)"
    else:
        name, base = parse_knob_spec(project, baseline, role, "--baseline")
        if name != knob:
            raise UserError(f"--baseline {baseline!r}: must set the same knob as --set ({knob})")
        label = "baseline"
    if base == value:
        raise UserError(f"--set {set_spec!r}: the baseline already has {knob}={value}; nothing to compare "
                        f"(for an A/A check pass --baseline {knob}=<other value> or use the library)")
    return knob, {"A": {"label": label, "knobs": {knob: base}}, "B": {"label": "candidate", "knobs": {knob: value}}}


def deploy_harness(project, inventory: str, role: str, knob: str, what: str = "ab run") -> Harness:
    """The harness backed by the real deploy, with the stack's probes and its router as endpoint.

    switch_arm(arm) deploys `inventory` with knob_overrides={role: arm knobs}, only=role and
    restart="co": only that role restarts, and it restarts also when it already runs the arm (a
    restart is the unit of replication: with "changed" the second B of ABBA found B running and
    was measured on the first B's server), and every gate (the router's included) holds before load
    starts; restore() deploys the declared state (restarting what differs). Arm switches are not
    committed as deploy records (record=false: they land in .knobkeeper-state/deploys/); the
    evidence file lists the schedule instead. On a Slurm stack each switch is a new job, and the
    endpoint a function: where its router runs.
    """
    def deploy(overrides: dict | None, restart: str) -> None:
        result = deploy_api.run_deploy(project, inventory, only=role, knob_overrides=overrides, record=False, restart=restart)
        if not result.ok:
            raise UserError(f"{what}: deploy of {inventory} failed: {result.error}")

    def switch_arm(arm: dict) -> None:
        deploy({role: dict(arm["knobs"])}, "co")

    def restore() -> None:
        deploy(None, "changed")

    stack = load_stack(project.root, inventory)
    router = next((s for s in stack.services if s.role == "router"), None)
    endpoint: str | Callable[[], str] | None = router.url if router else None
    if router is not None and target_of(stack).placed_per_run:
        def endpoint() -> str:  # a Slurm job's router moves with each job: where the running one is
            return next(s for s in running_stack(project.root, inventory).services if s.key == router.key).url

    return Harness(switch_arm, restore, endpoint, deploy_probes(project, inventory, role, knob))


def inventory_arms(project, inventory: str, role: str, set_spec: str, baseline: str = "current") -> tuple[str, dict]:
    """arms_from_specs for a deploy through `inventory`: the declared value is read from the stack's
    own table ([vllm.decode]), and a knob not declared there has the baseline the stack RUNS: the
    inventory's `knob_defaults` (deploy/render.py), not "unset" (an override of None would drop that
    default and measure the engine's own)."""
    stack = load_stack(project.root, inventory)
    knob, arms = arms_from_specs(project, role, set_spec, baseline, stack.scope(role))
    if baseline == "current" and arms["A"]["knobs"][knob] is None:
        running = {plan.data.get("knob_defaults", {}).get(role, {}).get(knob) for plan in stack.hosts.values()
                   if plan.role_services(role)}
        if len(running) == 1 and None not in running:
            value = running.pop()
            if value == arms["B"]["knobs"][knob]:
                raise UserError(f"--set {set_spec!r}: the stack already runs {knob}={value} (the inventory's "
                                f"knob_defaults); nothing to compare")
            arms["A"] = {"label": "baseline (inventory default)", "knobs": {knob: value}}
    return knob, arms


def engine_design(design: Design, simulated: bool | None) -> Design:
    """The design with a real engine's defaults filled in (`simulated` False; None: not known, as
    with a custom harness): neither --requests nor --duration -> `--duration` defaults.REAL_RUN_S,
    neither --repeats nor --max-repeats -> the sequential design capped at defaults.REAL_MAX_REPEATS,
    and a block warm-up of defaults.REAL_WARMUP_S seconds unless one was given. Why these: the
    real-noise measurements in knobkeeper.evidence.judge ("Real noise"). The simulated engine keeps
    the one-request-per-stream warm-up (its first window is not slower) and must be told how long."""
    if simulated is not False:
        return design
    if design.repeats is None and design.max_repeats is None:
        design = dataclasses.replace(design, max_repeats=REAL_MAX_REPEATS)
    if design.requests is None and design.duration is None:
        design = dataclasses.replace(design, duration=REAL_RUN_S)
    if design.warmup_requests is None and design.warmup_duration is None:
        design = dataclasses.replace(design, warmup_duration=REAL_WARMUP_S)
    return design


def role_simulated(project, inventory: str, role: str) -> bool | None:
    """Whether the role's engine in this inventory is the simulated one (None: no such role)."""
    families = {svc.family.simulated for svc in load_stack(project.root, inventory).services if svc.role == role}
    return None if not families else all(families)


def engine_of(project, inventory: str, role: str) -> dict:
    """The evidence's setup.engine / engine_version (and stack) of the role in this inventory, as its
    pin says (knobkeeper.engine.role_engine, through the stack)."""
    return evidence_setup(load_stack(project.root, inventory), role)


def deploy_probes(project, inventory: str, role: str, knob: str) -> Probes:
    """Probes backed by the stack: the knob as each of the role's services was started with it
    (the started.sh record `status` reads, or the Slurm job's script), and the prefill services'
    prompt-token counter (the family's name: sglang:prompt_tokens_total, vllm:prompt_tokens_total)
    summed over their /metrics when the stack has a prefill role."""
    stack = load_stack(project.root, inventory)
    services = [s for s in stack.services if s.role == role]
    prefills = [s for s in stack.services if s.role == "prefill"] if role != "prefill" else []
    target = target_of(stack)
    where = target.started_record

    def knob_probe(arm: dict) -> KnobSeen:
        worst = None
        started = started_knobs(project, inventory)  # started.sh, or the Slurm job's script
        for svc in services:
            result = knob_seen(arm, knob, started.get(svc.key), f"{svc.host}/{svc.name} {where}")
            if worst is None or result.status == validity.NOT_CARRIED or (
                    result.status == validity.UNVERIFIED and worst.status == validity.CARRIED):
                worst = result
        return worst or knob_seen(arm, knob, None, f"no {role} service in {inventory}")

    def prefill_tokens() -> float | None:
        total = 0.0
        placed = {s.key: s for s in running_stack(project.root, inventory).services} if target.placed_per_run else {}
        for svc in prefills:
            value = prompt_tokens_total(placed.get(svc.key, svc).url, svc.family.metrics.prompt_tokens)
            if value is None:
                return None
            total += value
        return total


    def workers():   # every engine worker of the stack (a prefill crash spoils a decode A/B too)
        return metrics.targets_of(running_stack(project.root, inventory) if target.placed_per_run else stack)

    return Probes(knob=knob_probe, prefill_tokens=prefill_tokens if prefills else None,
                  workers=ProcessWatch(workers))


def prompt_tokens_total(base_url: str, name: str = "sglang:prompt_tokens_total", timeout: float = 5.0) -> float | None:
    """The sum of the engine's prompt-token counter `name` on `base_url`/metrics (None when unreadable)."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(None, 1)[-1])
                found = True
            except ValueError:
                continue
    return total if found else None


def server_info_knobs(base_url: str, timeout: float = 5.0) -> dict | None:
    """The knobs an engine reports in /get_server_info (the sim's `knobs`), or None."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/get_server_info", timeout=timeout) as resp:
            info = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    knobs = info.get("knobs") if isinstance(info, dict) else None
    return knobs if isinstance(knobs, dict) else None


def ab_run(project, *, inventory: str, role: str, set_spec: str, design: Design, baseline: str = "current",
           endpoint: str | None = None, no_commit: bool = False, progress: bool | Any = False,
           harness: Harness | None = None, bench: Any = None, bench_args: list[str] | tuple[str, ...] = (),
           tokenizer: str | None = None) -> Evidence:
    """`knobkeeper ab run`: A/B through the deploy, then write + commit the evidence; returns the doc.

    Neither `design.repeats` nor `design.max_repeats`: the sequential design with the fixed design's
    power at 3% noise (judge.sequential_repeats). `harness` replaces the deploy-backed one (tests,
    or a custom harness; its probes then default to none: the runs say "unverified"). `bench`: a
    located benchmark tool (knobkeeper.evidence.bench.locate) that loads every level instead of the
    built-in load generator, with `bench_args` appended and `tokenizer` for its --tokenizer; its
    result files are kept beside the evidence.
    """
    refuse_if_abandoned(project)   # an earlier ab run or sweep may have left the stack on an arm
    scope = role
    if harness is None:
        knob, arms = inventory_arms(project, inventory, role, set_spec, baseline)
        design = engine_design(design, role_simulated(project, inventory, role))
        scope = load_stack(project.root, inventory).scope(role)
    else:
        knob, arms = arms_from_specs(project, role, set_spec, baseline)
    if design.requests is None and design.duration is None:
        raise UserError("--requests or --duration: give one (how long each level is measured; on a real "
                        "engine the default is --duration 25)")
    if design.repeats is None and design.max_repeats is None:
        design = dataclasses.replace(design, max_repeats=judge.sequential_repeats(levels=len(set(design.levels)),
                                                                                  guards=True))
    if bench is not None and design.requests is None:
        raise UserError(f"--bench {bench.tool.name}: give --requests (the tools run a number of prompts, "
                        f"not a duration)")
    if bench is not None and design.api not in bench.tool.apis:
        raise UserError(f"--api {design.api}: {bench.tool.label} is run with one of {', '.join(bench.tool.apis)}")
    engine = {"engine": "custom switcher"} if harness is not None else engine_of(project, inventory, role)
    harness = harness or deploy_harness(project, inventory, role, knob)
    if endpoint:
        harness = dataclasses.replace(harness, endpoint=endpoint)
    if not harness.endpoint:
        raise UserError("--endpoint: required (the inventory names no router endpoint)")
    setup = Setup.build(project, inventory=inventory, **engine)
    raw: list[tuple[str, Path]] = []
    with tempfile.TemporaryDirectory(prefix="kk-bench-") as scratch:
        if bench is not None:
            tool_load = ToolLoad(bench, Path(scratch), list(bench_args), tokenizer, design.seed)
            harness = dataclasses.replace(harness, load=tool_load, warm_up=harness.warm_up or run_load)
            setup.bench_tool, setup.bench_version = bench.tool.label, bench.version
            if tokenizer:
                setup.extra["tokenizer"] = tokenizer
        context = {"knob": knob, "role": role, "arms": arms, "design": dataclasses.asdict(design),
                   "setup": setup.to_json(), "endpoint": _endpoint(harness), "loadgen": harness.load is None}
        exp = Experiment(project, kind="ab run", knob=knob, role=role, scope=scope, inventory=inventory, arms=arms,
                         context=context, partial=partial_doc, write=lambda doc: write(project, doc, no_commit=no_commit))
        # A CI job's SIGTERM restores the declared state, as Ctrl-C does; either keeps the runs measured
        # as interrupted evidence, and a SIGKILL leaves the marker `ab abort` reads.
        with exp, terminate_as_interrupt():
            doc = measure(exp.marked(harness), design, knob=knob, role=role, arms=arms, setup=setup,
                          progress=progress, raw_files=raw, on_block=lambda search: exp.journal(search.so_far()))
        if bench is not None:
            said = tool_load.setup or {}
            doc.setup.model = doc.setup.model or said.get("model")
            doc.setup.served_model_name = doc.setup.served_model_name or said.get("served_model_name")
            doc.setup.workload.dataset = said.get("dataset")
            doc.source.format = bench.tool.name
        write(project, doc, raw, no_commit=no_commit)
    return doc
