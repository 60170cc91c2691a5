"""The canary's design and its statistics: which workers are the canary (`choose`), the windows
turned into runs (`window_runs`), the judgement and the verdict (`judgement`, `errors_test`,
`decide`). Pure functions of a `Plan` and the windows' numbers; the measuring, the deploys and
the evidence are knobkeeper/evidence/canary.py's.

The design: windows, a calibration, and a difference of differences
-------------------------------------------------------------------
The run is cut into windows of `interval` s. Per window and per worker host, the engine's own metrics
(knobkeeper.evidence.metrics): generated tokens/s, requests in flight, finished and aborted requests,
TTFT/TPOT percentiles. First `calibrate` s of windows with every host at the declared value, then the
candidate is deployed to the canary hosts, and after a settle time `duration` s of windows more.

Per window k, the canary hosts are compared with the baseline hosts of THAT window:

    ratio(k) = geomean over canary hosts of x(h, k) / geomean over baseline hosts of x(h, k)

so whatever the window does to every host alike (the traffic mix, a busy neighbour, a burst) cancels.
A lasting difference between hosts (a slower GPU, a hotter rack) does not cancel in a ratio; it is
measured by the calibration windows, before anything changed. The judgement compares the ratios of
the canary windows (arm B) with those of the calibration windows (arm A): its effect is the change
of the canary hosts relative to the baseline hosts that the candidate caused (a difference of
differences on the log scale), judged by the evidence judgement (Welch on logs, family-wise, guards
in the family). Each run of the evidence is one window's ratio times the baseline hosts' mean, so
its numbers read as tokens/s (the canary hosts' tokens/s at the baseline's level).

Restart noise. Deploying the candidate restarts the canary hosts' engines, and a restart lands on
its own speed (clocks, memory layout, the same run-to-run noise A/B repeats measure; the sim draws a
per-process factor, sd 2%). Every canary window shares that one draw, so more windows cannot average
it out: it enters the judgement as a known variance (`unit_noise` = restart_noise / sqrt(canary
hosts), judge.compare). With the default 2%, one canary host shows a large effect (+12.8%) surely, a
+5% one at best two times in three and a +3% one hardly ever, however long it runs: more canary hosts
do (`longer_canary` says which). `--calibrate 0` skips the calibration: the
canary windows are then compared host by host (every (host, window) a run), the host differences
counted as unit noise too (restart_noise x sqrt(1/canary + 1/baseline hosts)).

x(h, k), the throughput judged: tokens/s at the window's mean load
------------------------------------------------------------------
A round-robin router gives every host the same NUMBER of requests, so in a closed loop a faster host
does not serve more tokens/s, it holds fewer requests in flight (Little's law: in-flight = arrival
rate x latency): raw tokens/s per host would hide the effect. So the metric is

    x(h, k) = tokens/s per request in flight (h, k) x mean over hosts of requests in flight (k)

The requests in flight are the engine's own time integral, rate(sglang:inter_token_latency_seconds_sum)
(each request's time between output batches is added as it streams), and the tokens/s per request is
1000 / mean inter-token latency; where an engine lacks that histogram, tokens/s divided by the mean of
the sampled sglang:num_running_reqs (a far noisier estimate). With an even spread x is the raw
tokens/s; a knob that speeds a host up also shrinks its batch, so the effect's sign is kept and its
size is that of the host at its own load. The raw tokens/s is kept in every window.

Validity: a window is invalid (listed with its reasons, not judged) when a host served no tokens or
held no requests (no traffic), when a scrape of a host failed in it (it was not seen whole: a worker
that died there is measured only up to its death), or when the most and least loaded host differ by
more than `imbalance` x (default 2: the router is not spreading the load). No valid window at all:
the canary is put back and the command fails.

Restarts: a worker whose process start time changes, or whose token or request counter goes down,
within a window restarted there (metrics.restarts_in, on knobkeeper's own samples or on the raw
samples Prometheus holds); that window is invalid with reason "restarted", and the requests in
flight before the crash count as its errors (the errors test sees them). A baseline worker's
restart costs only its windows.

Guards: TTFT and TPOT percentiles, as ratios the same way, in the judgement's family (lower is
better). Errors: aborted requests on the canary hosts against the baseline hosts over the canary
windows, an exact one-sided binomial test (given the total, the canary's share of the errors is its
share of the requests when both fail alike) at 1% (the guards' share of alpha): a significant excess
fails the canary whatever its throughput. One error among thousands is not a finding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import median
from typing import Any

from knobkeeper.engine.family import Metrics
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge
from knobkeeper.evidence.defaults import ALPHA, IMBALANCE
from knobkeeper.evidence.metrics import Gone, Target
from knobkeeper.evidence.model import METRIC, ErrorCounts, ErrorsTest, Judgement, Run, Window, WindowStats

GUARD_FIELDS = ("ttft_ms", "tpot_ms")
GUARD_KEYS = ("p50", "p99")
CALIBRATION, CANARY = "calibration", "canary"


@dataclass
class Plan:
    knob: str
    value: Any
    baseline_value: Any
    role: str
    canary: list[Target]
    baseline: list[Target]

    @property
    def targets(self) -> list[Target]:
        return [*self.canary, *self.baseline]

    @property
    def metrics(self) -> Metrics:
        """The metric names of the role's engine family (every worker of a role runs one engine)."""
        return self.canary[0].metrics

    def unit_noise(self, restart_noise: float, calibrated: bool) -> float:
        """The log-sd no window averages out (see the module doc: restart noise)."""
        if calibrated:
            return restart_noise / math.sqrt(len(self.canary))
        return restart_noise * math.sqrt(1 / len(self.canary) + 1 / len(self.baseline))


