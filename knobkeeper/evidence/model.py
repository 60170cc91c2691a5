"""The evidence file as typed parts: `Evidence` and its parts, read from and written to JSON here
only (as deploy/record.py does for deploy records). schema.py says what a valid file holds.

    Evidence   one A/B result: knob, role, arms A/B, setup, runs, judgement, validity, anomalies,
               source; optionally the sequential looks, the judgement's options, a canary block
    Arm        {"label", "knobs": {KNOB: value | null}}
    Setup      where and how it was measured (engine and version, model, bench tool, workload)
    Run        one arm at one level in one repeat: throughput, latencies, request counts
    Judgement  the family-wise verdicts: a Level per concurrency, a Guard per latency metric
    Validity   per level: the gates it failed (and those that could not be applied)
    Window     one canary window: each worker's WindowStats and its validity (in a CanaryBlock, with
               the CanarySource that measured them and the ErrorsTest of each side's ErrorCounts)

Every part's attribute names are its JSON keys (`doc.judgement.levels[0].verdict` is the file's
`["judgement"]["levels"][0]["verdict"]`). Parts are read by attribute only, not by key: a field
read is a field declared here, so a reader cannot drift from the schema unseen. Keys a part does
not declare (a tool's own numbers in a run, a canary's extra fields) are kept in its `extra`, read
as `part.extra[KEY]`, and written back. `to_json()` gives the file's JSON, a fresh copy; parts
compare equal when their JSON is (compare a part with JSON data by `part.to_json() == {...}`).

What the model answers, once for every reader (the CLI, review, report, audit, the canary):
`Evidence.is_adjusted` (schema 2 verdicts are family-wise; schema 1 were per level),
`Evidence.p_cell(level)` (the p a verdict rests on, as shown), `Evidence.level_text(level)` (one
text for a level), `Evidence.summary_line()`, `Evidence.gains()` (the levels that count),
`Evidence.scope` (the knobs.toml table it measured), `Evidence.backs(knob, scope, value)` (does it
back that change), `Evidence.disagreements()` (does it agree with itself) and
`Evidence.departures_from(original)` (does a re-judgement hold what it re-judges).
`Setup.build(...)` is the one setup every producer fills in.
"""

from __future__ import annotations

import math
import re
from dataclasses import field
from typing import Any, Callable, ClassVar, Mapping

from knobkeeper import fmt, gitio
from knobkeeper.declared import Check, Declared, declared, extra_field, fact
from knobkeeper.evidence.defaults import ALPHA, IMBALANCE
from knobkeeper.knobs.values import scope, split_scope

SCHEMA = "knobkeeper.evidence/2"
SCHEMA_1 = "knobkeeper.evidence/1"
SCHEMAS = (SCHEMA_1, SCHEMA)
METRIC = "output_tokens_per_s"
VERDICTS = ("better", "worse", "no detectable change", "inconclusive", "invalid")
ACTIONABLE = ("better", "worse")

# guard metric -> (run field, percentile key, label): the latencies judged beside throughput
GUARDS = {
    "ttft_p50_ms": ("ttft_ms", "p50", "median TTFT"),
    "ttft_p99_ms": ("ttft_ms", "p99", "p99 TTFT"),
    "tpot_p50_ms": ("tpot_ms", "p50", "median TPOT"),
    "tpot_p99_ms": ("tpot_ms", "p99", "p99 TPOT"),
}


# ---------------------------------------------------------------- the parts

@declared
class Arm(Declared):
    """One arm: its label and the knob values it ran with (null: the knob unset)."""

    label: str = ""
    knobs: dict[str, Any] = fact(factory=dict, required=True, expected="an object of knob values")
    extra: dict[str, Any] = extra_field()


@declared
class Workload(Declared):
    """What load was run: the API, prompt shape and how long each run was."""

    api: str | None = None              # "chat" | "completions" | "generate" | "kernel"
    input_len: int | None = None
    output_len: int | None = None
    dataset: str | None = None          # the benchmark tool's dataset ("random", "sharegpt", ...)
    requests_per_run: int | None = None
    duration_s: float | None = None
    OMIT = frozenset({"dataset"})
    extra: dict[str, Any] = extra_field()


@declared
class Schedule(Declared):
    """`ab run`'s schedule: the ABBA blocks actually run."""

    order: str = "ABBA"
    repeats: int = 0
    levels: list[int] = field(default_factory=list)
    endpoint: str | None = None
    design: str = "fixed"               # "fixed" | "sequential"
    blocks: int = 0
    warmup_requests: int | None = None
    wall_s: float | None = None
    extra: dict[str, Any] = extra_field()


