"""The judgement: unit behaviour, the outlier rule, anomalies, and its calibration by simulation.

Calibration (in-process, seeded, a few seconds): synthetic throughputs with multiplicative
log-normal noise (sd 3% on the log scale).
- A/A: over N comparisons the false-positive rate (verdict better or worse) must be <= 5% plus
  binomial slack: 3 standard errors of a 5% rate over N trials (N=3000: 5% + 1.2%).
- A +5% effect must be detected (verdict "better") in >= 80% of comparisons (minus the same
  slack) at `recommended_repeats()`, the default `ab run` uses.
"""

from __future__ import annotations

import math
import random

import pytest

from knobkeeper.evidence import judge

SD = 0.03


def _runs(arm: str, values: list[float], conc: int = 64, errors: list[int] | None = None) -> list[dict]:
    return [{"arm": arm, "repeat": i + 1, "concurrency": conc, "output_tokens_per_s": v,
             "errors": (errors or [0] * len(values))[i]} for i, v in enumerate(values)]


def _draw(rng: random.Random, n: int, scale: float = 1.0) -> list[float]:
    return [1000.0 * scale * math.exp(rng.gauss(0.0, SD)) for _ in range(n)]


def _slack(n_trials: int, p: float) -> float:
    return 3 * math.sqrt(p * (1 - p) / n_trials)


def test_recommended_repeats_and_power_are_consistent():
    n = judge.recommended_repeats(SD)
    assert 4 <= n <= 12
    assert judge.power(n, SD) >= 0.8 > judge.power(n - 1, SD)
    assert judge.recommended_repeats(0.01) < n < judge.recommended_repeats(0.05)


def test_calibration_false_positive_rate_aa():
    rng = random.Random(20261129)
    n = judge.recommended_repeats(SD)
    trials = 3000
    false_pos = 0
    for _ in range(trials):
        level = judge.judge(_runs("A", _draw(rng, n)) + _runs("B", _draw(rng, n))).levels[0]
        false_pos += level.verdict in ("better", "worse")
    rate = false_pos / trials
    print(f"A/A false-positive rate at n={n}: {rate:.2%}")
    assert rate <= 0.05 + _slack(trials, 0.05)


def test_calibration_false_positive_rate_small_n():
    """Welch's t stays valid at the smallest n it can judge (2 and 3 per arm)."""
    rng = random.Random(7)
    for n in (2, 3):
        trials = 3000
        fp = sum(judge.judge(_runs("A", _draw(rng, n)) + _runs("B", _draw(rng, n))).levels[0].verdict
                 in ("better", "worse") for _ in range(trials))
        assert fp / trials <= 0.05 + _slack(trials, 0.05), (n, fp / trials)


def test_calibration_power_plus_5_percent():
    rng = random.Random(42)
    n = judge.recommended_repeats(SD)
    trials = 2000
    hits = sum(judge.judge(_runs("A", _draw(rng, n)) + _runs("B", _draw(rng, n, 1.05))).levels[0].verdict
               == "better" for _ in range(trials))
    print(f"power for +5% at n={n}: {hits / trials:.2%}")
    assert hits / trials >= 0.80 - _slack(trials, 0.8)


def test_clear_gain_is_better_with_ci_and_p():
    rng = random.Random(1)
    level = judge.judge(_runs("A", _draw(rng, 6)) + _runs("B", _draw(rng, 6, 1.128))).levels[0]
    assert level.verdict == "better"
    assert level.ci_low < 0.128 < level.ci_high or abs(level.effect - 0.128) < 0.05
    assert level.p_value < 0.001 and level.repeats_needed is None


def test_regression_is_worse():
    rng = random.Random(2)
    level = judge.judge(_runs("A", _draw(rng, 6)) + _runs("B", _draw(rng, 6, 0.85))).levels[0]
    assert level.verdict == "worse" and level.effect < 0


def test_one_run_each_is_inconclusive_with_repeats_needed():
    level = judge.judge(_runs("A", [1000.0]) + _runs("B", [1200.0])).levels[0]
    assert level.verdict == "inconclusive"
    assert level.p_value is None and level.ci_low is None
    assert level.repeats_needed == judge.recommended_repeats(judge.DEFAULT_NOISE)
    assert abs(level.effect - 0.2) < 1e-9


def test_noisy_small_sample_is_inconclusive_and_says_how_many():
    level = judge.judge(_runs("A", [1000.0, 1100.0]) + _runs("B", [1020.0, 1130.0])).levels[0]
    assert level.verdict == "inconclusive"
    assert level.repeats_needed > 2


def test_tight_equal_arms_are_no_detectable_change():
    a = [1000.0, 1003.0, 998.0, 1001.0]
    b = [1002.0, 999.0, 1000.5, 1001.5]
    level = judge.judge(_runs("A", a) + _runs("B", b)).levels[0]
    assert level.verdict == "no detectable change"
    assert -judge.MDE < level.ci_low <= level.ci_high < judge.MDE