def choose(role_targets: list[Target], role: str, hosts: int | None = None,
           names: list[str] | None = None) -> tuple[list[Target], list[Target]]:
    """(canary, baseline) among a role's workers: the first `hosts` of them, or those named
    (host or host/service); UserError when no baseline would be left."""
    if len(role_targets) < 2:
        raise UserError(f"--role {role}: {len(role_targets)} worker(s); a canary needs at least 2 "
                        f"(the rest are its baseline)")
    if names:
        unknown = [n for n in names if not any(n in (t.key, t.host) for t in role_targets)]
        if unknown:
            raise UserError(f"--host {unknown[0]}: not a {role} worker (workers: "
                            f"{', '.join(t.key for t in role_targets)})")
        canary = [t for t in role_targets if t.key in names or t.host in names]
    else:
        count = 1 if hosts is None else hosts
        if count < 1:
            raise UserError(f"--hosts {count}: expected at least 1")
        canary = role_targets[:count]
    baseline = [t for t in role_targets if t not in canary]
    if not baseline:
        raise UserError(f"--hosts/--host: the canary is the whole {role} role ({len(canary)} workers); "
                        f"leave at least one as baseline")
    return canary, baseline


# ---------------------------------------------------------------- windows -> runs

def per_request_rate(s: WindowStats) -> tuple[float | None, float | None]:
    """(requests in flight, tokens/s per request in flight) of one host in one window (module doc)."""
    if s.decoding and s.itl_ms:
        return s.decoding, 1000.0 / s.itl_ms
    if s.output_tokens_per_s and s.running:
        return s.running, s.output_tokens_per_s / s.running
    return None, None


def assess_windows(plan: Plan, stats: dict[str, list[WindowStats]], phase: str, imbalance: float = IMBALANCE,
                   first_index: int = 0) -> list[Window]:
    """Every window of one phase with its validity and, when valid, each host's x (module doc)."""
    keys = [t.key for t in plan.targets]
    count = min((len(stats.get(key, [])) for key in keys), default=0)
    windows = []
    for k in range(count):
        row = {key: stats[key][k] for key in keys}
        reasons, flight = [], {}
        for key, s in row.items():
            load, rate = per_request_rate(s)
            if getattr(s, "restarts", 0):   # its counters started again: the window's numbers are not its own
                reasons.append(f"restarted: {key} ({s.restarts}x)")
            elif getattr(s, "unanswered", 0):   # not seen whole: dead for part of it, or we cannot tell
                reasons.append(f"unanswered: {key} ({s.unanswered} scrapes failed)")
            elif not s.output_tokens_per_s or not load or not rate:
                reasons.append(f"no traffic on {key}")
            else:
                flight[key] = (load, rate)
        loads = [load for load, _ in flight.values()]
        if not reasons and max(loads) > imbalance * min(loads):
            reasons.append(f"requests in flight {min(loads):.1f}..{max(loads):.1f}: spread beyond {imbalance:g}x")
        first = next(iter(row.values()))
        window = Window(index=first_index + k, phase=phase, start=first.start, end=first.end, valid=not reasons,
                        reasons=reasons, hosts={key: replace(s) for key, s in row.items()})   # copies: what it saw
        if not reasons:
            mean_load = sum(loads) / len(loads)
            window.throughput = {key: rate * mean_load for key, (_, rate) in flight.items()}
            window.in_flight = mean_load
        windows.append(window)
    return windows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _level(windows: list[Window]) -> int:
    """The evidence's concurrency: the median requests in flight per host over the valid windows."""
    loads = [w.in_flight for w in windows if w.valid]
    return max(1, round(median(loads))) if loads else 1