@declared
class Setup(Declared):
    """Where and how the runs were measured. `engine` is "unknown" when nothing said."""

    inventory: str | None = None
    git_sha: str | None = None
    engine: str = "unknown"
    engine_version: str | None = None
    stack: str | None = None            # the inventory's stack name, where a repo holds more than one
    model: str | None = None
    served_model_name: str | None = None
    device: str | None = None
    bench_tool: str | None = None       # the load generator that measured ("vllm bench serve", ...)
    bench_version: str | None = None
    workload: Workload = field(default_factory=Workload)
    schedule: Schedule | None = None
    OMIT = frozenset({"stack", "served_model_name", "bench_tool", "bench_version", "schedule"})
    extra: dict[str, Any] = extra_field()

    @classmethod
    def build(cls, project: Any = None, *, inventory: str | None = None, engine: str | None = None,
              engine_version: str | None = None, stack: str | None = None, model: str | None = None,
              served_model_name: str | None = None,
              device: str | None = None, bench_tool: str | None = None, bench_version: str | None = None,
              workload: Workload | Mapping | None = None, schedule: Schedule | None = None,
              extra: Mapping | None = None) -> "Setup":
        """THE setup of a new evidence file (`ab run`, `ab import`, canary, kernels): the repo's HEAD
        commit when `project` is given, and whatever the producer knows; the rest stays unknown."""
        git_sha = None
        if project is not None:
            git_sha = gitio.head_sha(project.root)
        return cls(inventory=inventory, git_sha=git_sha, engine=engine or "unknown", engine_version=engine_version,
                   stack=stack or None, model=model, served_model_name=served_model_name, device=device, bench_tool=bench_tool,
                   bench_version=bench_version, workload=Workload.of(workload or {}), schedule=schedule,
                   extra=dict(extra or {}))

    def measured_text(self) -> str:
        """THE text of what was measured, for `ab show`, review and the report:
        `model knobkeeper-sim (served as m) · random 64 in / 32 out tokens · 64 requests/run ·
        measured by vllm bench serve 0.32.0`; parts nobody recorded are left out."""
        w = self.workload
        parts = []
        if self.model or self.served_model_name:
            served = (f" (served as {self.served_model_name})"
                      if self.served_model_name and self.served_model_name != self.model else "")
            parts.append(f"model {self.model or self.served_model_name}{served}")
        shape = " / ".join(f"{n} {what}" for n, what in ((w.input_len, "in"), (w.output_len, "out")) if n)
        if shape or w.dataset:
            parts.append(" ".join(x for x in (w.dataset, f"{shape} tokens" if shape else "") if x))
        if w.requests_per_run:
            parts.append(f"{w.requests_per_run} requests/run")
        elif w.duration_s:
            parts.append(f"{w.duration_s:g} s/run")
        if self.bench_tool:
            tool = self.bench_tool if not self.bench_version or self.bench_tool.endswith(self.bench_version) \
                else f"{self.bench_tool} {self.bench_version}"
            parts.append(f"measured by {tool}")
        return " · ".join(parts)


@declared
class KnobSeen(Declared):
    """What the running engine had of the knob: carried, not carried, or unverified."""

    status: str = "unverified"          # validity.CARRIED | NOT_CARRIED | UNVERIFIED
    running: Any = None
    detail: str | None = None
    extra: dict[str, Any] = extra_field()


def _count(value: Any, run: Mapping[str, Any]) -> bool:
    """A count of failed requests: an integer, or null where the run's `not_recorded` names the tool
    whose file could not tell."""
    if value is None:
        named = run.get("not_recorded")
        return isinstance(named, dict) and isinstance(named.get("errors"), str)
    return isinstance(value, int) and not isinstance(value, bool)


@declared
class Run(Declared):
    """One arm, one level, one repeat. `completed` counts finished requests, `errors` failed ones,
    `requested` what the tool sent; a count the tool's file cannot tell is None, with
    `not_recorded[field]` naming the tool and version ("sglang.bench_serving 0.5.23")."""

    arm: str = fact("A", required=True, nonempty=True, expected="an arm's letter")
    repeat: int = fact(0, required=True)
    concurrency: int = fact(0, required=True)   # the configured level (max_concurrency), never a measured one
    output_tokens_per_s: float | None = fact(None, minimum=0, show=True)
    requests_per_s: float | None = None
    ttft_ms: dict[str, float | None] | None = None
    tpot_ms: dict[str, float | None] | None = None
    itl_ms: dict[str, float | None] | None = None
    e2e_ms: dict[str, float | None] | None = None
    completed: int | None = None
    errors: int | None = fact(0, required=True, test=lambda v, run: _count(v, run), expected="an integer",
                              schema={"type": ["integer", "null"]})
    requested: int | None = None
    output_tokens: int | None = None
    not_recorded: dict[str, str] = fact(factory=dict, expected="an object naming, per count, the tool that did not record it",
                                        test=lambda v, _: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
                                        schema={"type": "object", "additionalProperties": {"type": "string"}})
    knob_seen: KnobSeen | None = None
    prefill_prompt_tokens: float | None = None
    OMIT = frozenset({"output_tokens_per_s", "requests_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms",
                      "completed", "requested", "output_tokens", "not_recorded", "knob_seen",
                      "prefill_prompt_tokens"})
    # errors null only where the tool is named (the test of `errors` above says it for validate)
    CHECKS = (Check(lambda data: (), schema={
        "if": {"properties": {"errors": {"type": "null"}}, "required": ["errors"]},
        "then": {"properties": {"not_recorded": {"required": ["errors"]}}, "required": ["not_recorded"]}}),)
    extra: dict[str, Any] = extra_field()

    def raw(self, metric: str) -> Any:
        """The run's top-level number `metric` as the file holds it (a field, or a tool's own
        number kept in `extra`), None when absent; `value` is the checked one."""
        if metric == METRIC:   # the judged metric, read directly: judging a sweep reads it ~10^6 times
            return self.output_tokens_per_s
        if metric in _RUN_FIELDS:
            return getattr(self, metric)
        return self.extra.get(metric)

    def value(self, metric: str) -> float | None:
        """The run's positive finite value of `metric` (a top-level number or a guard's
        percentile), else None."""
        if metric in GUARDS:
            holder_name, key, _ = GUARDS[metric]
            holder = getattr(self, holder_name)
            value = holder.get(key) if isinstance(holder, dict) else None
        else:
            value = self.raw(metric)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            return None
        return float(value)

    def unrecorded(self, name: str) -> str | None:
        """`not recorded by <tool version>` when the run's file cannot tell `name`, else None."""
        by = self.not_recorded.get(name)
        if not by and name == "errors" and not self.errors_recorded:
            by = "the benchmark tool"
        return f"not recorded by {by}" if by else None

    @property
    def errors_recorded(self) -> bool:
        """Whether the run's file told its failed requests. False: `errors` is None and
        `not_recorded["errors"]` names the tool (a file of the first bench-formats import, before
        that field, says `errors_recorded: false` instead; it reads the same)."""
        return "errors" not in self.not_recorded and self.extra.get("errors_recorded") is not False

    @property
    def failed(self) -> int:
        """The failed requests known (0 when not recorded: see `errors_recorded`, `unrecorded("errors")`)."""
        return int(self.errors or 0)


