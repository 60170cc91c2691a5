"""The A/B judgement's error rates, per evidence file: family-wise false-positive rate and per-level
power of the fixed and the sequential design at 1, 3 and 5 levels, the repeats the sequential
design used, next to the naive rule "B beat A by more than 3% in one run each"; and what a 10%
linear drift does to an interleaved (ABBA) and a non-interleaved (all A, then all B) order.

Synthetic throughputs with multiplicative log-normal run-to-run noise (sd 3% on the log scale,
seeded), in-process, throughput only (with the TTFT/TPOT guards in the family, throughput keeps
80% of alpha: see knobkeeper/evidence/judge.py). The sequential design is driven by the same
`Stopping` bookkeeping `ab run` uses.
- FWER: share of A/A files with "better" or "worse" at any level (naive: |B/A - 1| > 3% anywhere).
- power: share of levels judged "better" when B = A x 1.05 at every level (naive: B/A - 1 > 3%).
- runs: mean repeats per arm and level the design used, relative to the fixed design's n.

    .venv/bin/python bench/bench_judgement.py [--trials 1000] [--noise 0.03]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from knobkeeper.evidence import judge  # noqa: E402
from knobkeeper.evidence.ab import Stopping, schedule  # noqa: E402

LEVELS = {1: [64], 3: [64, 80, 96], 5: [32, 48, 64, 80, 96]}
ACT = ("better", "worse")


def _run(arm, repeat, conc, value):
    return {"arm": arm, "repeat": repeat, "concurrency": conc, "output_tokens_per_s": value, "errors": 0}


def fixed(rng, levels, n, effect, sd, drift=0.0, interleaved=True):
    """The judgement of one fixed-design file (drift: a linear change over the run's blocks)."""
    order = schedule(n) if interleaved else [(r, "A") for r in range(1, n + 1)] + [(r, "B") for r in range(1, n + 1)]
    runs = []
    for k, (repeat, arm) in enumerate(order):
        scale = (1 + effect if arm == "B" else 1.0) * (1 + drift * k / max(1, len(order) - 1))
        runs += [_run(arm, repeat, c, 1000.0 * scale * math.exp(rng.gauss(0, sd))) for c in levels]
    return judge.judge(runs).levels


def sequential(rng, levels, cap, effect, sd):
    """(levels of the final judgement, repeats per arm used per level) of one sequential file."""
    stopping = Stopping(levels, cap)
    runs = []
    for index, (repeat, arm) in enumerate(schedule(cap)):
        if not stopping.open:
            break
        scale = 1 + effect if arm == "B" else 1.0
        runs += [_run(arm, repeat, c, 1000.0 * scale * math.exp(rng.gauss(0, sd))) for c in stopping.open]
        if index % 2 == 1:
            stopping.after_repeat(repeat, runs)
    judged = judge.judge(runs, sequential=stopping.record).levels
    return judged, [lv.n_a for lv in judged]


def naive(rng, levels, effect, sd):
    ratios = [math.exp(rng.gauss(0, sd) - rng.gauss(0, sd)) * (1 + effect) - 1 for _ in levels]
    return ratios


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--effect", type=float, default=0.05)
    parser.add_argument("--big", type=float, default=0.128)
    args = parser.parse_args(argv)
    rng = random.Random(20261201)
    sd, T = args.noise, args.trials
    t0 = time.perf_counter()
    print(f"noise sd {sd:.1%} (log scale), {T} files per cell; FWER = any level better/worse in an A/A file; "
          f"power = levels judged better at +{args.effect:.0%}")
    print(f"{'levels':>6} | {'fixed n':>7} {'FWER':>6} {'power':>6} | {'seq cap':>7} {'FWER':>6} {'power':>6} "
          f"{'runs +5%':>8} {'runs +12.8%':>11} {'runs A/A':>8} {'A/A stop<cap':>12} {'(levels)':>8} | {'naive FWER':>10} "
          f"{'naive power':>11}")
    for count, levels in LEVELS.items():
        n = judge.recommended_repeats(sd, args.effect, levels=count)
        cap = judge.sequential_repeats(sd, args.effect, levels=count)
        fw = sum(any(lv.verdict in ACT for lv in fixed(rng, levels, n, 0.0, sd)) for _ in range(T)) / T
        pw = sum(sum(lv.verdict == "better" for lv in fixed(rng, levels, n, args.effect, sd))
                 for _ in range(T)) / (T * count)
        seq_fw, seq_aa_runs, stopped_early, levels_early = 0, 0.0, 0, 0
        for _ in range(T):
            judged, used = sequential(rng, levels, cap, 0.0, sd)
            seq_fw += any(lv.verdict in ACT for lv in judged)
            seq_aa_runs += sum(used) / count
            stopped_early += max(used) < cap
            levels_early += sum(u < cap for u in used)
        seq_pw, seq_runs = 0, 0.0
        for _ in range(T):
            judged, used = sequential(rng, levels, cap, args.effect, sd)
            seq_pw += sum(lv.verdict == "better" for lv in judged)
            seq_runs += sum(used) / count
        big_runs = 0.0
        for _ in range(T):
            _, used = sequential(rng, levels, cap, args.big, sd)
            big_runs += sum(used) / count
        nv_fw = sum(any(abs(r) > 0.03 for r in naive(rng, levels, 0.0, sd)) for _ in range(T)) / T
        nv_pw = sum(sum(r > 0.03 for r in naive(rng, levels, args.effect, sd)) for _ in range(T)) / (T * count)
        print(f"{count:>6} | {n:>7} {fw:>6.1%} {pw:>6.1%} | {cap:>7} {seq_fw / T:>6.1%} {seq_pw / (T * count):>6.1%} "
              f"{seq_runs / T / n:>8.0%} {big_runs / T / n:>11.0%} {seq_aa_runs / T / n:>8.0%} "
              f"{stopped_early / T:>12.1%} {levels_early / (T * count):>8.1%} | {nv_fw:>10.1%} {nv_pw:>11.1%}")
    print("runs: mean repeats per arm and level relative to the fixed design's n (the naive rule uses 1 run); "
          "A/A stop<cap: files whose every level stopped before the cap (levels: share of levels).")
    print()
    print("drift: +10% linear over the run's blocks, A/A, 3 levels, fixed n; file-wise FWER")
    levels = LEVELS[3]
    n = judge.recommended_repeats(sd, args.effect, levels=3)
    for name, inter in (("interleaved ABBA", True), ("non-interleaved A..A B..B", False)):
        judged = [fixed(rng, levels, n, 0.0, sd, drift=0.10, interleaved=inter) for _ in range(T)]
        fw = sum(any(lv.verdict in ACT for lv in js) for js in judged) / T
        better = sum(all(lv.verdict == "better" for lv in js) for js in judged) / T
        mean_effect = sum(lv.effect for js in judged for lv in js) / (T * len(levels))
        print(f"  {name:<26} FWER {fw:6.1%}   every level 'better' {better:6.1%}   mean effect {mean_effect:+.1%}")
    print(f"({time.perf_counter() - t0:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