def _guard_ratio(plan: Plan, w: Window, field: str) -> dict[str, float] | None:
    """{p50, p99}: the window's canary/baseline ratio of a latency percentile (every host has it)."""
    out = {}
    for key in GUARD_KEYS:
        values = {t.key: (getattr(w.hosts[t.key], field) or {}).get(key) for t in plan.targets}
        if not all(values.values()):
            return None
        out[key] = (_geomean([values[t.key] for t in plan.canary]) / _geomean([values[t.key] for t in plan.baseline]))
    return out


def ratio_runs(plan: Plan, windows: list[Window]) -> list[Run]:
    """The calibrated design's runs: one per valid window, arm A calibration, arm B canary; each the
    window's canary/baseline ratio times the baseline hosts' geometric mean over all valid windows."""
    valid = [w for w in windows if w.valid]
    if not valid:
        return []
    ref = _geomean([w.throughput[t.key] for w in valid for t in plan.baseline])
    guard_ref = {}
    for field in GUARD_FIELDS:
        for key in GUARD_KEYS:
            seen = [(getattr(w.hosts[t.key], field) or {}).get(key) for w in valid for t in plan.baseline]
            if seen and all(seen):
                guard_ref[(field, key)] = _geomean(seen)
    level = _level(windows)
    runs, repeat = [], {"A": 0, "B": 0}
    for w in valid:
        arm = "A" if w.phase == CALIBRATION else "B"
        repeat[arm] += 1
        x = w.throughput
        ratio = _geomean([x[t.key] for t in plan.canary]) / _geomean([x[t.key] for t in plan.baseline])
        run = Run(arm=arm, repeat=repeat[arm], concurrency=level, output_tokens_per_s=ratio * ref, errors=0,
                  extra={"ratio": ratio, "phase": w.phase, "window": w.index,
                         "aborted": {"canary": sum(w.hosts[t.key].errors for t in plan.canary),
                                     "baseline": sum(w.hosts[t.key].errors for t in plan.baseline)}})
        for field in GUARD_FIELDS:
            ratios = _guard_ratio(plan, w, field)
            if ratios and all((field, key) in guard_ref for key in GUARD_KEYS):
                setattr(run, field, {key: ratios[key] * guard_ref[(field, key)] for key in GUARD_KEYS})
        runs.append(run)
    return runs


def _host_run(arm: str, repeat: int, level: int, value: float, w: Window, key: str, **more: Any) -> Run:
    s = w.hosts[key]
    return Run(arm=arm, repeat=repeat, concurrency=level, output_tokens_per_s=value, errors=0, ttft_ms=s.ttft_ms,
               tpot_ms=s.tpot_ms, extra={"raw_output_tokens_per_s": s.output_tokens_per_s, **more,
                                         "aborted": s.errors, "host": key, "window": w.index})


def host_runs(plan: Plan, windows: list[Window]) -> list[Run]:
    """The uncalibrated design's runs (--calibrate 0): one per host per valid canary window, arm A
    the baseline hosts, arm B the canary hosts."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    level = _level(windows)
    runs, repeat = [], {"A": 0, "B": 0}
    for w in windows:
        if not w.valid or w.phase != CANARY:
            continue
        for key in w.hosts:
            arm = arm_of[key]
            repeat[arm] += 1
            runs.append(_host_run(arm, repeat[arm], level, w.throughput[key], w, key, in_flight=w.in_flight))
    return runs


def candidate_death(plan: Plan, windows: list[Window]) -> Gone | None:
    """The candidate's death as its windows show it afterwards: the first canary window in which a
    canary worker's process was replaced (what a source that cannot watch, or a death after the last
    poll, leaves; the module doc)."""
    for w in windows:
        for t in plan.canary if w.phase == CANARY else ():
            if w.hosts[t.key].restarts:
                return Gone(t.key, w.start, w.end, f"its process was replaced in window {w.index}")
    return None


def mark_dead(plan: Plan, windows: list[Window], died: Gone) -> None:
    """Every canary window that ends after the last moment the candidate was seen alive: invalid."""
    for w in windows:
        if w.phase == CANARY and w.end > died.alive:
            w.valid, w.throughput, w.in_flight = False, None, None
            w.reasons.append(f"the candidate died: {died.key}")


def window_runs(plan: Plan, stats: dict[str, list[WindowStats]], imbalance: float = IMBALANCE,
                calibration: dict[str, list[WindowStats]] | None = None,
                died: Gone | None = None) -> tuple[list[Run], list[Window]]:
    """(runs, windows): the judged runs of either design, and every window with its validity; the
    windows from the candidate's death on (`died`, else `candidate_death`) are not judged."""
    before = assess_windows(plan, calibration, CALIBRATION, imbalance) if calibration else []
    after = assess_windows(plan, stats, CANARY, imbalance, first_index=len(before))
    windows = before + after
    died = died or candidate_death(plan, windows)
    if died is not None:
        mark_dead(plan, windows, died)
    if calibration:
        runs = ratio_runs(plan, windows)
        if not {r.arm for r in runs} >= {"A", "B"} and died is None:
            runs = []   # a phase without a valid window: nothing to compare (a dead candidate keeps what it has)
        return runs, windows
    return host_runs(plan, windows), windows