_RUN_FIELDS = frozenset(f for f in Run.__dataclass_fields__ if f != "extra")


@declared
class Dropped(Declared):
    """A run left out of a level's comparison, and why (errors, or the outlier rule)."""

    arm: str = "A"
    repeat: int | None = None
    value: float | None = None
    reason: str = ""
    extra: dict[str, Any] = extra_field()


@declared
class Level(Declared):
    """One concurrency level's throughput verdict (judge.py says how). Effects and intervals are
    relative: 0.128 = +12.8% of B over A."""

    concurrency: int = fact(0, required=True)
    n_a: int = 0
    n_b: int = 0
    mean_a: float | None = None
    mean_b: float | None = None
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None     # family-wise (schema 2); absent in schema 1
    p_sequential: float | None = None   # the sequential design's q (before Holm)
    df: float | None = None
    verdict: str = fact("inconclusive", required=True, choices=VERDICTS)
    repeats_needed: int | None = None
    errored_runs: dict[str, int] | None = None
    outliers_dropped: list[Dropped] = field(default_factory=list)
    invalid: list[str] | None = None    # the validity gates it failed (verdict "invalid")
    OMIT = frozenset({"p_adjusted", "p_sequential", "invalid"})
    extra: dict[str, Any] = extra_field()

    @property
    def valid(self) -> bool:
        return self.verdict != "invalid"

    def ci_text(self) -> str:
        """`+10.1%..+15.4%`, or n/a without an interval."""
        return f"{fmt.pct(self.ci_low)}..{fmt.pct(self.ci_high)}" if self.ci_low is not None else "n/a"


@declared
class Guard(Declared):
    """One latency metric at one level (lower is better): "worse" is a regression."""

    concurrency: int = 0
    metric: str = ""
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    verdict: str = fact("inconclusive", choices=VERDICTS)
    regression: bool = False
    n_a: int | None = None
    n_b: int | None = None
    OMIT = frozenset({"n_a", "n_b"})
    extra: dict[str, Any] = extra_field()

    @property
    def label(self) -> str:
        """"p99 TTFT" for ttft_p99_ms."""
        return GUARDS.get(self.metric, (None, None, self.metric))[2]

    def ci_text(self) -> str:
        return f"{fmt.pct(self.ci_low)}..{fmt.pct(self.ci_high)}" if self.ci_low is not None else "n/a"


@declared
class Adjustment(Declared):
    """What the family-wise adjustment covered: every level's throughput and guard tests."""

    method: str = "holm"
    alpha: float = ALPHA
    size: int = 0
    weights: dict[str, float] = field(default_factory=dict)
    sequential: bool | None = None
    OMIT = frozenset({"sequential", "weights"})
    extra: dict[str, Any] = extra_field()


@declared
class Judgement(Declared):
    """The judge's answer for one file (knobkeeper.evidence.judge)."""

    method: str = ""
    alpha: float = ALPHA
    mde: float | None = None
    unit_noise: float | None = None     # a known offset no run averages out (a canary's restarts)
    levels: list[Level] = fact(factory=list, required=True)
    guards: list[Guard] = field(default_factory=list)
    family: Adjustment | None = None        # None: schema 1, per level without adjustment
    OMIT = frozenset({"mde", "unit_noise", "guards", "family"})
    extra: dict[str, Any] = extra_field()

    def level(self, concurrency: int) -> Level | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    @property
    def regressions(self) -> list[Guard]:
        return [g for g in self.guards if g.regression]


@declared
class LevelValidity(Declared):
    concurrency: int = 0
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)   # gates the runs could not be judged by
    OMIT = frozenset({"not_applied"})
    extra: dict[str, Any] = extra_field()


@declared
class Validity(Declared):
    """The validity gates (validity.py) per level, and the file-level notes (duplicates, ...)."""

    levels: list[LevelValidity] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()

    @property
    def invalid(self) -> dict[int, list[str]]:
        return {row.concurrency: row.reasons for row in self.levels if not row.valid}


@declared
class Look(Declared):
    """One look of the sequential design: after `repeat` repeats, which levels settled how."""

    repeat: int = 0
    open: list[int] = field(default_factory=list)
    settled: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()


@declared
class Sequential(Declared):
    """The sequential design's plan and the looks taken (judge.sequential_rule)."""

    rule: str = ""
    max_repeats: int = 0
    planned_looks: list[int] = field(default_factory=list)
    spending: str = ""
    looks: list[Look] = fact(factory=list, required=True)
    extra: dict[str, Any] = extra_field()


@declared
class Anomaly(Declared):
    """Throughput falling as concurrency rises, in one arm."""

    arm: str = "A"
    from_concurrency: int = 0
    to_concurrency: int = 0
    change: float = 0.0
    p_value: float | None = None
    confidence: float | None = None
    note: str | None = None
    OMIT = frozenset({"note"})
    extra: dict[str, Any] = extra_field()

    def text(self) -> str:
        """`arm A throughput at 96 is -4.1% vs 80 (99% confidence)`."""
        conf = "unconfirmed" if self.confidence is None else f"{self.confidence * 100:.0f}% confidence"
        return (f"arm {self.arm} throughput at {self.to_concurrency} is {fmt.pct(self.change)} vs "
                f"{self.from_concurrency} ({conf})")


@declared
class Source(Declared):
    """Where the runs came from: the tool, the raw files kept beside the evidence, their format."""

    tool: str = fact("knobkeeper", required=True)
    raw_files: list[str] = field(default_factory=list)
    format: str | None = None
    extra: dict[str, Any] = extra_field()


