"""The search: arms measured block by block, each switched to by restarting the role — the one code
path of `ab run` (two arms in ABBA order) and `sweep` (the control and many candidates in a seeded
random order). knobkeeper.evidence.ab and knobkeeper.evidence.sweep build their evidence from it.

A block restarts every surviving arm once (the harness's `switch_arm`: a restart, also when the arm
is the one already running, so that every run of an arm comes from a restart of its own: repeats
within one server are not replicates), checks the running engine carries the arm's knobs, measures a
warm-up that is recorded and never judged, then every open level once, in ascending order.

The looks (the sequential design of knobkeeper.evidence.judge: after 3, 5, 7, 10, ... blocks) judge
every candidate against the control in ONE family (judge.judge_arms: weighted Holm over every
(candidate, level, metric), sequential p-values). At a look:

- Settled cells (a candidate's level whose verdict against the control is better, worse, "no
  detectable change" or invalid) are no longer loaded, as in an A/B: with one candidate left.
  While two or more candidates survive every level stays open (ranking them needs every level).
- Elimination (a sweep, not an A/B): each arm's score is the mean over the levels of ln throughput
  in one restart (a restart is the replicate: the levels of one restart share its speed, so the
  score's noise is measured, not assumed independent); the leader is the arm (control included)
  of the highest mean score. A candidate whose upper bound against the leader falls below -delta
  is dropped: Welch's t on the two arms' per-restart scores, one-sided at alpha x Δf / m (Δf: the
  look's share of the alpha spending, m: the plan's number of candidates). Why that level: an arm
  that is within delta of every other arm is dropped only when some look's bound for it against
  the leader of that look misses, and the union over the m possible leaders and the looks (sum of
  Δf = 1) bounds that at alpha; the budget then goes to the survivors.
- A candidate that fails (its switch: a gate timeout, a start-up crash; its runs: a validity gate
  such as errors over 5%, the knob not carried, worker restarts) is recorded with its cause and
  measured no more (`fail_arms`; an A/B raises instead, as it always did). The control failing ends
  the search (nothing to compare with).

The search stops at the cap, when the budget's minutes would not hold one more block, when no
candidate is left, when the last candidate has settled every level, or when every surviving
candidate has settled every level and the candidates that could be adopted cannot be told apart
within ±delta (their interval against the best inside it).

Pick (`pick`): a candidate is adoptable when it beats the control by more than delta at the family
level — some level's throughput verdict "better" (Holm, sequential) with an effect above delta —
with no level "worse" and no guard judged worse (a latency regression in the same family). No
adoptable candidate: keep the control (a valid result, ties go to the control). Otherwise the best
adoptable one by score, and the adoptable ones that cannot be told from it (not droppable against
it at the last look's bound) are ties: broken toward the value closest to the engine's default
(where the catalog or registry knows one), else the best stays.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from knobkeeper import fmt
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge, validity
from knobkeeper.evidence.defaults import ALPHA
from knobkeeper.evidence.model import (ADOPT, KEEP, METRIC, NO_PICK, ArmFailure, Evidence, Judgement, KnobSeen, Look,
                                       Pick, Run, Sequential, SweepBlock, SweepLook, SweepPlan, Workload)

CONTROL = "A"
Switch = Callable[[dict], None]
LoadFn = Callable[..., dict]


@dataclass
class Probes:
    """What a search reads from the stack besides the load: `knob(arm) -> KnobSeen` after each
    switch (status, running value, detail), `prefill_tokens() -> counter | None` (None: the stack
    is not disaggregated), `workers`: every worker's /metrics sampled before and after each run
    (knobkeeper.evidence.metrics.ProcessWatch: a worker replaced during the run restarted there).
    Any may be None (not checked: the runs say "unverified"; restarts are not seen)."""

    knob: Callable[[dict], KnobSeen] | None = None
    prefill_tokens: Callable[[], float | None] | None = None
    workers: Any = None


@dataclass
class Harness:
    """How a search reaches the stack: `switch_arm(arm)` must leave the endpoint serving that arm
    from a fresh restart (arm: {"label", "knobs"}), `restore()` puts the declared state back,
    `load(endpoint, concurrency, **kw) -> summary` loads it (default: knobkeeper.loadgen.run_load).
    `endpoint`: a URL, or a function that says where it is now (a Slurm job's router moves with each job)."""

    switch_arm: Switch
    restore: Callable[[], None]
    endpoint: str | Callable[[], str] | None
    probes: Probes = field(default_factory=Probes)
    load: LoadFn | None = None
    warm_up: LoadFn | None = None       # the block's warm-up load (default: `load`)


@dataclass
class Design:
    """What one A/B or sweep measures. `repeats`: a fixed design of that many blocks per arm;
    `max_repeats`: the sequential design capped there (give one). Each run is `requests` requests or
    `duration` seconds (give one). `warmup_requests`: the block's warm-up load (default: one request
    per stream at the top open level) or `warmup_duration` seconds of it (a real engine's default:
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

    def load_fields(self) -> dict[str, Any]:
        """How each run loads the stack, as a plan records it (the levels and the budget are its own)."""
        return {"requests": self.requests, "duration": self.duration, "api": self.api, "input_len": self.input_len,
                "output_len": self.output_len, "warmup_requests": self.warmup_requests,
                "warmup_duration": self.warmup_duration, "level_warmup": self.level_warmup, "model": self.model,
                "seed": self.seed}


# ---------------------------------------------------------------- the order of a block

def block_order(order: str, seed: int, repeat: int, arms: list[str]) -> list[str]:
    """The arms of block `repeat` in the order they are restarted: "ABBA" (two arms: A B, then B A,
    ...: a linear drift lands equally on both) or "random" (a shuffle seeded by (seed, repeat), so the
    plan's seed and the arms that survived say every block's order: `check` recomputes it)."""
    members = sorted(arms)
    if order == "ABBA":
        return members if repeat % 2 == 1 else members[::-1]
    random.Random(f"knobkeeper-sweep:{seed}:{repeat}").shuffle(members)
    return members


def schedule(repeats: int) -> list[tuple[int, str]]:
    """[(repeat, arm)] in ABBA order: A B B A A B B A ... (each repeat has one block of each arm)."""
    return [(r, arm) for r in range(1, repeats + 1) for arm in block_order("ABBA", 0, r, ["A", "B"])]


# ---------------------------------------------------------------- the statistics of a look

def block_scores(runs: list[Run], arm: str, levels: list[int], metric: str = METRIC) -> dict[int, float]:
    """{repeat: the mean over `levels` of ln throughput} of the restarts of `arm` that ran every level
    without errors: one number per restart, the replicate a sweep ranks arms by."""
    by: dict[int, dict[int, float]] = {}
    for run in runs:
        value = run.value(metric)
        if run.arm == arm and not run.failed and value is not None and int(run.concurrency) in levels:
            by.setdefault(int(run.repeat), {})[int(run.concurrency)] = math.log(value)
    return {rep: sum(vals.values()) / len(vals) for rep, vals in by.items() if len(vals) == len(levels)}


def score_compare(runs: list[Run], x: str, y: str, levels: list[int], metric: str = METRIC) -> judge.Comparison:
    """Welch's t of arm x's per-restart scores against arm y's (effect: x over y, averaged over levels)."""
    sx, sy = block_scores(runs, x, levels, metric), block_scores(runs, y, levels, metric)
    return judge.compare([math.exp(v) for v in sy.values()], [math.exp(v) for v in sx.values()])


def mean_score(runs: list[Run], arm: str, levels: list[int], metric: str = METRIC) -> float | None:
    scores = block_scores(runs, arm, levels, metric)
    return sum(scores.values()) / len(scores) if scores else None


def bound_level(alpha: float, share: float, candidates: int) -> float:
    """The one-sided level of an elimination bound at a look spending `share` of alpha (see the module doc)."""
    return alpha * share / max(1, candidates)


def interval(cmp: judge.Comparison, one_sided: float) -> tuple[float, float] | None:
    return cmp.interval(one_sided) if cmp.p_value is not None else None


def leader(runs: list[Run], arms: list[str], levels: list[int], metric: str = METRIC) -> str | None:
    """The arm of the highest mean score among `arms` (ties: the first, the control before candidates)."""
    best, top = None, None
    for arm in arms:
        score = mean_score(runs, arm, levels, metric)
        if score is not None and (top is None or score > top + 1e-12):
            best, top = arm, score
    return best


def droppable(runs: list[Run], arm: str, against: str, levels: list[int], delta: float, one_sided: float,
              metric: str = METRIC) -> str | None:
    """The bound that drops `arm` against `against` (its upper bound below -delta), as text, else None."""
    bounds = interval(score_compare(runs, arm, against, levels, metric), one_sided)
    if bounds is None or bounds[1] >= -delta:
        return None
    return f"upper bound {fmt.pct(bounds[1])} vs {against} < -{delta:.1%} (one-sided {one_sided:.2g})"


def tied(runs: list[Run], arm: str, against: str, levels: list[int], delta: float, one_sided: float,
         metric: str = METRIC) -> bool:
    """Whether `arm`'s interval against `against` lies inside ±delta (the two cannot be told apart)."""
    bounds = interval(score_compare(runs, arm, against, levels, metric), one_sided)
    return bounds is not None and bounds[0] > -delta and bounds[1] < delta


def adoptable(judged: Judgement | None, delta: float) -> bool:
    """Whether a candidate beats the control by more than delta at the family level (see the module doc)."""
    if judged is None:
        return False
    valid = [lv for lv in judged.levels if lv.valid]
    return (any(lv.verdict == "better" and (lv.effect or 0) > delta for lv in valid)
            and not any(lv.verdict == "worse" for lv in valid) and not judged.regressions)


def pair_invalid(runs: list[Run], arm: str, metric: str = METRIC) -> dict[int, list[str]]:
    """The validity gates' invalid levels of the pair (control, `arm`) (validity.assess, B = the arm)."""
    pair = [r if r.arm == CONTROL else judge._as_arm(r, "B") for r in runs if r.arm in (CONTROL, arm)]
    return validity.assess(pair, metric)[1]


def judge_family(runs: list[Run], candidates: list[str], sequential: Sequential | None,
                 metric: str = METRIC, alpha: float = ALPHA, sizing: bool = True) -> dict[str, Judgement]:
    """Every candidate with runs against the control, one family (judge.judge_arms; `sizing=False`: a
    look's, without the repeats each inconclusive level would need)."""
    measured = [c for c in candidates if any(r.arm == c for r in runs)]
    if not measured:
        return {}
    return judge.judge_arms(runs, CONTROL, measured, metric, alpha=alpha,
                            invalid={c: pair_invalid(runs, c, metric) for c in measured}, sequential=sequential,
                            sizing=sizing)


@dataclass
class Rules:
    """What a search does at its looks: `order` of the blocks ("ABBA" | "random" with `seed`),
    `eliminate` (a sweep: drop arms against the leader; an A/B: never), `delta` the indifference
    margin, `fail_arms` (a sweep: a failing candidate is recorded and dropped; an A/B: raises),
    `minutes` the wall-time budget (None: none), `candidates` the plan's m (the elimination's level),
    `first_look` the blocks before the first look (a sweep: SWEEP_FIRST_LOOK)."""

    order: str = "ABBA"
    seed: int = 0
    eliminate: bool = False
    delta: float = judge.MDE
    alpha: float = ALPHA
    fail_arms: bool = False
    minutes: float | None = None
    candidates: int = 1
    first_look: int = judge.FIRST_LOOK


def take_look(repeat: int, runs: list[Run], candidates: list[str], alive: list[str],
              open_levels: Mapping[str, list[int]], levels: list[int], sequential: Sequential, rules: Rules,
              metric: str = METRIC) -> tuple[SweepLook, dict[str, list[int]], list[str], dict[str, Judgement]]:
    """One look after `repeat` blocks: (its record, the open levels after it, the arms alive after it,
    the family's judgement). A pure function of the runs: the search takes it, `verify` replays it."""
    previous = sequential.looks[-1].repeat if sequential.looks and sequential.looks[-1].repeat < repeat else 0
    if not sequential.looks or sequential.looks[-1].repeat != repeat:
        sequential.looks.append(Look(repeat, sorted({c for arm in alive for c in open_levels.get(arm, [])}), {}))
    judged = judge_family(runs, candidates, sequential, metric, rules.alpha, sizing=False)
    record = SweepLook(repeat=repeat, survivors=[CONTROL] + list(alive))
    opened = {arm: list(open_levels.get(arm, [])) for arm in alive}
    for arm in alive:
        for lv in judged[arm].levels if arm in judged else []:
            if lv.concurrency in opened[arm] and judge.settled(lv):
                record.settled.setdefault(arm, {})[str(lv.concurrency)] = lv.verdict
    still = list(alive)
    if rules.eliminate:
        share = judge.spent(repeat, previous, int(sequential.max_repeats))
        one_sided = bound_level(rules.alpha, share, rules.candidates)
        record.leader = leader(runs, [CONTROL] + still, levels, metric)
        if record.leader is not None:
            for arm in list(still):
                if arm == record.leader:
                    continue
                why = droppable(runs, arm, record.leader, levels, rules.delta, one_sided, metric)
                if why:
                    record.eliminated[arm] = why
                    still.remove(arm)
    if not rules.eliminate or len(still) <= 1:   # one candidate: its settled levels are done, as in an A/B
        for arm in still:
            done = {int(c) for c in record.settled.get(arm, {})}
            opened[arm] = [c for c in opened[arm] if c not in done]
    else:                                         # several: every level stays open to rank them
        for arm in still:
            opened[arm] = list(levels)
    if len(candidates) == 1 and candidates[0] in record.settled:   # the A/B's record of its looks
        sequential.looks[-1].settled = dict(record.settled[candidates[0]])
    opened = {arm: opened[arm] for arm in still}
    return record, opened, still, judged


def stop_reason(record: SweepLook, alive: list[str], open_levels: Mapping[str, list[int]], runs: list[Run],
                levels: list[int], judged: Mapping[str, Judgement], settled: Mapping[str, set[int]],
                sequential: Sequential, rules: Rules, metric: str = METRIC) -> str | None:
    """Why the search stops after this look (see the module doc), else None."""
    if not alive:
        return "no candidate left (every one dropped or failed)"
    if not any(open_levels.get(arm) for arm in alive):
        return "every level settled"
    if not rules.eliminate or len(alive) < 2:
        return None
    if any(set(levels) - settled.get(arm, set()) for arm in alive):
        return None
    previous = next((lk.repeat for lk in reversed(sequential.looks) if lk.repeat < record.repeat), 0)
    one_sided = bound_level(rules.alpha, judge.spent(record.repeat, previous, int(sequential.max_repeats)),
                            rules.candidates)
    good = [arm for arm in alive if adoptable(judged.get(arm), rules.delta)]
    best = leader(runs, good, levels, metric) if good else None
    if best is None or all(tied(runs, arm, best, levels, rules.delta, one_sided, metric) for arm in good if arm != best):
        return "every candidate settled; the ones worth adopting cannot be told apart"
    return None


# ---------------------------------------------------------------- the search

@dataclass
class Searched:
    """What a search measured and decided on the way: every run and warm-up, each block's order,
    the sequential record (its looks), each look's record, the failures, why it stopped."""

    runs: list[Run]
    warmups: list[dict]
    blocks: list[dict]
    sequential: Sequential | None
    looks: list[SweepLook]
    failed: dict[str, ArmFailure]
    switches: int
    wall_s: float
    stopped: str
    alive: list[str]

    def to_json(self) -> dict[str, Any]:
        """As a marker's journal keeps it (deploy/experiment_state): everything a partial evidence needs."""
        return {"runs": [r.to_json() for r in self.runs], "warmups": list(self.warmups), "blocks": list(self.blocks),
                "sequential": self.sequential.to_json() if self.sequential is not None else None,
                "looks": [lk.to_json() for lk in self.looks], "failed": {k: f.to_json() for k, f in self.failed.items()},
                "switches": self.switches, "wall_s": self.wall_s, "stopped": self.stopped, "alive": list(self.alive)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Searched":
        return cls([Run.from_json(r) for r in data.get("runs") or []], list(data.get("warmups") or []),
                   list(data.get("blocks") or []),
                   Sequential.from_json(data["sequential"]) if data.get("sequential") else None,
                   [SweepLook.from_json(lk) for lk in data.get("looks") or []],
                   {k: ArmFailure.from_json(f) for k, f in (data.get("failed") or {}).items()},
                   int(data.get("switches") or 0), float(data.get("wall_s") or 0.0), str(data.get("stopped") or ""),
                   list(data.get("alive") or []))


class Search:
    """One search over `arms` ({name: {"label", "knobs"}}, "A" the control) with `harness`, `design`
    and `rules`. `on_block(search)` is called after every arm's block (the experiment's journal);
    `progress` draws a bar (True, or a rich Console). `run()` measures; the harness's restore is the
    caller's (it must run whatever happens)."""

    def __init__(self, harness: Harness, design: Design, arms: Mapping[str, Mapping], rules: Rules, *,
                 metric: str = METRIC, on_block: Callable[["Search"], Any] | None = None,
                 raw_files: list[tuple[str, Path]] | None = None, progress: bool | Any = False,
                 label: str = "search"):
        self.harness, self.design, self.rules, self.metric = harness, design, rules, metric
        self.arms = {name: dict(arm) for name, arm in arms.items()}
        self.levels = sorted(set(design.levels))
        self.candidates = [a for a in self.arms if a != CONTROL]
        self.alive = list(self.candidates)
        self.open = {arm: list(self.levels) for arm in self.candidates}
        self.settled: dict[str, set[int]] = {arm: set() for arm in self.candidates}
        self.sequential = (judge.sequential_rule(design.cap, rules.first_look) if design.max_repeats is not None
                           else None)
        self.runs: list[Run] = []
        self.warmups: list[dict] = []
        self.blocks: list[dict] = []
        self.looks: list[SweepLook] = []
        self.failed: dict[str, ArmFailure] = {}
        self.switches = 0
        self.stopped = ""
        self.on_block, self.raw_files, self.progress, self.label = on_block, raw_files, progress, label
        self.started = time.time()

    def todo(self, arm: str) -> list[int]:
        """The levels `arm` is loaded at in the next block: the control at every level a candidate is open at."""
        if arm == CONTROL:
            return [c for c in self.levels if any(c in self.open.get(a, []) for a in self.alive)]
        return list(self.open.get(arm, [])) if arm in self.alive else []

    def fail(self, arm: str, repeat: int, cause: str, detail: str) -> None:
        self.failed[arm] = ArmFailure(repeat=repeat, cause=cause, detail=fmt.safe(detail)[:500])
        if arm in self.alive:
            self.alive.remove(arm)

    def so_far(self, started: float | None = None) -> Searched:
        """What was measured until now (a journal, or the result)."""
        wall = round(time.time() - (started if started is not None else self.started), 3)
        return Searched(list(self.runs), list(self.warmups), list(self.blocks), self.sequential, list(self.looks),
                        dict(self.failed), self.switches, wall, self.stopped, list(self.alive))

    def run(self, restore: bool = True) -> Searched:
        """Measure until a stop; with `restore`, the harness's restore runs at the end whatever happens
        (a failed switch, a failed load, Ctrl-C), and a failure in it is reported above the original
        error, never swallowed."""
        load = self.harness.load
        if load is None:
            # lazy for start-up cost: the store imports this module, and loadgen brings asyncio
            # (+20 ms, -X importtime) to every command that only reads evidence
            from knobkeeper.loadgen import run_load as load
        self.design.check()
        started = self.started = time.time()
        total = self.design.cap * len(self.arms) * len(self.levels)
        bar = _progress(self.progress, total)
        task = None
        try:
            if bar is not None:
                bar.start()
                task = bar.add_task(self.label, total=total)
            for repeat in range(1, self.design.cap + 1):
                if not any(self.todo(a) for a in self.alive):
                    break
                block_started = time.monotonic()
                order = block_order(self.rules.order, self.rules.seed, repeat, [CONTROL] + self.alive)
                self.blocks.append({"repeat": repeat, "order": order})
                for arm in order:
                    self._arm_block(arm, repeat, load, bar, task)
                if self.sequential is not None and repeat in self.sequential.planned_looks and self.alive:
                    self._look(repeat)
                    if self.on_block is not None:
                        self.on_block(self)
                if self.stopped:
                    break
                if self.rules.minutes is not None and repeat < self.design.cap:
                    spent = time.time() - started
                    if spent + (time.monotonic() - block_started) > self.rules.minutes * 60:
                        self.stopped = f"the budget's {self.rules.minutes:g} minutes would not hold another block"
                        break
            if not self.stopped:
                self.stopped = ("no candidate left (every one dropped or failed)" if not self.alive else
                                "every level settled" if not any(self.todo(a) for a in self.alive) else
                                f"the cap of {self.design.cap} blocks")
        finally:
            try:
                if restore:
                    if bar is not None:
                        bar.update(task, description="restoring the declared state")
                    self.harness.restore()
            finally:
                if bar is not None:
                    bar.stop()
        return self.so_far(started)

    def _arm_block(self, arm: str, repeat: int, load: LoadFn, bar, task) -> None:
        todo = self.todo(arm)
        if not todo:
            return
        if bar is not None:
            bar.update(task, description=f"switch to {arm} (repeat {repeat}/{self.design.cap})")
        try:
            self.harness.switch_arm(self.arms[arm])
        except UserError as exc:
            if arm == CONTROL or not self.rules.fail_arms:
                raise
            self.fail(arm, repeat, "switch", str(exc))
            return
        self.switches += 1
        runs = _block(self.harness, self.design, load, arm, repeat, todo, self.arms[arm], self.raw_files,
                      self.warmups,
                      lambda conc: bar.update(task, description=f"{arm} @{conc} (repeat {repeat}/{self.design.cap})")
                      if bar is not None else None,
                      lambda: bar.advance(task) if bar is not None else None)
        self.runs += runs
        if self.rules.fail_arms and arm != CONTROL:
            reasons = [why for run in runs for why in validity.run_reasons(run, self.metric)]
            if reasons:
                self.fail(arm, repeat, "runs", reasons[0])
        if self.on_block is not None:
            self.on_block(self)

    def _look(self, repeat: int) -> None:
        assert self.sequential is not None
        record, self.open, alive, judged = take_look(repeat, self.runs, self.candidates, self.alive, self.open,
                                                     self.levels, self.sequential, self.rules, self.metric)
        for arm, cells in record.settled.items():
            self.settled.setdefault(arm, set()).update(int(c) for c in cells)
        self.alive = alive
        why = stop_reason(record, self.alive, self.open, self.runs, self.levels, judged, self.settled,
                          self.sequential, self.rules, self.metric)
        if why:
            record.stop = self.stopped = why
        self.looks.append(record)


# ---------------------------------------------------------------- the pick

def pick(runs: list[Run], candidates: list[str], arms: Mapping[str, Mapping], judged: Mapping[str, Judgement],
         alive: list[str], failed: Mapping[str, ArmFailure], levels: list[int], sequential: Sequential | None,
         delta: float, alpha: float = ALPHA, engine_default: Any = None, metric: str = METRIC) -> Pick:
    """The pick by the rule (see the module doc), from the search's final judgement."""
    rule = (f"adopt a candidate only if some level is better than the control at the family level by more than "
            f"{delta:.1%} with no level worse and no guard regression; the best adoptable by score (mean ln "
            f"throughput over the levels per restart); the adoptable ones not shown {delta:.1%} worse than it are "
            f"ties, broken toward the value closest to the engine default; none adoptable: keep the control")
    good = [arm for arm in candidates if arm in alive and arm not in failed and adoptable(judged.get(arm), delta)]
    if not good:
        why = "no candidate beat the control by more than delta at the family level"
        failures = [f"{arm} failed ({f.cause}: {f.detail})" for arm, f in failed.items()]
        return Pick(outcome=KEEP, arm=CONTROL, knobs=dict(arms[CONTROL]["knobs"]),
                    reason="; ".join([why] + failures), rule=rule)
    best = leader(runs, good, levels, metric) or good[0]
    last = sequential.looks[-1].repeat if sequential and sequential.looks else None
    if last is not None:
        previous = sequential.looks[-2].repeat if len(sequential.looks) > 1 else 0
        one_sided = bound_level(alpha, judge.spent(last, previous, int(sequential.max_repeats)), len(candidates))
    else:
        one_sided = alpha / max(1, len(candidates))
    ties = [best] + [arm for arm in good if arm != best
                     and droppable(runs, arm, best, levels, delta, one_sided, metric) is None]
    chosen = _toward_default(ties, arms, engine_default) if len(ties) > 1 else best
    reason = f"{chosen} beat the control by more than {delta:.1%} at the family level"
    if len(ties) > 1:
        decided = engine_default is not None and _distance(chosen, arms, engine_default) < math.inf
        reason += (f"; cannot be told from the best (not shown {delta:.1%} worse): {', '.join(ties)}; "
                   + (f"closest to the engine default {fmt.value(engine_default)}" if decided else
                      f"the best kept ({'none is near the engine default ' + fmt.value(engine_default) if engine_default is not None else 'no engine default known'})"))
    return Pick(outcome=ADOPT, arm=chosen, knobs=dict(arms[chosen]["knobs"]), reason=reason, rule=rule, best=best,
                tied=ties if len(ties) > 1 else [])


def _toward_default(ties: list[str], arms: Mapping[str, Mapping], default: Any) -> str:
    """Of tied arms (the best first), the one whose single knob is closest to the engine's default
    (numerically, or equal as text); without a default, or with several knobs, the best."""
    if default is None:
        return ties[0]
    return min(ties, key=lambda arm: (_distance(arm, arms, default), ties.index(arm)))


def _distance(arm: str, arms: Mapping[str, Mapping], default: Any) -> float:
    """How far the arm's single knob is from the engine default: numerically, or 0/inf as text."""
    knobs = arms[arm]["knobs"]
    if len(knobs) != 1:
        return math.inf
    value = next(iter(knobs.values()))
    try:
        return abs(float(value) - float(default))
    except (TypeError, ValueError):
        return 0.0 if fmt.value(value) == fmt.value(default) else math.inf


# ---------------------------------------------------------------- one block of one arm

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
    # rich's console and progress (~25 ms) only when a progress bar is asked for
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = progress if isinstance(progress, Console) else Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# ---------------------------------------------------------------- a sweep's pick, and its verification

def final_pick(plan: SweepPlan, searched: Searched) -> Pick:
    """The pick by the rule from the search's runs (pick, the plan's delta, alpha and default)."""
    judged = judge_family(searched.runs, plan.candidates, searched.sequential, plan.metric, plan.alpha)
    arms = {k: v.to_json() for k, v in plan.arms.items()}
    return pick(searched.runs, plan.candidates, arms, judged, searched.alive, searched.failed, plan.levels,
                searched.sequential, plan.delta, plan.alpha, plan.engine_default, plan.metric)


def verify_sweep(doc: Evidence) -> list[str]:
    """Every way a sweep's stored judgement, eliminations and pick depart from what its runs give."""
    block = doc.sweep
    if block is None:
        return []
    plan = block.plan
    out: list[str] = []
    fresh = judge_family(block.runs, plan.candidates, block.sequential, plan.metric, plan.alpha)
    for arm in sorted(set(fresh) | set(block.judgement)):
        if arm not in fresh or arm not in block.judgement:
            out.append(f"sweep.judgement.{arm}: {'stored but not judgeable from the runs' if arm not in fresh else 'missing'}")
            continue
        mine = {lv.concurrency: lv for lv in block.judgement[arm].levels}
        for lv in fresh[arm].levels:
            stored = mine.get(lv.concurrency)
            if stored is None or stored.verdict != lv.verdict:
                out.append(f"sweep.judgement.{arm} at {lv.concurrency}: stored verdict "
                           f"{stored.verdict if stored else 'none'} but the runs give {lv.verdict}")
            elif not all(_close(getattr(stored, k), getattr(lv, k)) for k in ("effect", "p_value", "p_adjusted")):
                out.append(f"sweep.judgement.{arm} at {lv.concurrency}: stored effect/p differ from what the runs give")
    out += _replay_looks(block)
    if block.status == "interrupted":
        if block.pick.outcome != NO_PICK:
            out.append(f"sweep.pick: an interrupted sweep picks nothing, it says {block.pick.outcome}")
        return out
    searched = Searched(block.runs, block.warmups, block.blocks, block.sequential, block.looks, block.failed, 0, 0.0,
                        block.stopped, _alive_at_end(block))
    again = final_pick(plan, searched)
    stored = block.pick
    if stored.confirmed is False:
        again = dataclasses.replace(again, outcome=KEEP, arm=CONTROL)
    if (stored.outcome, stored.arm) != (again.outcome, again.arm):
        out.append(f"sweep.pick: stored {stored.outcome} {stored.arm} but the runs give {again.outcome} {again.arm}")
    if block.confirm is not None and stored.confirmed is not None:
        ok = adoptable(doc.judgement, plan.delta)
        if ok != bool(stored.confirmed) and "failed" not in (stored.reason or ""):
            out.append(f"sweep.pick.confirmed: stored {stored.confirmed} but the confirming runs give {ok}")
    return out


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-9)


def _alive_at_end(block: SweepBlock) -> list[str]:
    gone = set(block.failed) | {arm for look in block.looks for arm in look.eliminated}
    return [arm for arm in block.plan.candidates if arm not in gone]


def _replay_looks(block: SweepBlock) -> list[str]:
    """Each recorded look taken again on the runs up to it: the same leader and eliminations."""
    plan = block.plan
    if block.sequential is None:
        return []
    rules = Rules(order=plan.order, seed=plan.seed, eliminate=len(plan.candidates) > 1, delta=plan.delta,
                  alpha=plan.alpha, fail_arms=True, candidates=len(plan.candidates))
    sequential = Sequential.of(dict(block.sequential.to_json(), looks=[]))
    alive, opened = list(plan.candidates), {arm: list(plan.levels) for arm in plan.candidates}
    out = []
    for look in block.looks:
        alive = [arm for arm in alive if not (arm in block.failed and block.failed[arm].repeat <= look.repeat)]
        runs = [r for r in block.runs if int(r.repeat) <= look.repeat]
        record, opened, alive, _ = take_look(look.repeat, runs, plan.candidates, alive, opened, plan.levels,
                                             sequential, rules, plan.metric)
        if sorted(record.eliminated) != sorted(look.eliminated) or record.leader != look.leader:
            out.append(f"sweep.looks after {look.repeat}: stored leader {look.leader}, dropped "
                       f"{sorted(look.eliminated) or 'none'} but the runs give leader {record.leader}, dropped "
                       f"{sorted(record.eliminated) or 'none'}")
    return out
