"""`canary`: the candidate value on some of a role's hosts, live traffic spread by the router, those
hosts compared with the rest over the same windows (same traffic, same minutes: drift cancels),
rolled back by itself when worse, promoted with the evidence attached when better.

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
held no requests (no traffic), or when the most and least loaded host differ by more than
`imbalance` x (default 2: the router is not spreading the load). No valid window at all: the canary
is put back and the command fails.

Guards: TTFT and TPOT percentiles, as ratios the same way, in the judgement's family (lower is
better). Errors: aborted requests on the canary hosts against the baseline hosts over the canary
windows, an exact one-sided binomial test (given the total, the canary's share of the errors is its
share of the requests when both fail alike) at 1% (the guards' share of alpha): a significant excess
fails the canary whatever its throughput. One error among thousands is not a finding.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable

from knobkeeper.errors import UserError
from knobkeeper.evidence.judge import ALPHA
from knobkeeper.evidence.metrics import Target, WindowStats, queries

METRIC = "output_tokens_per_s"
IMBALANCE = 2.0
RESTART_NOISE = 0.02
# The first window starts at least this long after the canary's deploy: the restarted engine warms up
# and the router re-spreads the load (health checks every few seconds).
SETTLE_MIN_S = 10.0
GUARD_FIELDS = ("ttft_ms", "tpot_ms")
GUARD_KEYS = ("p50", "p99")
CALIBRATION, CANARY = "calibration", "canary"

Apply = Callable[[list[Target], dict], None]


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

    def unit_noise(self, restart_noise: float, calibrated: bool) -> float:
        """The log-sd no window averages out (see the module doc: restart noise)."""
        if calibrated:
            return restart_noise / math.sqrt(len(self.canary))
        return restart_noise * math.sqrt(1 / len(self.canary) + 1 / len(self.baseline))


class CanaryWorse(Exception):
    """The canary was judged worse (or failed a guard) and was rolled back; `doc` is its evidence."""

    def __init__(self, doc: dict, reason: str):
        super().__init__(reason)
        self.doc = doc
        self.reason = reason


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
                   first_index: int = 0) -> list[dict]:
    """Every window of one phase with its validity and, when valid, each host's x (module doc)."""
    keys = [t.key for t in plan.targets]
    count = min((len(stats.get(key, [])) for key in keys), default=0)
    windows = []
    for k in range(count):
        row = {key: stats[key][k] for key in keys}
        reasons, flight = [], {}
        for key, s in row.items():
            load, rate = per_request_rate(s)
            if not s.output_tokens_per_s or not load or not rate:
                reasons.append(f"no traffic on {key}")
            else:
                flight[key] = (load, rate)
        loads = [load for load, _ in flight.values()]
        if not reasons and max(loads) > imbalance * min(loads):
            reasons.append(f"requests in flight {min(loads):.1f}..{max(loads):.1f}: spread beyond {imbalance:g}x")
        first = next(iter(row.values()))
        window = {"index": first_index + k, "phase": phase, "start": first.start, "end": first.end,
                  "valid": not reasons, "reasons": reasons, "hosts": {key: s.as_dict() for key, s in row.items()}}
        if not reasons:
            mean_load = sum(loads) / len(loads)
            window["throughput"] = {key: rate * mean_load for key, (_, rate) in flight.items()}
            window["in_flight"] = mean_load
        windows.append(window)
    return windows


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _level(windows: list[dict]) -> int:
    """The evidence's concurrency: the median requests in flight per host over the valid windows."""
    loads = [w["in_flight"] for w in windows if w["valid"]]
    return max(1, round(median(loads))) if loads else 1


def _guard_ratio(plan: Plan, w: dict, field: str) -> dict[str, float] | None:
    """{p50, p99}: the window's canary/baseline ratio of a latency percentile (every host has it)."""
    out = {}
    for key in GUARD_KEYS:
        values = {t.key: (w["hosts"][t.key].get(field) or {}).get(key) for t in plan.targets}
        if not all(values.values()):
            return None
        out[key] = (_geomean([values[t.key] for t in plan.canary]) / _geomean([values[t.key] for t in plan.baseline]))
    return out