@declared
class WindowStats(Declared):
    """One canary worker's numbers over one window (knobkeeper.evidence.metrics measures them; None:
    no data for that quantity). `errors` counts its aborted requests (and those in flight at a
    restart), `requests` its finished ones (None where the engine does not count them), `decoding`
    the requests in flight from the engine's ITL integral, `restarts` the times its process was seen
    replaced, `unanswered` its failed scrapes (knobkeeper.evidence.canary_design: the window's validity)."""

    start: float = 0.0
    end: float = 0.0
    output_tokens_per_s: float | None = None
    running: float | None = None
    errors: int = 0
    ttft_ms: dict[str, float] | None = None
    tpot_ms: dict[str, float] | None = None
    decoding: float | None = None
    itl_ms: float | None = None
    requests: int | None = None
    restarts: int = 0
    unanswered: int = 0
    OMIT_ZERO = frozenset({"restarts", "unanswered"})
    extra: dict[str, Any] = extra_field()


@declared
class Window(Declared):
    """One canary window: every host's stats, its validity, and (when valid) each host's x."""

    index: int = 0
    phase: str = "canary"               # "calibration" | "canary"
    start: float = 0.0
    end: float = 0.0
    valid: bool = True
    reasons: list[str] = field(default_factory=list)
    hosts: dict[str, WindowStats] = field(default_factory=dict)   # {target key: its numbers}
    throughput: dict[str, float] | None = None
    in_flight: float | None = None
    OMIT = frozenset({"throughput", "in_flight"})
    extra: dict[str, Any] = extra_field()


@declared
class ErrorCounts(Declared):
    """One side of the errors test over the canary windows: its aborted requests, its requests
    (finished + aborted; None where an engine does not count them) and how many workers it has."""

    errors: int = 0
    requests: int | None = None
    hosts: int = 0
    extra: dict[str, Any] = extra_field()

    def text(self) -> str:
        """`1527 of 5110 requests`, or `1527` without a request count."""
        return f"{self.errors} of {self.requests} requests" if self.requests is not None else f"{self.errors}"


@declared
class ErrorsTest(Declared):
    """The canary's aborted requests: canary hosts against baseline hosts (canary.errors_test)."""

    canary: ErrorCounts = field(default_factory=ErrorCounts)
    baseline: ErrorCounts = field(default_factory=ErrorCounts)
    share: float = 0.0
    p_value: float = 1.0
    alpha: float = 0.01
    failed: bool = False
    extra: dict[str, Any] = extra_field()

    def text(self) -> str:
        """`errors 1527 of 5110 requests on the canary vs 0 of 5120 requests on the baseline (p < 1e-12)`."""
        p = self.p_value
        return (f"errors {self.canary.text()} on the canary vs {self.baseline.text()} on the baseline "
                f"(p {'< 1e-12' if p < 1e-12 else f'{p:.2g}'})")


@declared
class CanarySource(Declared):
    """Where a canary's window numbers came from: knobkeeper's own scrape of the workers ("scrape",
    no url) or a Prometheus ("prometheus", its url)."""

    kind: str = ""
    url: str | None = None
    extra: dict[str, Any] = extra_field()


@declared
class CanaryBlock(Declared):
    """The `canary` block of a canary's evidence (knobkeeper.evidence.canary)."""

    hosts: dict[str, list[str]] = field(default_factory=dict)   # {"canary": [...], "baseline": [...]}
    source: CanarySource = field(default_factory=CanarySource)
    queries: dict[str, str] = field(default_factory=dict)
    design: str = ""
    interval_s: float = 0.0
    duration_s: float = 0.0
    calibration_s: float = 0.0
    calibration_windows: int = 0
    imbalance_threshold: float = IMBALANCE
    restart_noise: float = 0.0
    normalisation: str = ""
    windows: list[Window] = field(default_factory=list)
    errors: ErrorsTest = field(default_factory=ErrorsTest)
    verdict: str = "inconclusive"
    failed_guards: list[str] = field(default_factory=list)
    rolled_back: bool = False
    deployed_at: float | None = None
    seconds_to_verdict: float | None = None
    extra: dict[str, Any] = extra_field()

    def counts(self) -> dict[str, tuple[int, int]]:
        """phase -> (valid windows, windows)."""
        out = {}
        for phase in ("calibration", "canary"):
            ws = [w for w in self.windows if w.phase == phase]
            out[phase] = (sum(1 for w in ws if w.valid), len(ws))
        return out


@declared
class Gain(Declared):
    """A valid level's claim, as other parts use it: the effect, its interval and verdict, the p
    it rests on (`p`), and the guard regressions at that level."""

    concurrency: int = 0
    effect: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    verdict: str = "inconclusive"
    p_value: float | None = None        # raw
    p_adjusted: float | None = None     # family-wise; None for schema 1
    adjusted: bool = True
    regressions: list[Guard] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()

    @property
    def p(self) -> float | None:
        """The p the verdict rests on: the adjusted one (schema 2), else the raw one."""
        return self.p_adjusted if self.adjusted else self.p_value

    def ci_text(self) -> str:
        return f"{fmt.pct(self.ci_low)}..{fmt.pct(self.ci_high)}" if self.ci_low is not None else "n/a"


# ---------------------------------------------------------------- a sweep's parts (knobkeeper.evidence.sweep)

PLAN_SCHEMA = "knobkeeper.sweep-plan/1"
ADOPT, KEEP, NO_PICK = "adopt", "keep the control", "no pick"
PICK_OUTCOMES = (ADOPT, KEEP, NO_PICK)


