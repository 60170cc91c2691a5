"""The A/B judgement: per concurrency level, is the candidate (B) faster than the baseline (A)?

Method — Welch's t on log-throughput
------------------------------------
Throughput noise between benchmark repeats is multiplicative (a restart lands on a slightly
different clock, cache layout, scheduler phase: each moves throughput by a percentage), so we
work on y = ln(throughput). Per level, with n_a runs of A and n_b runs of B:

    d   = mean(y_b) - mean(y_a)                       (log of the ratio of geometric means)
    se  = sqrt(s_a^2/n_a + s_b^2/n_b)                 (no equal-variance assumption)
    df  = Welch–Satterthwaite
    effect = exp(d) - 1,  95% CI = exp(d ± t(0.975, df)·se) - 1,  p = 2·P(T_df > |d/se|)

Why this and not a z-test, a bootstrap or Mann–Whitney: we have 2..10 repeats per arm. Welch's
t is exact for normal data with unequal variances up to the small df approximation, and
log-normal multiplicative noise is exactly normal on the log scale, so the CI and p-value keep
their 95% coverage at n=2..3. A bootstrap under-covers at such n; Mann–Whitney cannot reach
p < 0.05 at all with 3 vs 3 runs (its smallest two-sided p is 0.1) and gives no interval.
The calibration test (tests/test_evidence_judge.py) checks the false-positive rate and power
by simulation.

Verdict (alpha = 0.05, minimum effect of interest MDE = 5%)
----------------------------------------------------------
    inconclusive          fewer than 2 usable runs in an arm (no variance estimate), or
                          p >= alpha and the CI reaches beyond ±MDE (cannot tell "no effect"
                          from "an effect we care about"); `repeats_needed` then says how many
                          runs per arm would detect ±MDE with 80% power at the observed noise.
    better / worse        p < alpha; sign of the effect.
    no detectable change  p >= alpha and the whole 95% CI lies inside (-MDE, +MDE): any effect
                          is smaller than what we care about (an equivalence statement in the
                          TOST sense at 2.5% per side).

Outlier rule
------------
1. A run with errors > 0 is not compared (its throughput mixes served and failed work); it is
   counted in `errored_runs` and listed in `outliers_dropped`.
2. With >= 5 runs in an arm at a level, a run whose ln-throughput lies more than 5 robust
   standard deviations (1.4826·MAD) AND more than 10% from that arm's median at that level is
   dropped and listed (a stalled run, a noisy neighbour). With fewer runs nothing is dropped: a
   MAD from 4 points cannot tell an outlier from noise. Both conditions are needed because a MAD
   from 5..10 points is itself noisy: 5 MADs alone dropped a run in 13% of clean 9-vs-9
   comparisons at 3% noise and pushed the false-positive rate to 6%; with the 10% floor the rule
   fires in ~0.5% of them (3% noise) and the calibration holds.

Anomaly (scaling) rule
----------------------
For each arm and each pair of adjacent levels c1 < c2: change = mean(c2)/mean(c1) - 1 and a
one-sided Welch test of "throughput at c2 is lower". Flagged when change < 0 and the one-sided
p < alpha; `confidence` = 1 - p. With a single run at either level there is no variance: a fall
of more than 2% is flagged with p_value and confidence null ("unconfirmed").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any, Iterable

from functools import lru_cache


ALPHA = 0.05
MDE = 0.05
POWER = 0.80
DEFAULT_NOISE = 0.03          # log-sd assumed when an arm has < 2 runs (typical run-to-run noise)
OUTLIER_MADS = 5.0
OUTLIER_MIN_N = 5
OUTLIER_FLOOR = 0.10
UNCONFIRMED_FALL = 0.02
MAX_REPEATS = 200

METHOD = (
    "Welch's t-test on ln(throughput) per level (Welch–Satterthwaite df); effect = ratio of "
    "geometric means - 1 with 95% CI exp(d ± t·se) - 1; verdict at alpha 0.05 with a minimum "
    "effect of interest of ±5%; outliers: errored runs, and with n >= 5 runs > 5 MAD and > 10% "
    "from the arm's median on the log scale"
)


@dataclass(frozen=True)
class Comparison:
    n_a: int
    n_b: int
    effect: float | None
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    df: float | None
    sd_log: float | None       # pooled log-scale sd (for the power calculation)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: list[float]) -> float:
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def compare(a: Iterable[float], b: Iterable[float], alpha: float = ALPHA) -> Comparison:
    """Welch's t on logs of two samples of positive numbers (B relative to A)."""
    la = [math.log(x) for x in a]
    lb = [math.log(x) for x in b]
    n_a, n_b = len(la), len(lb)
    if n_a == 0 or n_b == 0:
        return Comparison(n_a, n_b, None, None, None, None, None, None)
    d = _mean(lb) - _mean(la)
    effect = math.expm1(d)
    if n_a < 2 or n_b < 2:
        return Comparison(n_a, n_b, effect, None, None, None, None, None)
    va, vb = _var(la), _var(lb)
    sd_log = math.sqrt(((n_a - 1) * va + (n_b - 1) * vb) / (n_a + n_b - 2))
    se2 = va / n_a + vb / n_b
    if se2 <= 0.0:
        # Identical runs within each arm: any difference is exact.
        p = 1.0 if d == 0 else 0.0
        return Comparison(n_a, n_b, effect, effect, effect, p, float(n_a + n_b - 2), sd_log)
    se = math.sqrt(se2)
    df = se2 ** 2 / ((va / n_a) ** 2 / (n_a - 1) + (vb / n_b) ** 2 / (n_b - 1))
    # scipy.special's Student-t functions: the same numbers as stats.t, ~50x faster (calibration).
    # Imported here: scipy costs ~1 s at start-up and most commands that read evidence never judge.
    from scipy import special

    t_crit = float(special.stdtrit(df, 1 - alpha / 2))
    p = float(2 * special.stdtr(df, -abs(d) / se))
    return Comparison(n_a, n_b, effect, math.expm1(d - t_crit * se), math.expm1(d + t_crit * se), p, df, sd_log)


