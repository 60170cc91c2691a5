"""Family-wise error control, guards, sequential stopping and drift: calibration by simulation.

In-process and seeded: synthetic throughputs with multiplicative log-normal noise (sd 3% on the
log scale). Each bound is the design's promise plus binomial slack (3 standard errors of the
nominal rate over the trials), so the tests hold whatever machine runs them.
- A/A files at 1, 3 and 5 levels: "better"/"worse" anywhere in <= 5% of files (+ slack).
- +5% at every level: each level judged "better" in >= 80% (- slack) at `recommended_repeats`.
- The sequential design: the same family-wise bound and power; it stops a +12.8% effect early.
- Guards: TTFT/TPOT judged in the same family; a latency regression is reported beside a gain.
- Drift: a 10% linear drift across an interleaved (ABBA) run keeps the A/A rate in bound, where
  running all of A then all of B calls it an effect.
"""

from __future__ import annotations

import math
import random

import pytest

from knobkeeper.evidence import judge
from knobkeeper.evidence.ab import Stopping, schedule

SD = 0.03
LEVELS = {1: [64], 3: [64, 80, 96], 5: [32, 48, 64, 80, 96]}
ACT = ("better", "worse")


def _slack(trials: int, p: float) -> float:
    return 3 * math.sqrt(p * (1 - p) / trials)


def _run(rng, arm, repeat, conc, scale=1.0, guards=False, latency_scale=1.0):
    run = {"arm": arm, "repeat": repeat, "concurrency": conc, "errors": 0,
           "output_tokens_per_s": 1000.0 * scale * math.exp(rng.gauss(0, SD))}
    if guards:
        run["ttft_ms"] = {"p50": 80 * latency_scale * math.exp(rng.gauss(0, 0.05)),
                          "p99": 140 * latency_scale * math.exp(rng.gauss(0, 0.10))}
        run["tpot_ms"] = {"p50": 12 * math.exp(rng.gauss(0, 0.03)), "p99": 20 * math.exp(rng.gauss(0, 0.08))}
    return run


def _fixed(rng, levels, n, effect=0.0, guards=False, drift=0.0, interleaved=True):
    order = schedule(n) if interleaved else [(r, "A") for r in range(1, n + 1)] + [(r, "B") for r in range(1, n + 1)]
    runs = []
    for k, (repeat, arm) in enumerate(order):
        scale = (1 + effect if arm == "B" else 1.0) * (1 + drift * k / (len(order) - 1))
        runs += [_run(rng, arm, repeat, c, scale, guards) for c in levels]
    return judge.judge(runs)


def _sequential(rng, levels, cap, effect=0.0):
    stopping = Stopping(levels, cap)
    runs = []
    for index, (repeat, arm) in enumerate(schedule(cap)):
        if not stopping.open:
            break
        runs += [_run(rng, arm, repeat, c, 1 + effect if arm == "B" else 1.0) for c in stopping.open]
        if index % 2 == 1:
            stopping.after_repeat(repeat, runs)
    return judge.judge(runs, sequential=stopping.record), stopping.record


def test_holm_adjusts_step_down_and_weights():
    assert judge.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert judge.holm([0.2]) == [0.2]
    # weighted: a hypothesis with 80% of the weight is tested at 0.8·alpha first
    adj = judge.holm([0.03, 0.03], [0.8, 0.2])
    assert adj[0] == pytest.approx(0.0375) and adj[1] == pytest.approx(0.0375)
    assert judge.holm([0.5, 0.9], [0.5, 0.5]) == pytest.approx([1.0, 1.0])


def test_recommended_repeats_counts_the_levels():
    one, three, five = (judge.recommended_repeats(SD, levels=k) for k in (1, 3, 5))
    assert one < three < five
    assert judge.power(three, SD, alpha=judge.level_alpha(3)) >= 0.8 > judge.power(three - 1, SD, alpha=judge.level_alpha(3))
    assert judge.recommended_repeats(SD, levels=3, guards=True) >= three
    assert judge.sequential_repeats(SD, levels=3) > three


@pytest.mark.parametrize("count", [1, 3, 5])
def test_calibration_family_wise_false_positive_rate(count):
    rng = random.Random(1000 + count)
    n = judge.recommended_repeats(SD, levels=count)
    trials = 1000
    hits = sum(any(lv.verdict in ACT for lv in _fixed(rng, LEVELS[count], n).levels) for _ in range(trials))
    assert hits / trials <= 0.05 + _slack(trials, 0.05), (count, hits / trials)


def test_unadjusted_per_level_rule_would_break_the_family_bound():
    """What the family buys: the same A/A files judged per level (schema 1) exceed 5% at 3 levels."""
    rng = random.Random(77)
    n = judge.recommended_repeats(SD, levels=3)
    trials, adjusted, unadjusted = 600, 0, 0
    for _ in range(trials):
        runs = [_run(rng, arm, r, c) for r, arm in schedule(n) for c in LEVELS[3]]
        adjusted += any(lv.verdict in ACT for lv in judge.judge(runs).levels)
        unadjusted += any(lv.verdict in ACT for lv in judge.judge(runs, adjust=False).levels)
    assert unadjusted > adjusted and unadjusted / trials > 0.08