@declared
class SweepPlan(Declared):
    """A sweep's plan, committed before any data (changelog/plans/<stem>.json) and copied into its
    evidence (`sweep.plan`). Arm "A" is always the control (the value the stack runs), the others the
    candidates in the order given. `delta`: the indifference margin (the smallest gain worth a
    change), `noise`: the restart-to-restart log-sd it was derived from; `max_repeats`: the budget's
    blocks per arm, `minutes`: its wall time (None: no limit); `seed`: the block order's;
    `confirm`: the confirming A/B's design ({"max_repeats", "planned_looks"}; {} with one candidate:
    an A/B judges its only candidate itself); `load`: how each run loads the stack (ab.Design's
    fields); `engine_default`: the knob's value when unset, for the tie rule (None: not known)."""

    schema: str = fact(PLAN_SCHEMA, required=True, choices=(PLAN_SCHEMA,), expected=repr(PLAN_SCHEMA), show=True)
    id: str = fact("", required=True, nonempty=True)
    created: str = fact("", required=True, nonempty=True)   # when it was committed; its file is <stamp>-<id>.json
    knob: str = fact("", required=True, nonempty=True)
    role: str = fact("", required=True, nonempty=True)
    scope: str | None = None
    inventory: str | None = None
    arms: dict[str, Arm] = fact(factory=dict, required=True,
                                test=lambda v, _: isinstance(v, dict) and "A" in v and len(v) >= 2,
                                expected="an object with the control A and at least one candidate")
    levels: list[int] = field(default_factory=list)
    metric: str = METRIC
    guards: list[str] = field(default_factory=list)
    alpha: float = ALPHA
    delta: float = 0.05
    delta_source: str = ""
    noise: float | None = None
    noise_source: str = ""
    max_repeats: int = 0
    minutes: float | None = None
    planned_looks: list[int] = field(default_factory=list)
    spending: str = ""
    order: str = "random"               # "random" (seeded, per block) | "ABBA" (two arms)
    seed: int = 0
    max_arms: int = 0
    confirm: dict[str, Any] = field(default_factory=dict)
    load: dict[str, Any] = field(default_factory=dict)
    engine_default: Any = None
    estimate: dict[str, Any] = field(default_factory=dict)   # what --plan printed: seconds per block, ...
    extra: dict[str, Any] = extra_field()

    @property
    def control(self) -> str:
        return "A"

    @property
    def candidates(self) -> list[str]:
        return [name for name in self.arms if name != "A"]

    def arm_text(self, name: str) -> str:
        """`A (control) SGLANG_SM120_MMA_TARGET_CTAS=128`, `C 512`: the arm's knobs as shown."""
        knobs = self.arms[name].knobs
        values = ", ".join(f"{k}={fmt.value(v)}" for k, v in knobs.items()) if len(knobs) > 1 else \
            fmt.value(next(iter(knobs.values()), None))
        return f"{name}{' (control)' if name == 'A' else ''} {values}"


@declared
class SweepLook(Declared):
    """One look of a sweep: after `repeat` blocks, the arms still measured, the leader (the arm of
    the highest score: mean ln throughput over the levels per restart), which arms were dropped and
    by what bound, which levels settled against the control, and why the search stopped here."""

    repeat: int = 0
    survivors: list[str] = field(default_factory=list)
    leader: str | None = None
    eliminated: dict[str, str] = field(default_factory=dict)
    settled: dict[str, dict[str, str]] = field(default_factory=dict)
    stop: str | None = None
    OMIT = frozenset({"stop"})
    extra: dict[str, Any] = extra_field()


@declared
class ArmFailure(Declared):
    """An arm that failed (its switch: a gate timeout, a start-up crash; its runs: errors over the
    gate, the knob not carried, restarts): an outcome, recorded with its cause, never skipped."""

    repeat: int = 0
    cause: str = ""
    detail: str = ""
    extra: dict[str, Any] = extra_field()


@declared
class Pick(Declared):
    """The sweep's pick by its rule (knobkeeper.evidence.sweep): `outcome` adopt | keep the control |
    no pick (interrupted); `arm` and `knobs` the arm picked ("A" to keep the control); `tied`: the
    candidates that could not be told from the best; `confirmed`: what the confirming A/B said."""

    outcome: str = fact(KEEP, required=True, choices=PICK_OUTCOMES)
    arm: str = "A"
    knobs: dict[str, Any] = field(default_factory=dict)
    reason: str = ""
    rule: str = ""
    best: str | None = None
    tied: list[str] = field(default_factory=list)
    confirmed: bool | None = None
    confirm_summary: str | None = None
    OMIT = frozenset({"best", "confirmed", "confirm_summary"})
    extra: dict[str, Any] = extra_field()

    @property
    def adopted(self) -> bool:
        return self.outcome == ADOPT