def power(n: int, sd_log: float, mde: float = MDE, alpha: float = ALPHA) -> float:
    """Power of the two-sided test with n runs per arm to detect a relative effect of `mde`.

    Non-central t with df = n - 1: the smallest df Welch's test can have with n per arm, so the
    figure is conservative (the realised Welch df is between n-1 and 2n-2).
    """
    if n < 2:
        return 0.0
    if sd_log <= 0:
        return 1.0
    delta = abs(math.log1p(mde))
    ncp = delta / (sd_log * math.sqrt(2.0 / n))
    df = n - 1
    from scipy import special

    t_crit = special.stdtrit(df, 1 - alpha / 2)
    return float(1.0 - special.nctdtr(df, ncp, t_crit) + special.nctdtr(df, ncp, -t_crit))


def recommended_repeats(sd_log: float = DEFAULT_NOISE, mde: float = MDE, alpha: float = ALPHA,
                        target_power: float = POWER) -> int:
    """Smallest runs per arm that detect ±mde with `target_power` at log-scale noise `sd_log`."""
    return _recommended(float(f"{sd_log:.3g}"), mde, alpha, target_power)


@lru_cache(maxsize=4096)
def _recommended(sd_log: float, mde: float, alpha: float, target_power: float) -> int:
    for n in range(2, MAX_REPEATS + 1):
        if power(n, sd_log, mde, alpha) >= target_power:
            return n
    return MAX_REPEATS


def verdict_for(c: Comparison, mde: float = MDE, alpha: float = ALPHA) -> tuple[str, int | None]:
    """(verdict, repeats_needed) for one level; see the module docstring."""
    if c.p_value is None:
        sd = c.sd_log if c.sd_log else DEFAULT_NOISE
        return "inconclusive", recommended_repeats(sd, mde, alpha)
    if c.p_value < alpha:
        return ("better" if c.effect > 0 else "worse"), None
    if c.ci_low > -mde and c.ci_high < mde:
        return "no detectable change", None
    return "inconclusive", recommended_repeats(max(c.sd_log or 0.0, 1e-6), mde, alpha)