def ratio_runs(plan: Plan, windows: list[dict]) -> list[dict]:
    """The calibrated design's runs: one per valid window, arm A calibration, arm B canary; each the
    window's canary/baseline ratio times the baseline hosts' geometric mean over all valid windows."""
    valid = [w for w in windows if w["valid"]]
    if not valid:
        return []
    ref = _geomean([w["throughput"][t.key] for w in valid for t in plan.baseline])
    guard_ref = {}
    for field in GUARD_FIELDS:
        for key in GUARD_KEYS:
            seen = [(w["hosts"][t.key].get(field) or {}).get(key) for w in valid for t in plan.baseline]
            if seen and all(seen):
                guard_ref[(field, key)] = _geomean(seen)
    level = _level(windows)
    runs, repeat = [], {"A": 0, "B": 0}
    for w in valid:
        arm = "A" if w["phase"] == CALIBRATION else "B"
        repeat[arm] += 1
        x = w["throughput"]
        ratio = _geomean([x[t.key] for t in plan.canary]) / _geomean([x[t.key] for t in plan.baseline])
        run = {"arm": arm, "repeat": repeat[arm], "concurrency": level, METRIC: ratio * ref, "ratio": ratio,
               "phase": w["phase"], "window": w["index"], "errors": 0,
               "aborted": {"canary": sum(w["hosts"][t.key]["errors"] for t in plan.canary),
                           "baseline": sum(w["hosts"][t.key]["errors"] for t in plan.baseline)}}
        for field in GUARD_FIELDS:
            ratios = _guard_ratio(plan, w, field)
            if ratios and all((field, key) in guard_ref for key in GUARD_KEYS):
                run[field] = {key: ratios[key] * guard_ref[(field, key)] for key in GUARD_KEYS}
        runs.append(run)
    return runs


def host_runs(plan: Plan, windows: list[dict]) -> list[dict]:
    """The uncalibrated design's runs (--calibrate 0): one per host per valid canary window, arm A
    the baseline hosts, arm B the canary hosts."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    level = _level(windows)
    runs, repeat = [], {"A": 0, "B": 0}
    for w in windows:
        if not w["valid"] or w["phase"] != CANARY:
            continue
        for key, s in w["hosts"].items():
            arm = arm_of[key]
            repeat[arm] += 1
            runs.append({"arm": arm, "repeat": repeat[arm], "concurrency": level, METRIC: w["throughput"][key],
                         "raw_output_tokens_per_s": s["output_tokens_per_s"], "in_flight": w["in_flight"],
                         "errors": 0, "aborted": s["errors"], "ttft_ms": s["ttft_ms"], "tpot_ms": s["tpot_ms"],
                         "host": key, "window": w["index"]})
    return runs


def window_runs(plan: Plan, stats: dict[str, list[WindowStats]], imbalance: float = IMBALANCE,
                calibration: dict[str, list[WindowStats]] | None = None) -> tuple[list[dict], list[dict]]:
    """(runs, windows): the judged runs of either design, and every window with its validity."""
    before = assess_windows(plan, calibration, CALIBRATION, imbalance) if calibration else []
    after = assess_windows(plan, stats, CANARY, imbalance, first_index=len(before))
    windows = before + after
    if calibration:
        runs = ratio_runs(plan, windows)
        if not {r["arm"] for r in runs} >= {"A", "B"}:
            runs = []   # a phase without a valid window: nothing to compare
        return runs, windows
    return host_runs(plan, windows), windows


def _unjudged_runs(plan: Plan, windows: list[dict]) -> list[dict]:
    """Runs of a canary that failed on errors with no comparable window: every (host, canary window)
    that served tokens, raw tokens/s, so the evidence of the rollback still holds what was seen."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    runs, repeat = [], {"A": 0, "B": 0}
    for w in windows:
        if w["phase"] != CANARY:
            continue
        for key, s in w["hosts"].items():
            if s["output_tokens_per_s"]:
                repeat[arm_of[key]] += 1
                runs.append({"arm": arm_of[key], "repeat": repeat[arm_of[key]], "concurrency": 1,
                             METRIC: s["output_tokens_per_s"], "raw_output_tokens_per_s": s["output_tokens_per_s"],
                             "errors": 0, "aborted": s["errors"], "ttft_ms": s["ttft_ms"],
                             "tpot_ms": s["tpot_ms"], "host": key, "window": w["index"], "valid_window": False})
    return runs