def test_outlier_rule_drops_errored_runs_and_far_outliers():
    a = [1000.0, 1002.0, 998.0, 1001.0, 999.0, 600.0]     # 600: > 5 MAD and > 10% below
    b = [1100.0, 1102.0, 1098.0, 1101.0, 1099.0, 1100.0]
    level = judge.judge(_runs("A", a) + _runs("B", b, errors=[0, 0, 0, 0, 0, 3])).levels[0]
    reasons = sorted((d.arm, d.reason) for d in level.outliers_dropped)
    assert reasons[0][0] == "A" and "MAD" in reasons[0][1]
    assert reasons[1] == ("B", "errors")
    assert level.n_a == 5 and level.n_b == 5
    assert level.errored_runs == {"A": 0, "B": 1}
    assert level.verdict == "better"


def test_outlier_rule_needs_five_runs():
    level = judge.judge(_runs("A", [1000.0, 1001.0, 999.0, 600.0]) + _runs("B", [1000.0] * 4)).levels[0]
    assert level.outliers_dropped == [] and level.n_a == 4


def test_anomaly_flags_fall_at_higher_concurrency_per_arm():
    rng = random.Random(3)
    runs = (_runs("A", _draw(rng, 5, 1.00), 64) + _runs("A", _draw(rng, 5, 1.12), 80)
            + _runs("A", _draw(rng, 5, 1.04), 96)
            + _runs("B", _draw(rng, 5, 1.13), 64) + _runs("B", _draw(rng, 5, 1.20), 80)
            + _runs("B", _draw(rng, 5, 1.21), 96))
    found = judge.anomalies(runs)
    assert [(a.arm, a.from_concurrency, a.to_concurrency) for a in found] == [("A", 80, 96)]
    assert found[0].change < 0 and found[0].confidence > 0.95


def test_anomaly_single_runs_are_unconfirmed():
    runs = _runs("A", [1000.0], 80) + _runs("A", [900.0], 96)
    (an,) = judge.anomalies(runs)
    assert an.confidence is None and an.p_value is None


@pytest.mark.parametrize("n", [2, 5, 10])
def test_ci_contains_true_ratio_about_95_percent(n):
    rng = random.Random(n)
    trials, covered = 1000, 0
    for _ in range(trials):
        c = judge.compare(_draw(rng, n), _draw(rng, n, 1.1))
        covered += c.ci_low < 0.1 < c.ci_high
    assert covered / trials >= 0.95 - _slack(trials, 0.95)


def test_unit_noise_keeps_the_error_rate_when_every_b_run_shares_one_offset():
    """A canary's restart: every window of arm B carries one offset drawn per trial (sd 2%). Treated
    as independent windows the A/A error rate explodes as windows grow; with the offset's variance
    in the standard error (unit_noise) it stays at alpha, and power can never exceed what the one
    draw allows."""
    rng = random.Random(20261201)
    trials, n, unit = 2000, 12, 0.02
    naive = held = 0
    for _ in range(trials):
        offset = math.exp(rng.gauss(0.0, unit))
        runs = _runs("A", _draw(rng, n)) + _runs("B", [v * offset for v in _draw(rng, n)])
        naive += judge.judge(runs).levels[0].verdict in ("better", "worse")
        held += judge.judge(runs, unit_noise=unit).levels[0].verdict in ("better", "worse")
    assert naive / trials > 0.15, naive / trials
    assert held / trials <= 0.05 + _slack(trials, 0.05), held / trials
    assert judge.power(10_000, SD, 0.05, 0.04, unit_noise=0.05) < 0.5        # more runs cannot make up for it
    assert judge.recommended_repeats(SD) < judge._recommended(SD, 0.05, 0.05, 0.8, 0.01) < judge.MAX_REPEATS
    c = judge.compare([1.0, 1.1, 0.9], [1.0, 1.1, 0.9], unit_noise=0.02)
    assert c.unit_noise == 0.02 and c.se == pytest.approx(math.sqrt(judge.compare([1.0, 1.1, 0.9], [1.0, 1.1, 0.9]).se ** 2 + 0.0004))


def test_an_interval_past_a_floats_range_is_unbounded_not_an_overflow():
    """bench_sweep found it: a sweep's simultaneous interval after 2 blocks takes a tiny share of
    alpha at 1 degree of freedom, t in the millions, and exp() overflowed (OverflowError ended the
    sweep). That side of the interval has no bound: +inf in memory, null in the evidence."""
    cmp = judge.Comparison(n_a=2, n_b=2, effect=0.105, ci_low=None, ci_high=None, p_value=0.2, df=1.0,
                           sd_log=0.3, d=0.1, se=0.3)
    low, high = cmp.interval(1e-9)
    assert high == math.inf and -1.0 <= low < 0, (low, high)
    assert cmp.interval(0.025)[1] < 100        # an ordinary 95% interval is untouched