def _drop_outliers(runs: list[dict], metric: str) -> tuple[list[dict], list[dict]]:
    """(kept, dropped) for one arm at one level, by the outlier rule above."""
    kept = [r for r in runs if not r.get("errors")]
    dropped = [dict(r, reason="errors") for r in runs if r.get("errors")]
    if len(kept) >= OUTLIER_MIN_N:
        logs = [math.log(r[metric]) for r in kept]
        med = median(logs)
        mad = median(abs(x - med) for x in logs) * 1.4826
        if mad > 0:
            floor = math.log1p(OUTLIER_FLOOR)
            out = [abs(x - med) > OUTLIER_MADS * mad and abs(x - med) > floor for x in logs]
            dropped += [dict(r, reason=f"> {OUTLIER_MADS:g} MAD and > {OUTLIER_FLOOR:.0%} from median")
                        for r, o in zip(kept, out) if o]
            kept = [r for r, o in zip(kept, out) if not o]
    return kept, dropped


def judge_level(runs_a: list[dict], runs_b: list[dict], metric: str = "output_tokens_per_s",
                mde: float = MDE, alpha: float = ALPHA) -> dict[str, Any]:
    """The judgement of one level from its runs (dicts with `metric`, `errors`, `repeat`)."""
    kept_a, drop_a = _drop_outliers(runs_a, metric)
    kept_b, drop_b = _drop_outliers(runs_b, metric)
    c = compare([r[metric] for r in kept_a], [r[metric] for r in kept_b], alpha)
    verdict, needed = verdict_for(c, mde, alpha)
    return {
        "n_a": c.n_a, "n_b": c.n_b,
        "mean_a": _mean([r[metric] for r in kept_a]) if kept_a else None,
        "mean_b": _mean([r[metric] for r in kept_b]) if kept_b else None,
        "effect": c.effect, "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
        "df": c.df, "verdict": verdict, "repeats_needed": needed,
        "errored_runs": {"A": sum(1 for r in drop_a if r["reason"] == "errors"),
                         "B": sum(1 for r in drop_b if r["reason"] == "errors")},
        "outliers_dropped": [{"arm": arm, "repeat": r.get("repeat"), "value": r.get(metric), "reason": r["reason"]}
                             for arm, dropped in (("A", drop_a), ("B", drop_b)) for r in dropped],
    }


def _by_level(runs: list[dict], arm: str) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in runs:
        if r["arm"] == arm:
            out.setdefault(int(r["concurrency"]), []).append(r)
    return out


def judge(runs: list[dict], metric: str = "output_tokens_per_s", mde: float = MDE,
          alpha: float = ALPHA) -> dict[str, Any]:
    """The `judgement` object of an evidence doc: one entry per level present in both arms."""
    a, b = _by_level(runs, "A"), _by_level(runs, "B")
    levels = []
    for conc in sorted(set(a) | set(b)):
        entry = judge_level(a.get(conc, []), b.get(conc, []), metric, mde, alpha)
        levels.append({"concurrency": conc, **entry})
    return {"method": METHOD, "alpha": alpha, "mde": mde, "levels": levels}


def anomalies(runs: list[dict], metric: str = "output_tokens_per_s", alpha: float = ALPHA) -> list[dict]:
    """Throughput falling as concurrency rises, per arm, between adjacent levels (see above)."""
    found = []
    for arm in ("A", "B"):
        levels = _by_level(runs, arm)
        concs = sorted(levels)
        for lo, hi in zip(concs, concs[1:]):
            x_lo = [r[metric] for r in _drop_outliers(levels[lo], metric)[0]]
            x_hi = [r[metric] for r in _drop_outliers(levels[hi], metric)[0]]
            if not x_lo or not x_hi:
                continue
            c = compare(x_lo, x_hi, alpha)
            if c.effect is None or c.effect >= 0:
                continue
            if c.p_value is None:
                if c.effect < -UNCONFIRMED_FALL:
                    found.append({"arm": arm, "from_concurrency": lo, "to_concurrency": hi, "change": c.effect,
                                  "p_value": None, "confidence": None, "note": "one run per level: unconfirmed"})
                continue
            p_one = c.p_value / 2  # one-sided: effect < 0 already
            if p_one < alpha:
                found.append({"arm": arm, "from_concurrency": lo, "to_concurrency": hi, "change": c.effect,
                              "p_value": p_one, "confidence": 1 - p_one})
    return found


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x * 100:+.{digits}f}%"