# ---------------------------------------------------------------- the judgement (one place)

def judgement(runs: list[dict], unit_noise: float = 0.0, alpha: float = ALPHA) -> dict:
    """The evidence judgement of the runs: THE one call into knobkeeper.evidence.judge (the guards
    are in its family)."""
    from knobkeeper.evidence import judge as J

    return J.judge(runs, METRIC, alpha=alpha, unit_noise=unit_noise)


def errors_alpha(alpha: float = ALPHA) -> float:
    """The level of the errors test: the guards' share of the family's alpha (1% of 5%)."""
    from knobkeeper.evidence import judge as J

    return alpha * (1 - J.THROUGHPUT_SHARE)


def errors_test(plan: Plan, windows: list[dict], alpha: float = ALPHA) -> dict:
    """Aborted requests on the canary hosts against the baseline hosts over the canary windows (valid
    or not: a failing canary serves few tokens, which can make its windows invalid, and the failures
    are the finding). Exact one-sided binomial test of the canary's share of the errors against its
    share of the requests (finished + aborted; hosts counted equal where an engine does not count)."""
    totals = {}
    for arm, targets in (("canary", plan.canary), ("baseline", plan.baseline)):
        rows = [w["hosts"][t.key] for w in windows if w["phase"] == CANARY for t in targets]
        errors = sum(r["errors"] for r in rows)
        finished = [r.get("requests") for r in rows]
        requests = None if any(f is None for f in finished) else sum(finished) + errors
        totals[arm] = {"errors": errors, "requests": requests, "hosts": len(targets)}
    c, b = totals["canary"], totals["baseline"]
    if c["requests"] is not None and b["requests"] is not None and c["requests"] + b["requests"] > 0:
        share = c["requests"] / (c["requests"] + b["requests"])
    else:
        share = c["hosts"] / (c["hosts"] + b["hosts"])
    total = c["errors"] + b["errors"]
    if c["errors"] == 0:
        p = 1.0
    elif share >= 1.0:
        p = 1.0
    else:
        from scipy import special

        p = float(special.bdtrc(c["errors"] - 1, total, share)) if share > 0 else 0.0  # P(X >= canary errors)
    return {"canary": c, "baseline": b, "share": share, "p_value": p, "alpha": errors_alpha(alpha),
            "failed": p < errors_alpha(alpha)}


def _errors_line(test: dict) -> str:
    c, b = test["canary"], test["baseline"]

    def side(t: dict) -> str:
        return f"{t['errors']} of {t['requests']} requests" if t["requests"] is not None else f"{t['errors']}"

    p = test["p_value"]
    return f"errors {side(c)} on the canary vs {side(b)} on the baseline (p {'< 1e-12' if p < 1e-12 else f'{p:.2g}'})"


def decide(plan: Plan, windows: list[dict], judged: dict | None, alpha: float = ALPHA) -> tuple[str, list[str]]:
    """(verdict, failed guards): the level's verdict, "worse" when any guard or the errors test failed."""
    failed = [f"{g['metric']} {g['effect'] * 100:+.1f}%" for g in (judged or {}).get("guards") or []
              if g.get("regression")]
    errors = errors_test(plan, windows, alpha)
    if errors["failed"]:
        failed.append(_errors_line(errors))
    levels = (judged or {}).get("levels") or []
    verdict = levels[0]["verdict"] if levels else "inconclusive"
    return ("worse" if failed else verdict), failed


# ---------------------------------------------------------------- orchestration

def _windows_of(count: int, interval: float, on_window: Callable[[int, int], None] | None, done: int,
                total: int) -> list[float]:
    """Wait out `count` windows of `interval` s; their edges (unix s)."""
    edges = [time.time()]
    for k in range(count):
        time.sleep(max(0.0, edges[0] + (k + 1) * interval - time.time()))
        edges.append(time.time())
        if on_window:
            on_window(done + k + 1, total)
    return edges