@pytest.mark.parametrize("count", [1, 3, 5])
def test_calibration_power_plus_5_percent_at_every_level(count):
    rng = random.Random(2000 + count)
    n = judge.recommended_repeats(SD, levels=count)
    trials = 200
    better = sum(lv.verdict == "better" for _ in range(trials)
                 for lv in _fixed(rng, LEVELS[count], n, effect=0.05).levels)
    assert better / (trials * count) >= 0.80 - _slack(trials * count, 0.8), (count, better / (trials * count))


def test_calibration_guards_in_the_family():
    """A/A with TTFT/TPOT carried: no throughput verdict and no guard regression beyond the bound."""
    rng = random.Random(31)
    n = judge.recommended_repeats(SD, levels=3, guards=True)
    trials, hits = 600, 0
    for _ in range(trials):
        j = _fixed(rng, LEVELS[3], n, guards=True)
        assert j.family.size == 3 * 5
        hits += any(lv.verdict in ACT for lv in j.levels) or any(g.verdict in ACT for g in j.guards)
    assert hits / trials <= 0.05 + _slack(trials, 0.05)


def test_guard_regression_is_reported_beside_a_throughput_gain():
    rng = random.Random(5)
    runs = []
    for repeat, arm in schedule(6):
        slow = 1.4 if arm == "B" else 1.0
        runs += [_run(rng, arm, repeat, 64, 1.128 if arm == "B" else 1.0, guards=True, latency_scale=slow)]
    j = judge.judge(runs)
    assert j.levels[0].verdict == "better"
    p99 = next(g for g in j.guards if g.metric == "ttft_p99_ms")
    assert p99.verdict == "worse" and p99.regression and 0.25 < p99.effect < 0.6
    assert p99.p_adjusted >= p99.p_value
    tpot = next(g for g in j.guards if g.metric == "tpot_p50_ms")
    assert not tpot.regression


@pytest.mark.parametrize("count", [1, 3])
def test_calibration_sequential_family_wise_rate_and_power(count):
    rng = random.Random(3000 + count)
    cap = judge.sequential_repeats(SD, levels=count)
    trials = 250
    fp = sum(any(lv.verdict in ACT for lv in _sequential(rng, LEVELS[count], cap)[0].levels)
             for _ in range(trials))
    assert fp / trials <= 0.05 + _slack(trials, 0.05)
    better = sum(lv.verdict == "better" for _ in range(trials // 2)
                 for lv in _sequential(rng, LEVELS[count], cap, effect=0.05)[0].levels)
    assert better / (trials // 2 * count) >= 0.80 - _slack(trials // 2 * count, 0.8)


def test_sequential_stops_a_big_effect_early_and_records_its_looks():
    rng = random.Random(9)
    n_fixed = judge.recommended_repeats(SD, levels=3)
    cap = judge.sequential_repeats(SD, levels=3)
    used = []
    for _ in range(40):
        judgement, record = _sequential(rng, LEVELS[3], cap, effect=0.128)
        assert all(lv.verdict == "better" for lv in judgement.levels)
        used += [lv.n_a for lv in judgement.levels]
        # a level settles at a look it was open at, and is no longer loaded after it (ab.Stopping):
        # the next look opens exactly the levels left open, no level is measured past its look,
        # and the run ends (before the cap) once every level has settled
        assert all(int(c) in look.open for look in record.looks for c in look.settled)
        for look, after in zip(record.looks, record.looks[1:]):
            assert after.open == [c for c in look.open if str(c) not in look.settled]
        settled_at = {int(c): look.repeat for look in record.looks for c in look.settled}
        assert sorted(settled_at) == LEVELS[3]
        assert all(lv.n_a <= settled_at[lv.concurrency] for lv in judgement.levels)
    assert sum(used) / len(used) <= 0.6 * n_fixed
    assert record.looks[0].repeat == judge.FIRST_LOOK and record.max_repeats == cap


def test_sequential_p_is_the_union_bound_over_the_looks():
    rng = random.Random(4)
    judgement, record = _sequential(rng, [64], 12, effect=0.128)
    lv = judgement.levels[0]
    assert lv.p_sequential >= lv.p_value          # spending a share of alpha per look
    assert lv.p_adjusted == pytest.approx(lv.p_sequential)   # one hypothesis: Holm is the identity
    assert record.looks and record.planned_looks == judge.planned_looks(12)


def test_drift_interleaved_keeps_aa_in_bound_non_interleaved_does_not():
    rng = random.Random(11)
    n = judge.recommended_repeats(SD, levels=3)
    trials = 300
    inter = sum(any(lv.verdict in ACT for lv in _fixed(rng, LEVELS[3], n, drift=0.10).levels)
                for _ in range(trials))
    assert inter / trials <= 0.05 + _slack(trials, 0.05)
    blocked = sum(any(lv.verdict in ACT for lv in _fixed(rng, LEVELS[3], n, drift=0.10, interleaved=False).levels)
                  for _ in range(50))
    assert blocked / 50 > 0.5      # the same drift, not interleaved, reads as an effect
