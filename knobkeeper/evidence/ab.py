"""`ab run`: switch the stack between two arms, load it at every level, judge, always restore.

`measure(harness, design, ...)` runs one A/B and returns its judged evidence (unwritten); `ab_run`
is `knobkeeper ab run`: the deploy as the harness, then the evidence written and committed. The
harness (how to switch arms, restore, reach the endpoint, load it) is a parameter, so the same
orchestration drives the real deploy (the deploy with knob_overrides: only the role restarts,
gates included) and tests (a switcher that restarts a sim process with the arm's environment).
The design (levels, repeats, how long each run is, the prompt shape) is one object, `Design`.

Schedule: repeats are blocks of both arms in ABBA order (AB, BA, AB, ...), so a linear drift
(thermal, a neighbour, a cache filling) lands equally on both arms. Each block: switch to the
arm (a restart: restart-to-restart variation is part of what the repeats measure), check that
the running engine carries the arm's knob value (`Probes.knob`), one warm-up load that is measured
and recorded (`schedule.extra["warmups"]`) but never judged (on a real engine the first window after
a restart is the noisiest piece: knobkeeper.evidence.judge, "Real noise"), then every open level once, in ascending order (around each level, the prefill's
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
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from knobkeeper.errors import UserError
from knobkeeper.evidence import judge as J
from knobkeeper.evidence import validity as V
from knobkeeper.evidence.model import Arm, Evidence, KnobSeen, Look, Run, Schedule, Sequential, Setup, Workload

Switch = Callable[[dict], None]
LoadFn = Callable[..., dict]


@dataclass
class Probes:
    """What `ab run` reads from the stack besides the load: `knob(arm) -> KnobSeen` after each
    switch (status, running value, detail), `prefill_tokens() -> counter | None` (None: the stack
    is not disaggregated), `workers`: every worker's /metrics sampled before and after each run
    (knobkeeper.evidence.metrics.ProcessWatch: a worker replaced during the run restarted there).
    Any may be None (not checked: the runs say "unverified"; restarts are not seen)."""

    knob: Callable[[dict], KnobSeen] | None = None
    prefill_tokens: Callable[[], float | None] | None = None
    workers: Any = None


@dataclass
class Harness:
    """How an A/B reaches the stack: `switch_arm(arm)` must leave the endpoint serving that arm
    (arm: {"label", "knobs"}), `restore()` puts the declared state back, `load(endpoint,
    concurrency, **kw) -> summary` loads it (default: knobkeeper.loadgen.run_load). `endpoint`: a
    URL, or a function that says where it is now (a Slurm job's router moves with each job)."""

    switch_arm: Switch
    restore: Callable[[], None]
    endpoint: str | Callable[[], str] | None
    probes: Probes = field(default_factory=Probes)
    load: LoadFn | None = None
    warm_up: LoadFn | None = None       # the block's warm-up load (default: `load`)


@dataclass
class Design:
    """What one A/B measures. `repeats`: a fixed design of that many blocks per arm; `max_repeats`:
    the sequential design capped there (give one). Each run is `requests` requests or `duration`
    seconds (give one). `warmup_requests`: the block's warm-up load (default: one request per
    stream at the top open level) or `warmup_duration` seconds of it (a real engine's default:
    defaults.REAL_WARMUP_S); `level_warmup`: completions excluded at the start of each level
    (default: one per stream, see knobkeeper.loadgen); `load_options`: more keyword arguments for
    every load (e.g. keepalive=True for an endpoint without the router's keep-alive delay)."""

    levels: list[int]
    repeats: int | None = None
    max_repeats: int | None = None
    requests: int | None = None
    duration: float | None = None
    api: str = "chat"
    input_len: int = 128
    output_len: int = 64
    warmup_requests: int | None = None
    warmup_duration: float | None = None
    level_warmup: int | None = None
    model: str | None = None
    load_options: dict[str, Any] = field(default_factory=dict)
    keep_invalid: bool = False
    seed: int = 0                       # the prompts' seed, the same for every arm, level and repeat

    def check(self) -> None:
        """UserError (one line, naming the option) for a design that cannot run."""
        if (self.repeats is None) == (self.max_repeats is None):
            raise UserError("give one of --repeats (fixed design) or --max-repeats (sequential design)")
        if self.cap < 1:
            raise UserError(f"--{'repeats' if self.max_repeats is None else 'max-repeats'} {self.cap}: expected at "
                            f"least 1 (2 or more to judge)")
        if not self.levels or any(c < 1 for c in self.levels):
            raise UserError(f"--concurrency {self.levels}: expected positive integers, e.g. 64,80,96")
        if (self.requests is None) == (self.duration is None):
            raise UserError("give exactly one of --requests or --duration")
        if self.warmup_requests is not None and self.warmup_duration is not None:
            raise UserError("give at most one of warmup_requests or warmup_duration (the block's warm-up)")

    @property
    def cap(self) -> int:
        return self.repeats if self.max_repeats is None else self.max_repeats

    def workload(self) -> Workload:
        return Workload(api=self.api, input_len=self.input_len, output_len=self.output_len,
                        requests_per_run=self.requests, duration_s=self.duration)


def schedule(repeats: int) -> list[tuple[int, str]]:
    """[(repeat, arm)] in ABBA order: A B B A A B B A ... (each repeat has one block of each arm)."""
    order = []
    for r in range(1, repeats + 1):
        pair = ("A", "B") if r % 2 == 1 else ("B", "A")
        order += [(r, arm) for arm in pair]
    return order


def _run_fields(summary: dict) -> dict[str, Any]:
    """The evidence run's fields from a load summary (knobkeeper.loadgen), or the run a benchmark
    tool's reader read (`summary["run"]`: knobkeeper.evidence.bench), as the reader read it."""
    if "run" in summary:
        return dict(summary["run"])
    keep = ("output_tokens_per_s", "requests_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "completed",
            "errors", "errors_by_kind", "warmup_errors", "window_s", "client_cpu_util")
    out = {k: summary.get(k) for k in keep}
    out["errors"] = int(out.get("errors") or 0)
    if summary.get("requests_target") is not None:
        out["requested"] = summary["requests_target"]
    return out


def knob_seen(arm: Mapping, knob: str, running: dict | None, source: str) -> KnobSeen:
    """knob_seen of a run of `arm` (see validity.knob_seen): `running` is the engine's environment."""
    return V.knob_seen(arm["knobs"].get(knob), knob, running, source)


class Stopping:
    """The sequential design's bookkeeping: which levels are still open, the looks taken."""

    def __init__(self, levels: list[int], max_repeats: int, metric: str = J.METRIC):
        self.levels, self.metric = list(levels), metric
        self.record: Sequential = J.sequential_rule(max_repeats)
        self.open = list(levels)

    def after_repeat(self, repeat: int, runs: list[Run]) -> None:
        """Take the planned look after `repeat` complete repeats (if one is planned there)."""
        if repeat not in self.record.planned_looks or not self.open:
            return
        look = self.record.looks
        look.append(Look(repeat, list(self.open), {}))
        _, invalid = V.assess(runs, self.metric)
        judgement = J.judge(runs, self.metric, invalid=invalid, sequential=self.record)
        for level in judgement.levels:
            if level.concurrency in self.open and J.settled(level):
                look[-1].settled[str(level.concurrency)] = level.verdict
                self.open.remove(level.concurrency)


def measure(harness: Harness, design: Design, *, knob: str, role: str, arms: Mapping[str, Mapping],
            setup: Setup | Mapping | None = None, progress: bool | Any = False,
            raw_files: list[tuple[str, Path]] | None = None) -> Evidence:
    """Run the A/B and return the judged evidence (not yet written).

    `arms`: {"A": {"label":..., "knobs": {...}}, "B": {...}}; `setup`: what the caller knows of the
    stack (the workload and the schedule are filled in here). `progress`: True for a rich progress
    bar on stderr, or a rich Console to draw it on. `raw_files`: where the result files a benchmark
    tool wrote are listed, as (`A-r1-c8-<file>`, path), for `store.write` to keep beside the evidence.
    """
    from knobkeeper.evidence.store import build_doc

    design.check()
    load = harness.load
    if load is None:
        from knobkeeper.loadgen import run_load as load
    arms = {name: Arm.of(arm).to_json() for name, arm in arms.items()}
    levels = sorted(set(design.levels))
    stopping = Stopping(levels, design.cap) if design.max_repeats is not None else None
    plan = schedule(design.cap)
    runs: list[Run] = []
    warmups: list[dict] = []
    bar = _progress(progress, len(plan) * len(levels))
    started = time.time()
    blocks = 0
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("A/B", total=len(plan) * len(levels))
        for index, (repeat, arm) in enumerate(plan):
            todo = stopping.open if stopping is not None else levels
            if not todo:
                break
            if bar is not None:
                bar.update(task, description=f"switch to {arm} (repeat {repeat}/{design.cap})")
            harness.switch_arm(arms[arm])
            blocks += 1
            runs += _block(harness, design, load, arm, repeat, list(todo), arms[arm], raw_files, warmups,
                           lambda conc: bar.update(task, description=f"{arm} @{conc} (repeat {repeat}/{design.cap})")
                           if bar is not None else None,
                           lambda: bar.advance(task) if bar is not None else None)
            if stopping is not None and index % 2 == 1:
                stopping.after_repeat(repeat, runs)
    finally:
        try:
            if bar is not None:
                bar.update(task, description="restoring the declared state")
            harness.restore()
        finally:
            if bar is not None:
                bar.stop()
    setup = Setup.of(setup or {})
    setup.workload = design.workload()
    setup.schedule = Schedule(order="ABBA", repeats=design.cap, levels=levels, endpoint=_url(harness.endpoint),
                              design="sequential" if stopping is not None else "fixed", blocks=blocks,
                              warmup_requests=None if design.warmup_duration else design.warmup_requests or max(levels),
                              wall_s=round(time.time() - started, 3))
    setup.schedule.extra["warmups"] = warmups   # measured, recorded, never judged
    if design.warmup_duration:
        setup.schedule.extra["warmup_s"] = design.warmup_duration
    if harness.load is None and setup.bench_tool is None:
        from knobkeeper import __version__

        setup.bench_tool, setup.bench_version = "knobkeeper.loadgen", __version__
    return build_doc(knob=knob, role=role, arms=arms, runs=runs, setup=setup,
                     source={"tool": "knobkeeper ab run", "format": None},
                     sequential=stopping.record if stopping is not None else None, keep_invalid=design.keep_invalid)


def _block(harness: Harness, design: Design, load: LoadFn, arm: str, repeat: int, todo: list[int], arm_spec: dict,
           raw_files: list | None, warmups: list[dict], on_level: Callable[[int], Any],
           on_done: Callable[[], Any]) -> list[Run]:
    """One block of one arm (already switched to): check the knob, warm up (measured into `warmups`, not
    judged), then every open level once."""
    probes = harness.probes
    url = _url(harness.endpoint)
    seen = probes.knob(arm_spec) if probes.knob is not None else None
    warm_conc = max(todo)
    shape = {"api": design.api, "model": design.model, "input_len": design.input_len, "output_len": design.output_len}
    if design.warmup_duration:
        warm = (harness.warm_up or load)(url, warm_conc, requests=None, duration=design.warmup_duration,
                                         warmup=design.level_warmup, **shape, **design.load_options)
    else:
        warm = (harness.warm_up or load)(url, warm_conc, requests=design.warmup_requests or warm_conc, warmup=0,
                                         **shape, **design.load_options)
    fields = _run_fields(warm) if isinstance(warm, dict) else {}
    warmups.append({"arm": arm, "repeat": repeat, "concurrency": warm_conc,
                    **{k: fields.get(k) for k in ("output_tokens_per_s", "completed", "errors", "window_s")}})
    runs = []
    for conc in todo:
        on_level(conc)
        before = probes.prefill_tokens() if probes.prefill_tokens is not None else None
        processes = probes.workers.sample() if probes.workers is not None else None
        try:
            summary = load(url, conc, requests=design.requests, duration=design.duration,
                           warmup=design.level_warmup, **shape, **design.load_options)
        except UserError as exc:   # a benchmark tool that failed: say where in the schedule
            raise UserError(f"arm {arm} repeat {repeat} @{conc}: {exc}") from None
        run = Run.from_json({**_run_fields(summary), "arm": arm, "repeat": repeat, "concurrency": conc})
        if processes is not None:
            _count_restarts(run, probes.workers.restarts(processes, probes.workers.sample()))
        if summary.get("raw_file") is not None and raw_files is not None:
            path = Path(summary["raw_file"])
            raw_files.append((f"{arm}-r{repeat}-c{conc}-{path.name}", path))
        run.knob_seen = seen
        if before is not None:
            after = probes.prefill_tokens()
            if after is not None:
                run.prefill_prompt_tokens = after - before
        runs.append(run)
        on_done()
    return runs


def _count_restarts(run: Run, restarted: dict[str, tuple[int, int]]) -> None:
    """A run during which workers were replaced: `restarts` {worker: times} (the validity gate
    "restarted" makes its level invalid; RESTARTS_FAIL of arm B fail the candidate), and its errors
    at least the requests in flight at the crashes. At least, not plus: the load generator counts
    every request that failed it, and the crash's requests are among them unless the router retried
    them elsewhere; adding both would count one failure twice."""
    if not restarted:
        return
    run.extra["restarts"] = {key: n for key, (n, _) in sorted(restarted.items())}
    lost = sum(lost for _, lost in restarted.values())
    if run.errors is not None:
        run.errors = max(run.errors, lost)


def _url(endpoint: str | Callable[[], str]) -> str:
    """The endpoint now: a URL, or where a function says it is (a Slurm job's router moves with each job)."""
    return endpoint() if callable(endpoint) else endpoint


def _progress(progress: bool | Any, total: int):
    if not progress:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = progress if isinstance(progress, Console) else Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# ---------------------------------------------------------------- `knobkeeper ab run` (project level)

def arms_from_specs(project, role: str, set_spec: str, baseline: str = "current",
                    scope: str | None = None) -> tuple[str, dict[str, dict]]:
    """(knob, arms) from `--set KNOB=VALUE` and `--baseline current|KNOB=VALUE`.

    `current` is the declared value in inventory/knobs.toml (None when unset), in the table of
    `scope` (the inventory's stack and the role: "vllm.decode"; default: the role's own table).
    """
    from knobkeeper.evidence.store import parse_knob_spec
    from knobkeeper.knobs.state import read_declared, value_of

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


def deploy_harness(project, inventory: str, role: str, knob: str) -> Harness:
    """The harness backed by the real deploy, with the stack's probes and its router as endpoint.

    switch_arm(arm) deploys `inventory` with knob_overrides={role: arm knobs} and only=role, so only
    that role restarts and every gate (the router's included) holds before load starts; restore()
    deploys the declared state. Arm switches are not committed as deploy records (record=false:
    they land in .knobkeeper-state/deploys/); the evidence file lists the schedule instead.
    On a Slurm stack each switch is a new job, and the endpoint a function: where its router runs.
    """
    from knobkeeper.deploy.api import run_deploy
    from knobkeeper.deploy.stack import load_stack, running_stack

    def deploy(overrides: dict | None) -> None:
        result = run_deploy(project, inventory, only=role, knob_overrides=overrides, record=False)
        if not result.ok:
            raise UserError(f"ab run: deploy of {inventory} failed: {result.error}")

    def switch_arm(arm: dict) -> None:
        deploy({role: dict(arm["knobs"])})

    def restore() -> None:
        deploy(None)

    stack = load_stack(project.root, inventory)
    router = next((s for s in stack.services if s.role == "router"), None)
    from knobkeeper.deploy.slurm.job import is_slurm

    endpoint: str | Callable[[], str] | None = router.url if router else None
    if router is not None and is_slurm(stack):
        def endpoint() -> str:  # a Slurm job's router moves with each job: where the running one is
            return next(s for s in running_stack(project.root, inventory).services if s.key == router.key).url

    return Harness(switch_arm, restore, endpoint, deploy_probes(project, inventory, role, knob))


def inventory_arms(project, inventory: str, role: str, set_spec: str, baseline: str = "current") -> tuple[str, dict]:
    """arms_from_specs for a deploy through `inventory`: the declared value is read from the stack's
    own table ([vllm.decode]), and a knob not declared there has the baseline the stack RUNS: the
    inventory's `knob_defaults` (deploy/render.py), not "unset" (an override of None would drop that
    default and measure the engine's own)."""
    from knobkeeper.deploy.stack import load_stack

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
    from knobkeeper.evidence.defaults import REAL_MAX_REPEATS, REAL_RUN_S, REAL_WARMUP_S

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
    from knobkeeper.deploy.stack import load_stack

    families = {svc.family.simulated for svc in load_stack(project.root, inventory).services if svc.role == role}
    return None if not families else all(families)


def engine_of(project, inventory: str, role: str) -> dict:
    """The evidence's setup.engine / engine_version (and stack) of the role in this inventory, as its
    pin says (knobkeeper.engine.role_engine, through the stack)."""
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.engine.pins import evidence_setup

    return evidence_setup(load_stack(project.root, inventory), role)


def deploy_probes(project, inventory: str, role: str, knob: str) -> Probes:
    """Probes backed by the stack: the knob as each of the role's services was started with it
    (the started.sh record `status` reads, or the Slurm job's script), and the prefill services'
    prompt-token counter (the family's name: sglang:prompt_tokens_total, vllm:prompt_tokens_total)
    summed over their /metrics when the stack has a prefill role."""
    from knobkeeper.deploy.stack import load_stack, running_stack
    from knobkeeper.deploy.status import started_knobs

    stack = load_stack(project.root, inventory)
    services = [s for s in stack.services if s.role == role]
    prefills = [s for s in stack.services if s.role == "prefill"] if role != "prefill" else []
    from knobkeeper.deploy.slurm.job import is_slurm

    where = "the job's script" if is_slurm(stack) else "started.sh"

    def knob_probe(arm: dict) -> KnobSeen:
        worst = None
        started = started_knobs(project, inventory)  # started.sh, or the Slurm job's script
        for svc in services:
            result = knob_seen(arm, knob, started.get(svc.key), f"{svc.host}/{svc.name} {where}")
            if worst is None or result.status == V.NOT_CARRIED or (
                    result.status == V.UNVERIFIED and worst.status == V.CARRIED):
                worst = result
        return worst or knob_seen(arm, knob, None, f"no {role} service in {inventory}")

    def prefill_tokens() -> float | None:
        total = 0.0
        placed = {s.key: s for s in running_stack(project.root, inventory).services} if is_slurm(stack) else {}
        for svc in prefills:
            value = prompt_tokens_total(placed.get(svc.key, svc).url, svc.family.metrics.prompt_tokens)
            if value is None:
                return None
            total += value
        return total

    from knobkeeper.evidence.metrics import ProcessWatch, targets_of

    def workers():   # every engine worker of the stack (a prefill crash spoils a decode A/B too)
        return targets_of(running_stack(project.root, inventory) if is_slurm(stack) else stack)

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
    import tempfile

    from knobkeeper.deploy.api import terminate_as_interrupt
    from knobkeeper.evidence.store import write

    if harness is None:
        knob, arms = inventory_arms(project, inventory, role, set_spec, baseline)
        design = engine_design(design, role_simulated(project, inventory, role))
    else:
        knob, arms = arms_from_specs(project, role, set_spec, baseline)
    if design.requests is None and design.duration is None:
        raise UserError("--requests or --duration: give one (how long each level is measured; on a real "
                        "engine the default is --duration 25)")
    if design.repeats is None and design.max_repeats is None:
        design = dataclasses.replace(design, max_repeats=J.sequential_repeats(levels=len(set(design.levels)),
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
            from knobkeeper.evidence.bench import ToolLoad
            from knobkeeper.loadgen import run_load

            tool_load = ToolLoad(bench, Path(scratch), list(bench_args), tokenizer, design.seed)
            harness = dataclasses.replace(harness, load=tool_load, warm_up=harness.warm_up or run_load)
            setup.bench_tool, setup.bench_version = bench.tool.label, bench.version
            if tokenizer:
                setup.extra["tokenizer"] = tokenizer
        with terminate_as_interrupt():  # a CI job's SIGTERM restores the declared state, as Ctrl-C does
            doc = measure(harness, design, knob=knob, role=role, arms=arms, setup=setup, progress=progress,
                          raw_files=raw)
        if bench is not None:
            said = tool_load.setup or {}
            doc.setup.model = doc.setup.model or said.get("model")
            doc.setup.served_model_name = doc.setup.served_model_name or said.get("served_model_name")
            doc.setup.workload.dataset = said.get("dataset")
            doc.source.format = bench.tool.name
        write(project, doc, raw, no_commit=no_commit)
    return doc