def run_canary(plan: Plan, source, apply: Apply, restore: Callable[[], None], *, duration: float,
               interval: float, calibrate: float | None = None, settle: float | None = None,
               imbalance: float = IMBALANCE, restart_noise: float = RESTART_NOISE, alpha: float = ALPHA,
               setup: dict | None = None, on_window: Callable[[int, int], None] | None = None) -> dict:
    """Calibrate, deploy the candidate to the canary hosts, collect the windows, judge; returns the
    doc (unwritten).

    `calibrate`: seconds of windows before the deploy (default: `duration`, the most power for the
    time; 0: none, the uncalibrated design). `apply(canary_targets, {knob: value})` puts the
    candidate on the canary hosts (gated); `restore()` puts them back to the declared state.
    Once apply has begun, restore() runs on every failure, Ctrl-C or SIGTERM, and after a "worse"
    verdict (then CanaryWorse carries the doc). On any other verdict the canary stays in place: the
    caller promotes it or calls restore(). `settle`: seconds after the deploy before the first
    window (default: one interval, at least SETTLE_MIN_S). `alpha`: the family-wise error rate of the
    judgement (0.05; a stricter one asks more of a canary before it promotes or rolls back).
    """
    from knobkeeper.evidence.store import build_doc

    calibrate = duration if calibrate is None else calibrate
    if interval <= 0 or duration < 2 * interval:
        raise UserError(f"--duration {duration:g} / --interval {interval:g}: expected at least 2 windows "
                        f"(duration >= 2 x interval > 0)")
    if calibrate and calibrate < 2 * interval:
        raise UserError(f"--calibrate {calibrate:g}: expected 0 or at least 2 windows of {interval:g} s")
    if not 0 < alpha < 1:
        raise UserError(f"--alpha {alpha:g}: expected a probability between 0 and 1 (0.05)")
    if not 0 <= restart_noise < 1:
        raise UserError(f"--restart-noise {restart_noise:g}: expected a log-sd from 0 to 1 (0.02: 2%)")
    source.check()  # unreachable Prometheus, a worker without series: refused before anything deploys
    n_windows, n_calibration = int(duration // interval), int(calibrate // interval)
    total = n_windows + n_calibration
    started = time.time()
    applied = rolled_back = False
    from knobkeeper.deploy.api import terminate_as_interrupt

    with terminate_as_interrupt():  # SIGTERM as Ctrl-C: the same `except` puts the hosts back
        try:
            source.start()
            calibration_edges = _windows_of(n_calibration, interval, on_window, 0, total) if n_calibration else []
            applied = True
            apply(plan.canary, {plan.knob: plan.value})
            deployed = time.time()
            time.sleep(max(interval, SETTLE_MIN_S) if settle is None else settle)
            edges = _windows_of(n_windows, interval, on_window, n_calibration, total)
            source.stop()
            calibration = source.windows(calibration_edges) if calibration_edges else None
            runs, windows = window_runs(plan, source.windows(edges), imbalance, calibration)
            noise = plan.unit_noise(restart_noise, bool(calibration))
            judged = judgement(runs, noise, alpha) if runs else None
            verdict, failed = decide(plan, windows, judged, alpha)
            if not runs and verdict == "worse":
                runs, noise = _unjudged_runs(plan, windows), 0.0
            if not runs:
                reasons = sorted({r for w in windows for r in w["reasons"]})
                raise UserError(f"canary: no valid window ({'; '.join(reasons[:3]) or 'no data'}); the canary "
                                f"hosts were put back")
        except BaseException:
            if applied:
                rolled_back = True
                restore()
            try:
                source.stop()   # a second stop is harmless; the scrape thread must not outlive the run
            except Exception:
                pass
            raise
        if verdict == "worse":
            restore()
            rolled_back = True
    verdict_s = time.time() - started
    calibrated = bool(calibration)
    before = "canary hosts before the change, relative to the baseline hosts" if calibrated else "baseline hosts"
    after = "canary hosts with the candidate, relative to the baseline hosts" if calibrated else "canary hosts"
    arms = {"A": {"label": before, "knobs": {plan.knob: plan.baseline_value}},
            "B": {"label": after, "knobs": {plan.knob: plan.value}}}
    invalid = [w for w in windows if not w["valid"]]
    canary_block = {
        "hosts": {"canary": [t.key for t in plan.canary], "baseline": [t.key for t in plan.baseline]},
        "source": {"kind": source.name, "url": getattr(source, "url", None)},
        "queries": queries(interval) if source.name == "prometheus" else {
            "output_tokens_per_s": "increase of sglang:generation_tokens_total between the samples at the "
                                   "window edges / their time apart",
            "decoding": "increase of sglang:inter_token_latency_seconds_sum / the time apart",
            "itl_ms": "1000 x increase of ..._sum / increase of ..._count",
            "running": "mean of sglang:num_running_reqs samples in the window",
            "requests": "increase of sglang:num_requests_total",
            "errors": "increase of sglang:num_aborted_requests_total",
            "ttft_ms/tpot_ms": "histogram_quantile on the bucket increases (Prometheus's interpolation)"},
        "design": ("calibrated: per-window canary/baseline ratios, canary windows (B) against calibration "
                   "windows (A)" if calibrated else "uncalibrated: every (host, canary window) a run"),
        "interval_s": interval, "duration_s": duration, "calibration_s": n_calibration * interval if calibrated else 0,
        "calibration_windows": sum(1 for w in windows if w["phase"] == CALIBRATION),
        "imbalance_threshold": imbalance, "restart_noise": restart_noise,
        "normalisation": "tokens/s per request in flight x the window's mean requests in flight "
                         "(see knobkeeper.evidence.canary)",
        "windows": windows, "errors": errors_test(plan, windows, alpha), "verdict": verdict, "failed_guards": failed,
        "rolled_back": rolled_back, "deployed_at": deployed, "seconds_to_verdict": round(verdict_s, 3),
    }
    reasons = [f"window {w['index']} ({w['phase']}): {'; '.join(w['reasons'])}" for w in invalid]
    doc = build_doc(knob=plan.knob, role=plan.role, arms=arms, runs=runs,
                    setup={**(setup or {}), "workload": {"api": None, "duration_s": duration}},
                    source={"tool": "knobkeeper canary", "format": "canary"}, extra={"canary": canary_block},
                    notes=reasons, judge_options=_judge_options(noise, alpha))
    if verdict == "worse":
        raise CanaryWorse(doc, f"canary worse: {', '.join(failed) or 'throughput'}; canary hosts rolled back")
    return doc


def _judge_options(unit_noise: float, alpha: float) -> dict | None:
    """What the doc records of the judgement's parameters (the defaults are left out)."""
    options = {**({"unit_noise": unit_noise} if unit_noise else {}), **({"alpha": alpha} if alpha != ALPHA else {})}
    return options or None


def longer_canary(doc: dict) -> str | None:
    """"a canary of ~N s would detect ±5%", from the observed window noise and the restart noise of
    the design (windows per arm: per phase, or host-windows / hosts uncalibrated); None when the
    verdict is settled or no length would do."""
    from knobkeeper.evidence import judge as J

    levels = doc["judgement"]["levels"]
    if not levels or levels[0]["verdict"] != "inconclusive":
        return None
    c = doc["canary"]
    logs = {arm: [math.log(r[METRIC]) for r in doc["runs"] if r["arm"] == arm] for arm in ("A", "B")}
    if min(len(v) for v in logs.values()) < 2:
        return None
    pooled = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in logs.values())
    sd = math.sqrt(pooled / (sum(len(v) for v in logs.values()) - 2))
    per_window = 1 if c.get("calibration_windows") else min(len(c["hosts"]["canary"]), len(c["hosts"]["baseline"]))
    noise = float(doc["judgement"].get("unit_noise") or 0.0)
    alpha = J.level_alpha(1, guards=bool(doc["judgement"].get("guards")), alpha=doc["judgement"]["alpha"])
    needed = J._recommended(float(f"{max(sd, 1e-6):.3g}"), J.MDE, alpha, J.POWER, noise)
    if needed >= J.MAX_REPEATS:
        return (f"no canary length on {len(c['hosts']['canary'])} canary host(s) would detect ±{J.MDE:.0%}: "
                f"their restart noise (±{noise:.1%}) stays whatever the windows; use more canary hosts (--hosts)")
    windows = math.ceil(needed / per_window)
    if c.get("calibration_windows"):
        return (f"a canary of about {windows * c['interval_s']:.0f} s after {windows * c['interval_s']:.0f} s of "
                f"calibration ({windows} windows each) would detect ±{J.MDE:.0%}")
    return f"a canary of about {windows * c['interval_s']:.0f} s ({windows} windows) would detect ±{J.MDE:.0%}"