def unjudged_runs(plan: Plan, windows: list[Window]) -> list[Run]:
    """Runs of a canary that failed on errors with no comparable window: every (host, canary window)
    that served tokens, raw tokens/s, so the evidence of the rollback still holds what was seen."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    runs, repeat = [], {"A": 0, "B": 0}
    for w in windows:
        if w.phase != CANARY:
            continue
        for key, s in w.hosts.items():
            if s.output_tokens_per_s:
                repeat[arm_of[key]] += 1
                runs.append(_host_run(arm_of[key], repeat[arm_of[key]], 1, s.output_tokens_per_s, w, key,
                                      valid_window=False))
    return runs


# ---------------------------------------------------------------- the judgement (one place)

def judgement(runs: list[Run], unit_noise: float = 0.0, alpha: float = ALPHA) -> Judgement:
    """The evidence judgement of the runs: THE one call into knobkeeper.evidence.judge (the guards
    are in its family)."""
    return judge.judge(runs, METRIC, alpha=alpha, unit_noise=unit_noise)


def errors_alpha(alpha: float = ALPHA) -> float:
    """The level of the errors test: the guards' share of the family's alpha (1% of 5%)."""
    return alpha * (1 - judge.THROUGHPUT_SHARE)


def errors_test(plan: Plan, windows: list[Window], alpha: float = ALPHA) -> ErrorsTest:
    """Aborted requests on the canary hosts against the baseline hosts over the canary windows (valid
    or not: a failing canary serves few tokens, which can make its windows invalid, and the failures
    are the finding). Exact one-sided binomial test of the canary's share of the errors against its
    share of the requests (finished + aborted; hosts counted equal where an engine does not count)."""
    totals = {}
    for arm, targets in (("canary", plan.canary), ("baseline", plan.baseline)):
        rows = [w.hosts[t.key] for w in windows if w.phase == CANARY for t in targets]
        errors = sum(r.errors for r in rows)
        finished = [r.requests for r in rows]
        requests = None if any(f is None for f in finished) else sum(finished) + errors
        totals[arm] = ErrorCounts(errors=errors, requests=requests, hosts=len(targets))
    c, b = totals["canary"], totals["baseline"]
    if c.requests is not None and b.requests is not None and c.requests + b.requests > 0:
        share = c.requests / (c.requests + b.requests)
    else:
        share = c.hosts / (c.hosts + b.hosts)
    total = c.errors + b.errors
    if c.errors == 0 or share >= 1.0:
        p = 1.0
    else:
        # scipy (~55 ms here, ~1 s cold) only when the canary has errors to test
        from scipy import special

        p = float(special.bdtrc(c.errors - 1, total, share)) if share > 0 else 0.0  # P(X >= canary errors)
    return ErrorsTest(canary=c, baseline=b, share=share, p_value=p, alpha=errors_alpha(alpha),
                      failed=p < errors_alpha(alpha))


def restarts_of(plan: Plan, windows: list[Window]) -> int:
    """How often the canary workers' processes were replaced during the canary windows."""
    return sum(w.hosts[t.key].restarts for w in windows if w.phase == CANARY for t in plan.canary)


def decide(plan: Plan, windows: list[Window], judged: Judgement | None, alpha: float = ALPHA,
           died: Gone | None = None) -> tuple[str, list[str]]:
    """(verdict, failed guards): the level's verdict, "worse" when the candidate died (`died`, or
    `candidate_death` of the windows: first among the failed guards), any guard or the errors test
    failed."""
    died = died or candidate_death(plan, windows)
    failed = [f"the candidate died: {died.key}: {died.what}"] if died is not None else []
    failed += [f"{g.metric} {g.effect * 100:+.1f}%" for g in (judged.regressions if judged else [])]
    errors = errors_test(plan, windows, alpha)
    if errors.failed:
        failed.append(errors.text())
    levels = judged.levels if judged else []
    verdict = levels[0].verdict if levels else "inconclusive"
    return ("worse" if failed else verdict), failed