@declared
class SweepBlock(Declared):
    """The `sweep` block of a sweep's evidence: the plan (and the commit that added it), every
    block's restart order, every run and warm-up of the search, each look, the failures, the
    family-wise judgement of every candidate against the control (`judgement`: {arm: Judgement},
    one Holm family), each arm's score, the pick, and the fingerprint of what was measured. The
    evidence's own A/B (arms A/B, runs, judgement) is the confirming run of the pick against the
    control when there was one (its effect is the one reported), else the search's runs of the
    control and the leading candidate."""

    plan: SweepPlan = fact(factory=SweepPlan, required=True, expected="the sweep's plan (an object)")
    plan_path: str = ""
    plan_commit: str | None = None
    status: str = fact("complete", required=True, choices=("complete", "interrupted"), show=True)
    blocks: list[dict[str, Any]] = field(default_factory=list)
    runs: list[Run] = fact(factory=list, required=True)
    warmups: list[dict[str, Any]] = field(default_factory=list)
    sequential: Sequential | None = None
    looks: list[SweepLook] = field(default_factory=list)
    failed: dict[str, ArmFailure] = field(default_factory=dict)
    judgement: dict[str, Judgement] = field(default_factory=dict)
    scores: dict[str, dict[str, Any]] = field(default_factory=dict)
    pick: Pick = fact(factory=Pick, required=True)
    confirm: dict[str, Any] | None = None   # {"arm": X, "blocks", "wall_s"}: the top-level A/B is its runs
    fingerprint: dict[str, Any] = field(default_factory=dict)
    stopped: str = ""
    wall_s: float | None = None
    OMIT = frozenset({"confirm"})
    extra: dict[str, Any] = extra_field()

    def eliminated_at(self) -> dict[str, tuple[int, str]]:
        """{arm: (the look's repeat, the bound)} of every arm dropped."""
        return {arm: (look.repeat, why) for look in self.looks for arm, why in look.eliminated.items()}

    def cells(self, arm: str) -> list[tuple[int, float | None, list[float] | None, str]]:
        """[(level, effect vs the control, the simultaneous interval [low, high] or None, verdict)] of a candidate."""
        judged = self.judgement.get(arm)
        return [(lv.concurrency, lv.effect, lv.extra.get("simultaneous"), lv.verdict)
                for lv in (judged.levels if judged is not None else [])]

    def fate(self, arm: str) -> str:
        """`picked`, `dropped after block 3 (bound)`, `FAILED at block 2 (switch: ...)`, or `measured to the end`."""
        if arm == "A":
            return "the control" + (", kept" if self.pick.outcome == KEEP else "")
        if arm in self.failed:
            f = self.failed[arm]
            return f"FAILED at block {f.repeat} ({f.cause}: {f.detail})"
        dropped = self.eliminated_at()
        if arm in dropped:
            return f"dropped after block {dropped[arm][0]} ({dropped[arm][1]})"
        if self.pick.adopted and arm == self.pick.arm:
            return "PICKED" + (" (confirmed)" if self.pick.confirmed else "")
        return "measured to the end" + (" (not told from the best)" if arm in self.pick.tied else "")

    def arm_rows(self) -> list[str]:
        """THE text of each arm: `D 512: @64 +13.4% [+7.3%..+20.0%] better, @96 ...; PICKED`."""
        rows = []
        for arm in self.plan.arms:
            cells = ", ".join(f"@{c} {fmt.pct(e)}" + (f" [{fmt.pct(i[0])}..{fmt.pct(i[1])}]" if i else "") + f" {v}"
                              for c, e, i, v in self.cells(arm))
            rows.append(f"{self.plan.arm_text(arm)}: {cells + '; ' if cells else ''}{self.fate(arm)}")
        return rows

    def timeline(self) -> list[str]:
        """THE elimination timeline: one line per look (`after block 3: leader D; dropped B (...); C settled @64 better`)."""
        out = []
        for look in self.looks:
            parts = [f"leader {look.leader}"] if look.leader else []
            parts += [f"dropped {arm} ({why})" for arm, why in look.eliminated.items()]
            parts += [f"{arm} settled " + ", ".join(f"@{c} {v}" for c, v in cells.items())
                      for arm, cells in look.settled.items()]
            if look.stop:
                parts.append(f"stop: {look.stop}")
            out.append(f"after block {look.repeat} ({', '.join(look.survivors)}): " + ("; ".join(parts) or "nothing decided"))
        for arm, f in self.failed.items():
            out.append(f"block {f.repeat}: {arm} FAILED ({f.cause}: {f.detail})")
        return out

    def pick_text(self) -> str:
        """`pick D (512), confirmed: ...` / `keep the control: ...` / `no pick (interrupted): ...`."""
        if self.pick.adopted:
            return f"pick {self.plan.arm_text(self.pick.arm)}: {self.pick.reason}"
        return f"{self.pick.outcome}: {self.pick.reason}"


# ---------------------------------------------------------------- the evidence

def _judge_options(value: Any) -> bool:
    """{"unit_noise": 0 <= x < 1, "alpha": 0 < x < 1}, nothing else."""
    bounds = {"unit_noise": (0.0, True), "alpha": (0.0, False)}  # (lower bound, inclusive)
    return isinstance(value, dict) and not set(value) - set(bounds) and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and x < 1
        and (x >= bounds[k][0] if bounds[k][1] else x > bounds[k][0]) for k, x in value.items())


def _runs_of(data: Mapping[str, Any]) -> list[tuple[int, Any]]:
    runs = data.get("runs")
    return list(enumerate(runs)) if isinstance(runs, list) else []


def _ab_runs(data: Mapping[str, Any]) -> Any:
    for i, run in _runs_of(data):
        if isinstance(run, dict) and isinstance(run.get("arm"), str) and run["arm"] not in ("A", "B"):
            yield f"runs[{i}].arm", "'A' or 'B'"


def _metric_in_runs(data: Mapping[str, Any]) -> Any:
    metric = data.get("metric")
    if not isinstance(metric, str) or not metric:
        return
    for i, run in _runs_of(data):
        if isinstance(run, dict):
            v = run.get(metric)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                yield f"runs[{i}].{metric}", f"a finite number >= 0, got {v!r}"


def same_value(a: Any, b: Any) -> bool:
    """Whether two knob values are the same value (512 and "512" are; None is only None)."""
    if a is None or b is None:
        return a is b
    if a == b and isinstance(a, bool) == isinstance(b, bool):
        return True
    return fmt.value(a) == fmt.value(b)