# ---------------------------------------------------------------- the project-level command

@dataclass
class Outcome:
    doc: dict
    verdict: str
    action: str            # "rolled back" | "promoted" | "put back"
    evidence_path: str
    entry: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "worse" else 0


def canary(project, plan: Plan, source, apply: Apply, restore: Callable[[], None], *, duration: float,
           interval: float, promote: bool = False, promote_rest: Callable[[], None] | None = None,
           reason: str | None = None, setup: dict | None = None, settle: float | None = None,
           calibrate: float | None = None, restart_noise: float = RESTART_NOISE, alpha: float = ALPHA,
           imbalance: float = IMBALANCE, on_window: Callable[[int, int], None] | None = None) -> Outcome:
    """Run the canary, write its evidence (one commit), then roll back, promote or put back.

    Promote ("better" and `promote`): `set KNOB=VALUE --role R --evidence ID` (the usual entry, one
    commit), then `promote_rest()` deploys the declared state to the whole role. Any other verdict
    but "worse": the canary hosts are put back (restore) and knobs.toml is left as it was.
    """
    from knobkeeper.evidence.store import write

    if promote and promote_rest is None:
        raise UserError("--promote: no deploy to promote with")
    try:
        doc = run_canary(plan, source, apply, restore, duration=duration, interval=interval, settle=settle,
                         calibrate=calibrate, restart_noise=restart_noise, alpha=alpha, imbalance=imbalance, setup=setup,
                         on_window=on_window)
    except CanaryWorse as worse:
        path = write(project, worse.doc)
        return Outcome(worse.doc, "worse", "rolled back", project.rel(path))
    verdict = doc["canary"]["verdict"]
    if verdict == "better" and promote:
        from knobkeeper.changelog.ops import set_knob
        from knobkeeper.fmt import pct

        path = write(project, doc)
        try:
            change = set_knob(project, plan.knob, _raw(plan.value), plan.role,
                              reason or f"canary on {', '.join(t.key for t in plan.canary)}: "
                                        f"{pct(doc['judgement']['levels'][0]['effect'])} tokens/s",
                              [doc["id"]])
        except BaseException:
            restore()
            raise
        promote_rest()
        return Outcome(doc, verdict, "promoted", project.rel(path), change.entry.id)
    restore()
    path = write(project, doc)
    return Outcome(doc, verdict, "put back", project.rel(path))


