"""The A/B judgement: per evidence file, which levels is the candidate (B) faster than the
baseline (A) at, and did it cost latency, with the error rate controlled over the whole file.

Per comparison — Welch's t on logs
----------------------------------
Throughput noise between benchmark repeats is multiplicative (a restart lands on a slightly
different clock, cache layout, scheduler phase: each moves throughput by a percentage), so we
work on y = ln(value). Per level and metric, with n_a runs of A and n_b runs of B:

    d   = mean(y_b) - mean(y_a)                       (log of the ratio of geometric means)
    se  = sqrt(s_a^2/n_a + s_b^2/n_b)                 (no equal-variance assumption)
    df  = Welch–Satterthwaite
    effect = exp(d) - 1,  95% CI = exp(d ± t(0.975, df)·se) - 1,  p = 2·P(T_df > |d/se|)

Why this and not a z-test, a bootstrap or Mann–Whitney: we have 2..20 repeats per arm. Welch's
t is exact for normal data with unequal variances up to the small df approximation, and
log-normal multiplicative noise is exactly normal on the log scale, so the CI and p-value keep
their coverage at n=2..3. A bootstrap under-covers at such n; Mann–Whitney cannot reach
p < 0.05 at all with 3 vs 3 runs (its smallest two-sided p is 0.1) and gives no interval.
Latencies (the guards) are judged the same way: they are positive and their run-to-run noise is
multiplicative too.

The family: every level x every judged metric, weighted Holm
------------------------------------------------------------
A claim is made per evidence file ("+4% at 80"), so the error rate is controlled per file:
with 3 levels at alpha 0.05 each, an A/A file showed a "better" or "worse" somewhere in 13.5% of
files. The family is every valid level's throughput plus its guard metrics (median and p99 TTFT
and TPOT, where the runs carry them). We use Holm's step-down procedure (Holm 1979) in its
weighted form, and report per hypothesis the raw p (`p_value`) and the Holm-adjusted p
(`p_adjusted`); every verdict uses the adjusted one.

- Why Holm: it controls the family-wise error rate at alpha under ANY dependence between the
  tests (levels share restarts; TTFT and throughput of one run are correlated), it is uniformly
  more powerful than Bonferroni, and its adjusted p-values are simple to recompute (`verify`).
  Hochberg or Hommel gain a little power but need positive dependence we cannot promise; a
  max-t/permutation method needs more runs than we have.
- Why weighted: throughput is the claim, the guards are a safety net that only has to catch
  large regressions (p99 TTFT +40%). Throughput hypotheses share 80% of alpha and the guards 20%
  (evenly within each group; all of alpha goes to throughput when no run carries latencies), so
  four guards per level cost the throughput test little power: per level alpha 0.04/levels
  instead of 0.05/(5·levels) with an even split.
- `recommended_repeats(levels=k)` sizes the runs for 80% power per level at the weighted
  Bonferroni level of one throughput hypothesis (Holm's first step; later steps only add power).

A guard judged "worse" (latency up, adjusted p < alpha) is a regression and is reported even
when throughput is better ("+12.8% throughput at 64, but p99 TTFT +40%").

Sequential stopping (`ab run`): repeated looks with alpha spending, by a union bound
-------------------------------------------------------------------------------------
`ab run` looks at the data after planned repeats n_1 < n_2 < ... < n_K = N (max repeats) and
stops a level once it is settled. Each look j spends a share Δf_j = f(n_j/N) - f(n_{j-1}/N) of
alpha, f(t) = t^SPENDING_POWER (a conservative-early spending function in the spirit of
O'Brien–Fleming: early looks only stop big effects, most alpha is left for the last look). For
each hypothesis, the sequential p-value is

    q = min over the looks it took part in of  p_j / Δf_j          (capped at 1)

and weighted Holm is applied to the q's. By the union bound P(q <= a) <= sum_j a·Δf_j = a under
the null whatever the correlation between looks, so q is a valid p-value; Holm on valid
p-values controls the family-wise rate; and stopping a level early only removes looks (q can
only be larger than had it continued), so data-dependent stopping keeps the bound. Why not a
classical group-sequential boundary (exact multivariate-normal spending) or a mixture SPRT:
both assume a known or well-estimated variance, and with 3..12 runs per arm the Student-t
looks are far from normal; the union bound is exact-enough, easy to recompute from the runs
(the evidence records the looks and the plan), and costs ~1 extra repeat at the last look.
A fixed design is the one-look case (q = p).

A level is settled at a look when its throughput verdict is "better"/"worse" (adjusted q <
alpha: it cannot change with more data) or "no detectable change". "No detectable change" is an
equivalence claim (two one-sided tests against ±MDE, TOST at 2.5% per side: the fixed design's
"95% CI inside ±MDE") and is spent over the looks the same way: at look j each one-sided test
runs at 2.5%·Δf_j, so over all looks a real ±5% effect is called "no change" at most 2.5% of
the time per side and level, and an A/A level does not settle on the first lucky look. (It is
per level, not family-wise: the claims the family protects are "better" and "worse".)

Real noise: the design measured on a real engine (bench/real_noise/README.md)
-------------------------------------------------------------------------------
On a real vLLM (CPU build, a loaded 2-core machine: a busy loop plus other work, c=16) the noise
is not the sim's 3%: 78 real 5-s windows in 13 restarted sessions gave a log-sd of 0.26 for one
window around its session's mean (a neighbour's burst sinks one window), 0.16 restart to
restart, and 0.42 for the FIRST window after a restart (an outlier now and then). Judging 4 runs
per arm as they came, a real halving (`--max-num-seqs 4` vs 256) was "-38.7%, inconclusive,
needs 200 runs/arm". Resampling those real pieces (alpha 0.05, A/A rate / power at the real 2x):

    design (runs per arm)                                     n=4          n=10
    first window after each restart judged                    0.042/0.42   0.043/0.90
    warm-up measured, not judged; next 5 s judged             0.036/0.76   0.053/0.99
    warm-up not judged, then 25-s runs          (chosen)      0.043/0.98   0.056/1.00
    ABBA blocks, one-sample t on within-block ln(B/A), 25 s   0.052/0.90   0.044/1.00
    twins side by side (canary-style), 2 cores, 10 pairs          -        power 0.25

So `ab run` on a real engine (knobkeeper.evidence.ab.engine_design) warms each block up for
defaults.REAL_WARMUP_S, records that window and never judges it, and judges runs of
defaults.REAL_RUN_S = 25 s, one per arm per block, in ABBA order, with this module's unpaired
Welch on logs and the sequential looks: 200 simulated sequential ab runs from the real pieces
decided the 2x in a median of 5 repeats per arm, A/A any-verdict rate 0.045. Rejected: judging
the first window (its 0.42 is the largest piece); more short runs (each costs a restart, 54-118 s
loaded, for 5 s of signal); the within-block ratio (pairing pays only for a slowly varying
background, but here the noise is a burst the neighbouring block does not share, so it just
halves the degrees of freedom: power 0.62 vs 0.76 at n=4 with 5-s runs; the ABBA ORDER stays, it
cancels linear drift for free); twins side by side (on 2 cores they fight for the cores: the
windows are anti-correlated and the effect shrank from 0.48 to 0.59-0.97; a core-binding knob
cannot be twinned at all). On a host where each twin has its own GPU, side by side is what the
canary does; this data cannot say which wins there. bench/real_noise/ab_runs.py adds the A/A
rate and power from the judged runs of real `ab run`s (the PD stack, decode's core binding).

Verdict (alpha = 0.05 family-wise, minimum effect of interest MDE = 5%)
-----------------------------------------------------------------------
    invalid               a validity gate failed (knobkeeper.evidence.validity); not in the family.
    inconclusive          fewer than 2 usable runs in an arm, or adjusted p >= alpha and the CI
                          reaches beyond ±MDE; `repeats_needed` says how many runs per arm would
                          detect ±MDE with 80% power at the observed noise and this family's level.
    better / worse        adjusted p < alpha; sign of the effect (for a latency guard: "worse"
                          = slower, a regression).
    no detectable change  adjusted p >= alpha and the equivalence interval (above; the 95% CI at
                          most) lies inside (-MDE, +MDE).

Schema-1 files were judged per level without a family: `judge(..., adjust=False)` reproduces
that judgement (p_adjusted = p), and readers show "unadjusted" beside those verdicts.

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
   fires in ~0.5% of them (3% noise) and the calibration holds. Guards use the same kept runs.

Anomaly (scaling) rule
----------------------
For each arm and each pair of adjacent levels c1 < c2: change = mean(c2)/mean(c1) - 1 and a
one-sided Welch test of "throughput at c2 is lower". Flagged when change < 0 and the one-sided
p < alpha; `confidence` = 1 - p. With a single run at either level there is no variance: a fall
of more than 2% is flagged with p_value and confidence null ("unconfirmed").
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import median
from typing import Any, Iterable, Mapping

from knobkeeper.evidence.defaults import ALPHA
from knobkeeper.evidence.model import (GUARDS, METRIC, Anomaly, Dropped, Adjustment, Guard, Judgement, Level, Run,
                                       Sequential)

MDE = 0.05
POWER = 0.80
DEFAULT_NOISE = 0.03          # log-sd assumed when an arm has < 2 runs (typical run-to-run noise)
OUTLIER_MADS = 5.0
OUTLIER_MIN_N = 5
OUTLIER_FLOOR = 0.10
UNCONFIRMED_FALL = 0.02
MAX_REPEATS = 200
THROUGHPUT_SHARE = 0.8        # of alpha, when guards are in the family (see "weighted" above)
FIRST_LOOK = 3                # the sequential design's first look (repeats per arm)
LOOK_GROWTH = 1.4             # each next planned look at ceil(1.4 x the previous)
CAP_FACTOR = 1.5             # the sequential cap, relative to the fixed design's n (see sequential_repeats)
SPENDING_POWER = 2.0          # f(t) = t^2

SETTLED = ("better", "worse", "no detectable change")
EQUIVALENCE_MAX = 0.025       # one-sided level of the equivalence tests: never looser than the 95% CI

METHOD = (
    "Welch's t-test on ln(value) per level and metric (Welch–Satterthwaite df); effect = ratio of "
    "geometric means - 1 with 95% CI exp(d ± t·se) - 1; family-wise error 0.05 over every level x "
    "metric by weighted Holm (throughput 80%, TTFT/TPOT guards 20%), verdicts on the adjusted p; "
    "minimum effect of interest ±5%; outliers: errored runs, and with n >= 5 runs > 5 MAD and > 10% "
    "from the arm's median on the log scale"
)
METHOD_UNADJUSTED = (
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
    d: float | None = None     # difference of log means
    se: float | None = None    # its standard error
    unit_noise: float = 0.0    # log-sd of an offset no run of the comparison averages out (see compare)

    def interval(self, one_sided: float) -> tuple[float, float] | None:
        """exp(d ± t(1 - one_sided, df)·se) - 1: the interval whose two one-sided tests are at
        `one_sided` each (0.025: the 95% CI)."""
        if self.d is None or self.se is None or self.df is None:
            return None
        if self.se == 0:
            return self.effect, self.effect
        # scipy on first use (why: in compare())
        from scipy import special

        t = float(special.stdtrit(self.df, 1 - one_sided))
        return _expm1_or_inf(self.d - t * self.se), _expm1_or_inf(self.d + t * self.se)


def _expm1_or_inf(x: float) -> float:
    """exp(x) - 1, or +inf past a float's range: a tiny share of alpha at 1-2 degrees of freedom
    puts t in the millions (a sweep's simultaneous interval after 2 blocks), and that bound is none."""
    return math.inf if x > 709 else math.expm1(x)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _var(xs: list[float]) -> float:
    m = _mean(xs)
    return sum((x - m) ** 2 for x in xs) / (len(xs) - 1)


def compare(a: Iterable[float], b: Iterable[float], alpha: float = ALPHA, unit_noise: float = 0.0) -> Comparison:
    """Welch's t on logs of two samples of positive numbers (B relative to A).

    `unit_noise`: the log-sd of an offset shared by every run of the comparison that more runs
    cannot average out (a canary host's restart lands on its own speed; all its windows carry it).
    Its variance is added to the standard error once, as a known term: Welch–Satterthwaite's df
    counts only the estimated variances (a known variance has infinite df)."""
    la = [math.log(x) for x in a]
    lb = [math.log(x) for x in b]
    n_a, n_b = len(la), len(lb)
    if n_a == 0 or n_b == 0:
        return Comparison(n_a, n_b, None, None, None, None, None, None, unit_noise=unit_noise)
    d = _mean(lb) - _mean(la)
    effect = math.expm1(d)
    if n_a < 2 or n_b < 2:
        return Comparison(n_a, n_b, effect, None, None, None, None, None, unit_noise=unit_noise)
    va, vb = _var(la), _var(lb)
    sd_log = math.sqrt(((n_a - 1) * va + (n_b - 1) * vb) / (n_a + n_b - 2))
    estimated = va / n_a + vb / n_b
    se2 = estimated + unit_noise ** 2
    if se2 <= 0.0:
        # Identical runs within each arm: any difference is exact.
        p = 1.0 if d == 0 else 0.0
        return Comparison(n_a, n_b, effect, effect, effect, p, float(n_a + n_b - 2), sd_log, d, 0.0)
    se = math.sqrt(se2)
    parts = (va / n_a) ** 2 / (n_a - 1) + (vb / n_b) ** 2 / (n_b - 1)
    df = se2 ** 2 / parts if parts > 0 else 1e9
    # scipy.special's Student-t functions: the same numbers as stats.t, ~50x faster (calibration).
    # Imported here: scipy costs ~1 s at start-up and most commands that read evidence never judge.
    from scipy import special

    t_crit = float(special.stdtrit(df, 1 - alpha / 2))
    p = float(2 * special.stdtr(df, -abs(d) / se))
    return Comparison(n_a, n_b, effect, math.expm1(d - t_crit * se), math.expm1(d + t_crit * se), p, df, sd_log,
                      d, se, unit_noise)


def power(n: int, sd_log: float, mde: float = MDE, alpha: float = ALPHA, unit_noise: float = 0.0) -> float:
    """Power of the two-sided test with n runs per arm to detect a relative effect of `mde`.

    Non-central t with df = n - 1: the smallest df Welch's test can have with n per arm, so the
    figure is conservative (the realised Welch df is between n-1 and 2n-2). `unit_noise` (see
    compare) stays in the standard error however large n grows, so power may never reach a target.
    """
    if n < 2:
        return 0.0
    if sd_log <= 0 and unit_noise <= 0:
        return 1.0
    delta = abs(math.log1p(mde))
    ncp = delta / math.sqrt(sd_log ** 2 * 2.0 / n + unit_noise ** 2)
    df = n - 1
    # scipy on first use (why: in compare())
    from scipy import special

    t_crit = special.stdtrit(df, 1 - alpha / 2)
    return float(1.0 - special.nctdtr(df, ncp, t_crit) + special.nctdtr(df, ncp, -t_crit))


def level_alpha(levels: int = 1, guards: bool = False, alpha: float = ALPHA) -> float:
    """The weighted-Bonferroni level of one level's throughput test in a family of `levels`
    levels (with or without guard metrics): Holm's first step, the level power is sized at."""
    share = THROUGHPUT_SHARE if guards else 1.0
    return alpha * share / max(1, levels)


def recommended_repeats(sd_log: float = DEFAULT_NOISE, mde: float = MDE, alpha: float = ALPHA,
                        target_power: float = POWER, *, levels: int = 1, guards: bool = False) -> int:
    """Smallest runs per arm that detect ±mde with `target_power` at every one of `levels` levels
    (family-wise alpha, guards in the family or not) at log-scale noise `sd_log`."""
    return _recommended(float(f"{sd_log:.3g}"), mde, level_alpha(levels, guards, alpha), target_power)


@lru_cache(maxsize=4096)
def _recommended(sd_log: float, mde: float, alpha: float, target_power: float, unit_noise: float = 0.0) -> int:
    for n in range(2, MAX_REPEATS + 1):
        if power(n, sd_log, mde, alpha, unit_noise) >= target_power:
            return n
    return MAX_REPEATS


# ---------------------------------------------------------------- the sequential plan

def planned_looks(max_repeats: int, first: int = FIRST_LOOK) -> list[int]:
    """Repeats per arm after which the sequential design looks: 3, 5, 7, 10, 14, ... up to the cap."""
    looks: list[int] = []
    n = min(max(2, first), max_repeats)
    while n < max_repeats:
        looks.append(n)
        n = max(n + 1, math.ceil(n * LOOK_GROWTH))
    return looks + [max_repeats]


def spent(look: int, previous: int, max_repeats: int) -> float:
    """Δf: the share of alpha the look at `look` repeats spends (previous look at `previous`)."""
    f = lambda n: (min(n, max_repeats) / max_repeats) ** SPENDING_POWER  # noqa: E731
    return f(look) - f(previous)


def sequential_repeats(sd_log: float = DEFAULT_NOISE, mde: float = MDE, alpha: float = ALPHA,
                       target_power: float = POWER, *, levels: int = 1, guards: bool = False) -> int:
    """The cap of the sequential design: the smallest N >= CAP_FACTOR x the fixed design's n
    whose last look alone (spending Δf_K of the level's alpha) has the fixed design's power. The
    factor leaves an A/A level room to settle as "no detectable change" before the cap (its
    equivalence tests are spent over the looks too); big effects stop at the first looks."""
    a = level_alpha(levels, guards, alpha)
    fixed_n = recommended_repeats(sd_log, mde, alpha, target_power, levels=levels, guards=guards)
    start = math.ceil(CAP_FACTOR * fixed_n)
    for n in range(start, MAX_REPEATS + 1):
        looks = planned_looks(n)
        last = spent(looks[-1], looks[-2] if len(looks) > 1 else 0, n)
        if power(n, sd_log, mde, a * last) >= target_power:
            return n
    return MAX_REPEATS


def sequential_rule(max_repeats: int, first: int = FIRST_LOOK) -> Sequential:
    """The plan recorded in the evidence (`sequential`), before any look is taken (`first`: the first
    look's repeats; a sweep looks after 2 already, to drop arms that are decisively worse)."""
    looks = planned_looks(max_repeats, first)
    return Sequential(rule=(f"looks after {', '.join(map(str, looks))} repeats per arm; "
                            f"alpha spending f(t) = t^{SPENDING_POWER:g}, t = repeats/{max_repeats}; sequential "
                            f"p = min over looks of p/Δf (union bound), weighted Holm over the family; a level "
                            f"stops when better/worse or its 95% CI is inside ±{MDE:.0%}"),
                      max_repeats=max_repeats, planned_looks=looks, spending=f"t^{SPENDING_POWER:g}", looks=[])


# ---------------------------------------------------------------- one level

Runs = Iterable["Run | Mapping[str, Any]"]


def _drop_outliers(runs: list[Run], metric: str) -> tuple[list[Run], list[Dropped]]:
    """(kept, dropped) for one arm at one level, by the outlier rule above."""
    kept = [r for r in runs if not r.failed]
    dropped = [Dropped(r.arm, r.repeat, r.raw(metric), "errors") for r in runs if r.failed]
    if len(kept) >= OUTLIER_MIN_N:
        logs = [math.log(r.raw(metric)) for r in kept]
        med = median(logs)
        mad = median(abs(x - med) for x in logs) * 1.4826
        if mad > 0:
            floor = math.log1p(OUTLIER_FLOOR)
            out = [abs(x - med) > OUTLIER_MADS * mad and abs(x - med) > floor for x in logs]
            dropped += [Dropped(r.arm, r.repeat, r.raw(metric), f"> {OUTLIER_MADS:g} MAD and > {OUTLIER_FLOOR:.0%} from median")
                        for r, o in zip(kept, out) if o]
            kept = [r for r, o in zip(kept, out) if not o]
    return kept, dropped


def _values(runs: list[Run], metric: str) -> list[float]:
    return [v for v in (r.value(metric) for r in runs) if v is not None]


@dataclass
class _LevelLook:
    """One level judged at one look: its Level row (raw p), the runs kept, the comparisons made."""

    level: Level
    kept_a: list[Run]
    kept_b: list[Run]
    throughput: Comparison


def _judge_level(runs_a: list[Run], runs_b: list[Run], metric: str, mde: float, alpha: float,
                 unit_noise: float) -> _LevelLook:
    kept_a, drop_a = _drop_outliers(runs_a, metric)
    kept_b, drop_b = _drop_outliers(runs_b, metric)
    c = compare([r.raw(metric) for r in kept_a], [r.raw(metric) for r in kept_b], unit_noise=unit_noise)
    verdict, needed = verdict_for(c, c.p_value, mde, alpha)
    level = Level(
        n_a=c.n_a, n_b=c.n_b,
        mean_a=_mean([r.raw(metric) for r in kept_a]) if kept_a else None,
        mean_b=_mean([r.raw(metric) for r in kept_b]) if kept_b else None,
        effect=c.effect, ci_low=c.ci_low, ci_high=c.ci_high, p_value=c.p_value, df=c.df, verdict=verdict,
        repeats_needed=needed,
        errored_runs={"A": sum(1 for d in drop_a if d.reason == "errors"),
                      "B": sum(1 for d in drop_b if d.reason == "errors")},
        outliers_dropped=drop_a + drop_b)
    return _LevelLook(level, kept_a, kept_b, c)


def verdict_for(c: Comparison, p: float | None, mde: float = MDE, alpha: float = ALPHA,
                power_alpha: float | None = None, equivalence_alpha: float = EQUIVALENCE_MAX,
                sizing: bool = True) -> tuple[str, int | None]:
    """(verdict, repeats_needed) of one comparison whose (adjusted) p is `p`; see above.

    `power_alpha`: the level `repeats_needed` is sized at; `equivalence_alpha`: each one-sided
    test of "no detectable change" (0.025: the 95% CI inside ±MDE); `sizing=False`: the verdict
    alone (repeats_needed None)."""
    need_alpha = power_alpha if power_alpha is not None else alpha
    if p is None or c.p_value is None:
        sd = c.sd_log if c.sd_log else DEFAULT_NOISE
        return "inconclusive", _recommended(float(f"{sd:.3g}"), mde, need_alpha, POWER, c.unit_noise) if sizing else None
    if p < alpha:
        return ("better" if c.effect > 0 else "worse"), None
    bounds = (c.ci_low, c.ci_high) if equivalence_alpha >= EQUIVALENCE_MAX else c.interval(equivalence_alpha)
    if bounds is not None and bounds[0] > -mde and bounds[1] < mde:
        return "no detectable change", None
    if not sizing:
        return "inconclusive", None
    return "inconclusive", _recommended(float(f"{max(c.sd_log or 0.0, 1e-6):.3g}"), mde, need_alpha, POWER,
                                        c.unit_noise)


# ---------------------------------------------------------------- the family

def holm(pvalues: list[float], weights: list[float] | None = None) -> list[float]:
    """Weighted Holm adjusted p-values (Holm 1979): reject H_i at alpha iff adjusted_i <= alpha."""
    m = len(pvalues)
    if m == 0:
        return []
    w = weights or [1.0 / m] * m
    order = sorted(range(m), key=lambda i: (pvalues[i] / w[i], i))
    out = [1.0] * m
    remaining = sum(w)
    running = 0.0
    for i in order:
        running = max(running, min(1.0, pvalues[i] * remaining / w[i]))
        out[i] = running
        remaining -= w[i]
    return out


def _by_level(runs: list[Run], arm: str) -> dict[int, list[Run]]:
    out: dict[int, list[Run]] = {}
    for r in runs:
        if r.arm == arm:
            out.setdefault(int(r.concurrency), []).append(r)
    return out


def _upto(runs: list[Run], n: int | None) -> list[Run]:
    return runs if n is None else [r for r in runs if int(r.repeat or 0) <= n]


def _looks_of(runs_a: list[Run], runs_b: list[Run], sequential: Sequential | None) -> list[tuple[int | None, float]]:
    """[(repeats, Δf)] of the looks this level took part in (fixed design: one look, all runs)."""
    if not sequential:
        return [(None, 1.0)]
    cap = int(sequential.max_repeats)
    out, previous = [], 0
    for look in sequential.looks:
        n = int(look.repeat)
        if len(_upto(runs_a, n)) >= n and len(_upto(runs_b, n)) >= n:
            out.append((n, spent(n, previous, cap)))
        previous = n
    return out or [(None, 1.0)]


@dataclass
class _Hypothesis:
    """One test of the family: a level's throughput or one guard metric at that level."""

    level: Level
    metric: str
    q: float                 # the sequential p (the raw p in a fixed design)
    cmp: Comparison
    share: float             # Δf of the last look it took part in
    p_adjusted: float = 1.0
    weight: float = 1.0      # its share of alpha in the family (set by _family)


def _hypotheses(ra: list[Run], rb: list[Run], level_at: int, metric: str, mde: float, alpha: float,
                adjust: bool, sequential: Sequential | None, unit_noise: float) -> tuple[Level, list[_Hypothesis]]:
    """A level's row (from its last look) and its hypotheses, each with its sequential p over the looks."""
    q: dict[str, float] = {}
    look: _LevelLook | None = None
    cmps: dict[str, Comparison] = {}
    last_share = 1.0
    latencies = any(r.ttft_ms or r.tpot_ms for r in ra) and any(r.ttft_ms or r.tpot_ms for r in rb)
    for n, share in _looks_of(ra, rb, sequential):
        last_share = share
        look = _judge_level(_upto(ra, n), _upto(rb, n), metric, mde, alpha, unit_noise)
        cmps = {metric: look.throughput}
        if adjust and latencies:
            for guard in GUARDS:
                ga, gb = _values(look.kept_a, guard), _values(look.kept_b, guard)
                if len(ga) >= 2 and len(gb) >= 2:
                    cmps[guard] = compare(ga, gb, unit_noise=unit_noise)
        for name, c in cmps.items():
            if c.p_value is not None and share > 0:
                seq_p = min(1.0, c.p_value / share)
                q[name] = seq_p if name not in q else min(q[name], seq_p)
    assert look is not None
    level = look.level
    level.concurrency = level_at
    return level, [_Hypothesis(level, name, q[name], c, last_share) for name, c in cmps.items() if name in q]


def _weights(hyps: list[_Hypothesis], metric: str, adjust: bool) -> list[float]:
    """Each hypothesis's share of alpha: throughput 80% and guards 20% (see above), evenly within each;
    without adjustment every test at alpha."""
    if not adjust:
        return [1.0] * len(hyps)
    throughput = sum(1 for h in hyps if h.metric == metric)
    guards = len(hyps) - throughput
    share = THROUGHPUT_SHARE if guards else 1.0
    return [share / throughput if h.metric == metric else (1 - share) / guards for h in hyps]


def judge(runs: Runs, metric: str = METRIC, mde: float = MDE, alpha: float = ALPHA, *,
          invalid: dict[int, list[str]] | None = None, sequential: Sequential | Mapping | None = None,
          adjust: bool = True, unit_noise: float = 0.0) -> Judgement:
    """The `judgement` of an evidence doc: per level, the guards, the family (see above).

    `invalid`: {level: reasons} from the validity gates (such levels are shown, not judged);
    `sequential`: the doc's `sequential` record (its `looks` taken and `max_repeats`), None for a
    fixed design; `adjust=False`: the schema-1 judgement (per level, throughput only, no family);
    `unit_noise`: see compare (a canary's restart noise), in every comparison of the family.
    """
    runs = [Run.of(r) for r in runs]
    return _family([("B", [r for r in runs if r.arm == "A"], [r for r in runs if r.arm == "B"], invalid or {})],
                   metric, mde, alpha, sequential, adjust, unit_noise)[0]["B"]


def judge_arms(runs: Runs, control: str, candidates: list[str], metric: str = METRIC, mde: float = MDE,
               alpha: float = ALPHA, *, invalid: Mapping[str, Mapping[int, list[str]]] | None = None,
               sequential: Sequential | Mapping | None = None, sizing: bool = True) -> dict[str, Judgement]:
    """A sweep's judgement: every candidate's levels and guards against `control` in ONE family
    (weighted Holm over every (candidate, level, metric), with the sequential looks), {candidate:
    its Judgement, B = the candidate, A = the control}. With one candidate it is `judge` of that pair.
    `invalid`: {candidate: {level: reasons}}, the validity gates of each pair.

    Each valid level's row also carries `extra["simultaneous"]` = [low, high]: its effect's interval
    at the hypothesis's own share of alpha (its Holm weight) and of the last look's spending, so that
    ALL the family's throughput intervals cover their effects at once with probability >= 1 - alpha
    (Bonferroni over the family, the union bound over the looks: the argument of the sequential p).
    """
    runs = [Run.of(r) for r in runs]
    base = [_as_arm(r, "A") for r in runs if r.arm == control]
    pairs = [(arm, base, [_as_arm(r, "B") for r in runs if r.arm == arm], dict((invalid or {}).get(arm, {})))
             for arm in candidates]
    judged, hyps = _family(pairs, metric, mde, alpha, sequential, True, 0.0, sizing)
    for arm in candidates:
        for h in hyps[arm]:
            if h.metric == metric:
                bounds = h.cmp.interval(alpha * h.weight * h.share / 2)
                if bounds is not None:   # an unbounded side (inf: see _expm1_or_inf) is stored as null
                    h.level.extra["simultaneous"] = [b if math.isfinite(b) else None for b in bounds]
    return judged


def _as_arm(run: Run, arm: str) -> Run:
    """The run as arm `arm` of a pair (a shallow copy: the pair's judgement names A and B)."""
    return run if run.arm == arm else dataclasses.replace(run, arm=arm)


def _family(pairs: list[tuple[str, list[Run], list[Run], Mapping[int, list[str]]]], metric: str, mde: float,
            alpha: float, sequential: Sequential | Mapping | None, adjust: bool,
            unit_noise: float, sizing: bool = True) -> tuple[dict[str, Judgement], dict[str, list[_Hypothesis]]]:
    """({label: Judgement}, {label: its hypotheses}) of each (label, A runs, B runs, invalid levels) pair, every pair's tests in
    one weighted Holm family (one pair: the A/B file's family)."""
    sequential = Sequential.of(sequential) if sequential else None
    per_pair: list[tuple[str, list[Level], list[_Hypothesis]]] = []
    hyps: list[_Hypothesis] = []
    for label, runs_a, runs_b, invalid in pairs:
        a, b = _by_level(runs_a, "A"), _by_level(runs_b, "B")
        levels: list[Level] = []
        mine: list[_Hypothesis] = []
        for conc in sorted(set(a) | set(b)):
            ra, rb = a.get(conc, []), b.get(conc, [])
            if conc in invalid:
                levels.append(Level(concurrency=conc, n_a=len(ra), n_b=len(rb), verdict="invalid",
                                    errored_runs={"A": 0, "B": 0}, invalid=list(invalid[conc])))
                continue
            level, level_hyps = _hypotheses(ra, rb, conc, metric, mde, alpha, adjust, sequential, unit_noise)
            levels.append(level)
            mine += level_hyps
        per_pair.append((label, levels, mine))
        hyps += mine
    weights = _weights(hyps, metric, adjust)
    if adjust:
        for h, p_adj in zip(hyps, holm([h.q for h in hyps], weights)):
            h.p_adjusted = p_adj
    else:
        for h in hyps:
            h.p_adjusted = h.q           # each level at alpha: p_adjusted = p
    weight_of = {id(h): w for h, w in zip(hyps, weights)}
    has_guards = any(h.metric != metric for h in hyps)
    out: dict[str, Judgement] = {}
    for label, levels, mine in per_pair:
        guard_rows = []
        for h in mine:
            w = weight_of[id(h)]
            h.weight = w
            verdict, needed = verdict_for(h.cmp, h.p_adjusted, mde, alpha, power_alpha=alpha * min(1.0, w),
                                          equivalence_alpha=EQUIVALENCE_MAX * h.share, sizing=sizing)
            if h.metric == metric:
                h.level.p_adjusted, h.level.verdict, h.level.repeats_needed = h.p_adjusted, verdict, needed
                if sequential:
                    h.level.p_sequential = h.q
                continue
            # A guard is a latency: "better" means lower, so the words flip relative to the effect's sign.
            word = {"better": "worse", "worse": "better"}.get(verdict, verdict)
            c = h.cmp
            guard_rows.append(Guard(concurrency=h.level.concurrency, metric=h.metric, effect=c.effect,
                                    ci_low=c.ci_low, ci_high=c.ci_high, p_value=c.p_value, p_adjusted=h.p_adjusted,
                                    verdict=word, regression=word == "worse", n_a=c.n_a, n_b=c.n_b))
        if not adjust:   # the schema-1 shape: no adjusted p, no guards, no family
            for level in levels:
                level.p_adjusted = None
            out[label] = Judgement(method=METHOD_UNADJUSTED, alpha=alpha, mde=mde, levels=levels)
            continue
        for level in levels:
            if level.valid and level.p_value is None:
                level.p_adjusted = None
        judged = Judgement(method=METHOD, alpha=alpha, mde=mde, unit_noise=unit_noise or None, levels=levels,
                           guards=guard_rows,
                           family=Adjustment(method="holm", alpha=alpha, size=len(hyps),
                                         weights={"throughput": THROUGHPUT_SHARE if has_guards else 1.0,
                                                  "guards": round(1 - THROUGHPUT_SHARE, 6) if has_guards else 0.0},
                                         sequential=bool(sequential)))
        out[label] = judged
    return out, {label: mine for label, _, mine in per_pair}


def settled(level: Level) -> bool:
    """Whether more runs at this level cannot change its throughput verdict's meaning."""
    verdict = level.verdict
    return verdict in SETTLED or verdict == "invalid"


def anomalies(runs: Runs, metric: str = METRIC, alpha: float = ALPHA) -> list[Anomaly]:
    """Throughput falling as concurrency rises, per arm, between adjacent levels (see above)."""
    runs = [Run.of(r) for r in runs]
    found = []
    for arm in ("A", "B"):
        levels = _by_level(runs, arm)
        concs = sorted(levels)
        for lo, hi in zip(concs, concs[1:]):
            x_lo = [r.raw(metric) for r in _drop_outliers(levels[lo], metric)[0]]
            x_hi = [r.raw(metric) for r in _drop_outliers(levels[hi], metric)[0]]
            if not x_lo or not x_hi:
                continue
            c = compare(x_lo, x_hi, alpha)
            if c.effect is None or c.effect >= 0:
                continue
            if c.p_value is None:
                if c.effect < -UNCONFIRMED_FALL:
                    found.append(Anomaly(arm, lo, hi, c.effect, None, None, "one run per level: unconfirmed"))
                continue
            p_one = c.p_value / 2  # one-sided: effect < 0 already
            if p_one < alpha:
                found.append(Anomaly(arm, lo, hi, c.effect, p_one, 1 - p_one))
    return found