@declared
class Evidence(Declared):
    """One evidence file (schema.py has the field-by-field description)."""

    schema: str = fact(SCHEMA, required=True, choices=SCHEMAS, expected=f"{SCHEMA!r} (or {SCHEMA_1!r})", show=True)
    id: str = fact("", required=True, nonempty=True)     # 8 hex digits; the file is <UTC stamp>-<id>.json
    created: str = fact("", required=True, nonempty=True)   # "2026-11-29T16:47:37.123456Z"
    knob: str = fact("", required=True, nonempty=True)
    role: str = fact("", required=True, nonempty=True)
    metric: str = fact(METRIC, required=True, nonempty=True)   # the primary metric judged, a number of every run
    arms: dict[str, Arm] = fact(factory=dict, required=True, test=lambda v, _: isinstance(v, dict) and set(v) == {"A", "B"},
                                expected="an object with exactly the arms A (baseline) and B (candidate)",
                                schema={"type": "object", "properties": {"A": {"$ref": "#/$defs/Arm"},
                                                                          "B": {"$ref": "#/$defs/Arm"}},
                                        "required": ["A", "B"], "additionalProperties": False})
    setup: Setup = fact(factory=Setup, required=True)
    runs: list[Run] = fact(factory=list, required=True, nonempty=True)
    sequential: Sequential | None = None
    judge_options: dict[str, float] | None = fact(None, test=lambda v, _: _judge_options(v), expected=(
        '{"unit_noise": a log-sd from 0 to 1, "alpha": a probability between 0 and 1}'), schema={
        "type": "object", "additionalProperties": False, "properties": {
            "unit_noise": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
            "alpha": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}}})
    source: Source = fact(factory=Source, required=True)
    canary: CanaryBlock | None = None
    rejudges: str | None = fact(None, test=lambda v, _: isinstance(v, str) and bool(re.fullmatch(r"[0-9a-f]+", v)),
                                expected="the hex id of the evidence it re-judges", show=True,
                                schema={"type": "string", "pattern": "^[0-9a-f]+$"})   # its runs are judged again here
    sweep: SweepBlock | None = None
    interrupted: dict[str, Any] | None = None   # {"by", "at", "blocks"}: stopped before its end (partial)
    judgement: Judgement = fact(factory=Judgement, required=True)
    anomalies: list[Anomaly] = fact(factory=list, required=True)
    validity: Validity = field(default_factory=Validity)
    OMIT = frozenset({"sequential", "judge_options", "canary", "rejudges", "sweep", "interrupted"})
    CHECKS = (
        # A/B evidence has the two arms (a sweep's other arms are in its `sweep` block)
        Check(lambda data: _ab_runs(data),
              schema={"properties": {"runs": {"items": {"properties": {"arm": {"enum": ["A", "B"]}}}}}}),
        # every run has the file's metric (a name only the file says: not a JSON Schema rule)
        Check(lambda data: _metric_in_runs(data)),
    )
    extra: dict[str, Any] = extra_field()

    # What a re-judgement must hold exactly as the evidence it re-judges: everything measured and
    # how (only the judgement, the validity and the anomalies are computed again).
    MEASURED: ClassVar[tuple[str, ...]] = ("knob", "role", "metric", "arms", "setup", "runs", "source")

    # -- the arms

    def value(self, arm: str) -> Any:
        """The knob's value in `arm` ("A" baseline, "B" candidate); None = unset."""
        return self.arms[arm].knobs.get(self.knob) if arm in self.arms else None

    @property
    def baseline(self) -> Any:
        return self.value("A")

    @property
    def candidate(self) -> Any:
        return self.value("B")

    @property
    def scope(self) -> str:
        """The knobs.toml table the evidence measured: "decode" (the stack that names none) or
        "vllm.decode" (from a role "vllm.decode" or, as `ab run` and `ab import --stack` write it,
        setup.stack)."""
        own_stack, own_role = split_scope(self.role)
        return scope(own_stack or self.setup.stack, own_role)

    # -- what the verdicts mean

    @property
    def is_adjusted(self) -> bool:
        """Whether the verdicts are family-wise adjusted (schema 2) or per level (schema 1)."""
        return self.schema != SCHEMA_1

    def p_cell(self, level: Level) -> str:
        """The adjusted p as shown in a table: its value, or "unadjusted" for schema 1."""
        return fmt.p_value(level.p_adjusted) if self.is_adjusted else "unadjusted"

    @property
    def claims_nothing(self) -> str | None:
        """Why this evidence backs no change whatever its levels say, else None: a sweep that did not
        adopt its arm B (it kept the control, or was interrupted: its own A/B is then the leading
        candidate's search runs, which a search's winner overstates)."""
        if self.sweep is not None and not (self.sweep.pick.adopted and self.sweep.status == "complete"):
            return (f"sweep {self.id} was interrupted: no pick" if self.sweep.status != "complete"
                    else f"sweep {self.id} kept the control ({self.sweep.pick.reason})")
        return None

    def gains(self) -> list[Gain]:
        """Per valid level: effect, interval, verdict, raw and adjusted p, and the guard regressions
        at that level. Invalid levels are left out: they count for nothing; so does every level of a
        sweep that claims nothing (`claims_nothing`)."""
        if self.claims_nothing:
            return []
        regressions: dict[int, list[Guard]] = {}
        for g in self.judgement.regressions:
            regressions.setdefault(g.concurrency, []).append(g)
        return [Gain(lv.concurrency, lv.effect, lv.ci_low, lv.ci_high, lv.verdict, lv.p_value,
                     lv.p_adjusted if self.is_adjusted else None, self.is_adjusted,
                     regressions.get(lv.concurrency, []))
                for lv in self.judgement.levels if lv.valid]

    def positive_gains(self) -> list[Gain]:
        """The levels judged "better" with a positive effect: what a revert gives up."""
        return [g for g in self.gains() if g.verdict == "better" and (g.effect or 0) > 0]

    def level_text(self, lv: Level) -> str:
        """THE text of a level: `+12.8% @64 (95% CI +10.1%..+15.4%, better, p_adj 0.001)`;
        `@64 invalid (why)`; schema 1 says "unadjusted"."""
        if not lv.valid:
            reasons = lv.invalid or ["a validity gate failed"]
            return f"@{lv.concurrency} invalid ({fmt.safe(reasons[0])})"
        ci = f"95% CI {lv.ci_text()}" if lv.ci_low is not None else f"n={lv.n_a}/{lv.n_b}"
        extra = f", needs {lv.repeats_needed} runs/arm" if lv.repeats_needed else ""
        if not self.is_adjusted:
            extra += ", unadjusted"
        elif lv.p_adjusted is not None:
            extra += f", p_adj {fmt.p_value(lv.p_adjusted)}"
        return f"{fmt.pct(lv.effect)} @{lv.concurrency} ({ci}, {lv.verdict}{extra})"

    def summary_line(self) -> str:
        """Every level's text, then the guard regressions and the anomalies:
        `+12.8% @64 (...), ...; but p99 TTFT +40.0% @64; anomaly: A 96 < 80 (-4.1%, 99% conf.)`."""
        text = ", ".join(self.level_text(lv) for lv in self.judgement.levels) or "no levels"
        regressions = self.judgement.regressions
        if regressions:
            text += "; but " + ", ".join(f"{g.label} {fmt.pct(g.effect)} @{g.concurrency}" for g in regressions)
        for an in self.anomalies:
            conf = f", {an.confidence * 100:.0f}% conf." if an.confidence is not None else ", unconfirmed"
            text += f"; anomaly: {an.arm} {an.to_concurrency} < {an.from_concurrency} ({fmt.pct(an.change)}{conf})"
        return text

    def unrecorded_notes(self) -> list[str]:
        """Once each, what the runs' files could not tell: `errors: not recorded by sglang
        bench_serving 0.5.23` (the errors gate was not applied to those runs)."""
        out: list[str] = []
        for run in self.runs:
            for name in ("errors",) + tuple(k for k in run.not_recorded if k != "errors"):
                why = run.unrecorded(name)
                if why and f"{name}: {why}" not in out:
                    out.append(f"{name}: {why}")
        return out

    def engine_text(self) -> str:
        """`engine sglang 0.5.23`, or `engine unknown`."""
        named = " ".join(str(x) for x in (self.setup.engine, self.setup.engine_version) if x and x != "unknown")
        return f"engine {named or 'unknown'}"

    # -- does it back a change, does it agree with itself (issue "evidence that cannot lie")

    def backs(self, knob: str, role: str, value: Any, show: Callable[[Any], str] = fmt.value) -> str | None:
        """Why this evidence does not back setting `knob` to `value` on `role`, or None when it does:
        it must test that knob on that scope, with that value as its candidate. `role` is a scope:
        "decode" is the role of the stack that names none, "vllm.decode" that of stack "vllm", and
        the evidence's own scope (Evidence.scope) must be the same table. A stack left unnamed on
        one side is not a wildcard: the default stack's decode and vLLM's decode run different
        engines, and an A/B of one says nothing of the other.
        `show` writes a value (a catalog's display: a secret as its fingerprint)."""
        if self.knob != knob or self.scope != role:
            return f"evidence {self.id} tests {self.knob} on {self.scope}, not {knob} on {role}"
        if not same_value(self.candidate, value):
            return f"stale evidence {self.id}: it tested {show(self.candidate)}, the change sets {show(value)}"
        return self.claims_nothing

    def departures_from(self, original: "Evidence") -> list[str]:
        """The measured parts (MEASURED) in which this re-judgement differs from `original`, the
        evidence its `rejudges` names: a re-judgement judges the same runs again and measures nothing."""
        mine, theirs = self.to_json(), original.to_json()
        return [name for name in self.MEASURED if mine.get(name) != theirs.get(name)]

    def disagreements(self, committed: Mapping[str, Any] | None = None) -> list[str]:
        """Every way the file's own description (knob, role, arms, setup) contradicts its runs, or
        `committed`: what the commit that added the file said it held ({"knob", "role", "value",
        "commit"}, from the store's summary line `evidence: KNOB=VALUE on ROLE (...)`). A hand
        edit of `knob`, `role` or `arms.B.knobs` leaves that commit as it was, so it shows here;
        to hide it one would have to rewrite history, which `check --base` and review see."""
        out = []
        if committed:
            where = f"the commit that added it ({str(committed.get('commit', ''))[:10]})"
            for name, mine in (("knob", self.knob), ("role", self.role)):
                theirs = committed.get(name)
                if theirs is not None and theirs != mine:
                    out.append(f"{name}: the file says {fmt.value(mine)}, {where} says {fmt.value(theirs)}")
            if "value" in committed and fmt.value(self.candidate) != committed["value"]:
                out.append(f"arms.B.knobs: the file says {self.knob}={fmt.value(self.candidate)}, {where} says "
                           f"{committed.get('knob', self.knob)}={committed['value']}")
        for name, arm in sorted(self.arms.items()):
            if self.knob not in arm.knobs:
                out.append(f"arms.{name}.knobs: does not name the knob under test {self.knob}")
        if self.knob in self.arms.get("A", Arm()).knobs and same_value(self.baseline, self.candidate):
            out.append(f"arms: A and B both have {self.knob}={fmt.value(self.candidate)}: nothing was compared")
        for i, run in enumerate(self.runs):
            seen = run.knob_seen
            if seen is not None and seen.status == "carried" and run.arm in self.arms \
                    and not same_value(seen.running, self.value(run.arm)):
                out.append(f"runs[{i}]: the engine ran {self.knob}={fmt.value(seen.running)}, but arm {run.arm} "
                           f"says {fmt.value(self.value(run.arm))}")
        schedule = self.setup.schedule
        if schedule is not None and schedule.levels:
            stray = sorted({r.concurrency for r in self.runs} - set(schedule.levels))
            if stray:
                out.append(f"runs at {', '.join(map(str, stray))} are not in setup.schedule.levels "
                           f"{schedule.levels}")
        if self.canary is not None:
            hosts = set(self.canary.hosts.get("canary", [])) | set(self.canary.hosts.get("baseline", []))
            for w in self.canary.windows:
                if set(w.hosts) != hosts:
                    out.append(f"canary.windows[{w.index}]: hosts {sorted(w.hosts)} are not canary.hosts {sorted(hosts)}")
                    break
        return out