def _raw(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---------------------------------------------------------------- `knobkeeper canary` through the deploy

def deploy_switch(project, inventory: str, plan: Plan) -> tuple[Apply, Callable[[], None], Callable[[], None]]:
    """(apply, restore, promote_rest) backed by the real deploy (knobkeeper.deploy.api.run_deploy).

    apply: the role only, the canary hosts only (pyinfra --limit), the candidate as a knob override
    keyed by service ("HOST/SERVICE", the targets' keys), so only the canary workers' launch scripts
    change and only they restart, also on a host that runs baseline workers too (never in
    knobs.toml); recorded as a deploy with options.canary = {"phase": "candidate", ...};
    restore: the same workers back to the declared state (phase "rollback"); promote_rest: the whole
    role at the declared state (after the `set`), phase "promote". Every gate holds as usual.
    """
    from knobkeeper.deploy.api import run_deploy

    hosts = sorted({t.host for t in plan.canary})
    services = [t.key for t in plan.canary]
    tag = {"knob": plan.knob, "value": plan.value, "hosts": hosts, "services": services}

    def deploy(phase: str, overrides: dict | None, limit: list[str] | None) -> None:
        result = run_deploy(project, inventory, only=plan.role, knob_overrides=overrides, limit=limit,
                            extra_data={"canary": {**tag, "phase": phase}})
        if not result.ok:
            raise UserError(f"canary: {phase} deploy of {inventory} failed: {result.error}")

    def apply(targets: list[Target], knobs: dict) -> None:
        deploy("candidate", {t.key: dict(knobs) for t in targets}, sorted({t.host for t in targets}))

    def restore() -> None:
        deploy("rollback", None, hosts)

    def promote_rest() -> None:
        deploy("promote", None, None)

    return apply, restore, promote_rest


def canary_command(project, spec: str, *, role: str, inventory: str, hosts: int | None = None,
                   host_names: list[str] | None = None, duration: float = 600, interval: float = 30,
                   prometheus: str | None = None, promote: bool = False, reason: str | None = None,
                   scrape_interval: float = 1.0, calibrate: float | None = None,
                   restart_noise: float = RESTART_NOISE, alpha: float = ALPHA,
                   on_window: Callable[[int, int], None] | None = None) -> Outcome:
    """`knobkeeper canary KNOB=VALUE --role R ...`: everything checked before anything deploys."""
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.evidence.metrics import PrometheusSource, ScrapeSource, targets_of
    from knobkeeper.evidence.store import git_sha, parse_knob_spec
    from knobkeeper.knobs.state import read_declared, value_of

    knob, value = parse_knob_spec(project, spec, role, "KNOB=VALUE")
    stack = load_stack(project.root, inventory)
    if role not in stack.roles:
        raise UserError(f"--role {role}: not a role of {inventory} (roles: {', '.join(stack.order)})")
    canary_t, baseline_t = choose(targets_of(stack, [role]), role, hosts, host_names)
    declared = value_of(read_declared(project.knobs_path), stack.scope(role), knob) if project.knobs_path.exists() else None
    plan = Plan(knob, value, declared, role, canary_t, baseline_t)
    apply, restore, promote_rest = deploy_switch(project, inventory, plan)
    source = (PrometheusSource(prometheus, plan.targets, scrape_interval) if prometheus
              else ScrapeSource(plan.targets, scrape_interval))
    from knobkeeper.engine.pins import evidence_setup

    setup = {"inventory": inventory, "git_sha": git_sha(project), **evidence_setup(stack, role)}
    return canary(project, plan, source, apply, restore, duration=duration, interval=interval, promote=promote,
                  promote_rest=promote_rest, reason=reason, setup=setup, calibrate=calibrate,
                  restart_noise=restart_noise, alpha=alpha, on_window=on_window)


def report_lines(out: Outcome) -> list[str]:
    """What `knobkeeper canary` prints: verdict, effect, windows, what was done, the evidence."""
    from knobkeeper.evidence.store import summary_line

    c = out.doc["canary"]
    counts = {phase: [sum(1 for w in c["windows"] if w["phase"] == phase and w["valid"]),
                      sum(1 for w in c["windows"] if w["phase"] == phase)] for phase in (CALIBRATION, CANARY)}
    phases = ", ".join(f"{phase} {valid} valid of {n}" for phase, (valid, n) in counts.items() if n)
    lines = [f"canary {out.doc['knob']}={_raw(out.doc['arms']['B']['knobs'][out.doc['knob']])} on "
             f"{', '.join(c['hosts']['canary'])} vs {', '.join(c['hosts']['baseline'])}: {out.verdict}",
             f"  {summary_line(out.doc)}",
             f"  windows: {phases} ({c['interval_s']:g} s each, source {c['source']['kind']}; "
             f"restart noise ±{c['restart_noise']:.1%})"]
    if c["failed_guards"]:
        lines.append(f"  failed guards: {', '.join(c['failed_guards'])}")
    lines.append(f"  {out.action}; evidence {out.doc['id']} ({out.evidence_path})")
    if out.entry:
        lines.append(f"  entry {out.entry}: set {out.doc['knob']} on {out.doc['role']} with --evidence {out.doc['id']}")
    hint = longer_canary(out.doc)
    if hint and out.verdict == "inconclusive":
        lines.append(f"  {hint}")
    return lines
