"""`knobkeeper sweep` on simulated noise where the truth is known: how often it adopts a candidate
that is not better (every arm equal to the control), how often it picks the better arm at effects
of +5%, +12.8% and 2x, the runs it used against the fixed full grid, and side by side the naive rule
of vLLM's auto_tune.sh ("the highest mean of one run per value") on the same noise.

Pure computation over the sweep's own code (knobkeeper.evidence.sweep.run_plan: the search with
its seeded block order, looks, one Holm family, elimination, the pick, the confirming A/B), with a
synthetic harness instead of a stack: a run's ln throughput = ln(its arm's true effect at its level)
+ its restart's offset (log-sd --noise, shared by the levels of one restart: the replicate) + the
run's own (log-sd --run-noise). One candidate is better by the effect at every level, the others
equal the control. Throughput only (no guards in the family), delta and the caps as `sweep` sets
them for that noise (delta = max(5%, one restart sd); cap = the sequential design's for delta).

    .venv/bin/python bench/bench_sweep.py [--trials 1000] [--noise 0.03] [--run-noise 0.01]

Columns: adopt not-better = share of sweeps that adopted an arm that is not the better one (A/A:
any adoption); correct = adopted the better arm (its confirming A/B agreeing); keep = kept the
control; runs = mean runs (search + confirm) relative to the fixed full grid (every arm at every
level for the cap, no confirm); naive = the same share for "highest mean of one run per value".
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
from knobkeeper.evidence import sweep  # noqa: E402
from knobkeeper.evidence.model import ADOPT  # noqa: E402
from knobkeeper.evidence.search import Design, Harness  # noqa: E402

LEVELS = {1: [64], 3: [64, 80, 96]}
EFFECTS = {"A/A": 0.0, "+5%": 0.05, "+12.8%": 0.128, "2x": 1.0}


class Synthetic:
    """The stack of one simulated sweep: arm "X" (the value "X") has `effects[X]`; a switch draws the
    restart's offset."""

    def __init__(self, rng: random.Random, effects: dict[str, float], noise: float, run_noise: float):
        self.rng, self.effects, self.noise, self.run_noise = rng, effects, noise, run_noise
        self.arm, self.offset, self.runs = "A", 0.0, 0

    def switch(self, arm: dict) -> None:
        self.arm, self.offset = arm["knobs"]["K"], self.rng.gauss(0, self.noise)

    def load(self, url, conc, **kw) -> dict:
        self.runs += 1
        value = 1000.0 * (1 + self.effects[self.arm]) * math.exp(self.offset + self.rng.gauss(0, self.run_noise))
        return {"output_tokens_per_s": value, "errors": 0, "completed": 50}

    def harness(self) -> Harness:
        return Harness(self.switch, lambda: None, "http://synthetic", load=self.load,
                       warm_up=lambda url, conc, **kw: {"output_tokens_per_s": 1.0, "errors": 0})


def one_sweep(rng: random.Random, candidates: int, levels: list[int], effect: float, noise: float,
              run_noise: float) -> tuple[str, int, int]:
    """(outcome: "correct" | "wrong" | "keep", runs used, runs of the fixed full grid) of one sweep."""
    names = [chr(ord("B") + i) for i in range(candidates)]
    better = names[rng.randrange(candidates)] if effect else None
    effects = {"A": 0.0, **{n: (effect if n == better else 0.0) for n in names}}
    delta = sweep.default_delta(noise)
    cap = judge.sequential_repeats(noise, delta, levels=len(levels) * candidates)
    confirm_cap = judge.sequential_repeats(noise, delta, levels=len(levels))
    design = Design(levels, max_repeats=cap, requests=50)
    arms = {"A": {"label": "control", "knobs": {"K": "A"}}, **{n: {"label": "candidate", "knobs": {"K": n}}
                                                               for n in names}}
    plan = sweep.make_plan(knob="K", role="decode", scope="decode", inventory=None, arms=arms, design=design,
                           delta=delta, delta_source="bench", noise=noise, noise_source="bench", alpha=judge.ALPHA,
                           minutes=None, seed=rng.randrange(2 ** 31), max_arms=candidates, confirm_repeats=confirm_cap,
                           engine_default=None, estimate={}, guards=False)
    stack = Synthetic(rng, effects, noise, run_noise)
    doc = sweep.run_plan(plan, stack.harness(), design)
    pick = doc.sweep.pick
    outcome = "keep" if pick.outcome != ADOPT else ("correct" if pick.arm == better else "wrong")
    return outcome, stack.runs, (candidates + 1) * cap * len(levels)


def naive(rng: random.Random, candidates: int, levels: list[int], effect: float, noise: float,
          run_noise: float) -> str:
    """auto_tune.sh's rule on the same noise: one run per value (the control among them) at each level,
    the highest mean wins; "correct" when it is the better arm, "keep" when it is the control."""
    better = rng.randrange(candidates) if effect else None
    scores = []
    for arm in range(-1, candidates):
        offset = rng.gauss(0, noise)
        gain = effect if arm == better else 0.0
        scores.append(sum(math.log(1 + gain) + offset + rng.gauss(0, run_noise) for _ in levels) / len(levels))
    best = max(range(len(scores)), key=scores.__getitem__) - 1
    return "keep" if best == -1 else ("correct" if best == better else "wrong")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--run-noise", type=float, default=0.01)
    parser.add_argument("--candidates", type=int, nargs="*", default=[3, 5])
    parser.add_argument("--levels", type=int, nargs="*", default=[1, 3])
    args = parser.parse_args(argv)
    rng = random.Random(20261203)
    t0 = time.perf_counter()
    print(f"restart-to-restart noise {args.noise:.1%}, run noise {args.run_noise:.1%} (log scale); delta "
          f"{sweep.default_delta(args.noise):.1%}; {args.trials} sweeps per cell; one candidate better by the effect "
          f"at every level, the others equal to the control")
    print(f"{'cands':>5} {'levels':>6} {'effect':>7} | {'adopt not-better':>16} {'correct':>8} {'keep':>6} "
          f"{'runs/grid':>9} | {'naive not-better':>16} {'naive correct':>13}")
    for k in args.candidates:
        for n_levels in args.levels:
            levels = LEVELS[n_levels] if n_levels in LEVELS else [64 + 16 * i for i in range(n_levels)]
            for name, effect in EFFECTS.items():
                counts = {"correct": 0, "wrong": 0, "keep": 0}
                naive_counts = {"correct": 0, "wrong": 0, "keep": 0}
                used = []
                for _ in range(args.trials):
                    outcome, runs, grid = one_sweep(rng, k, levels, effect, args.noise, args.run_noise)
                    counts[outcome] += 1
                    used.append(runs / grid)
                    naive_counts[naive(rng, k, levels, effect, args.noise, args.run_noise)] += 1
                T = args.trials
                wrong = counts["wrong"] + (counts["correct"] if effect == 0 else 0)
                naive_wrong = naive_counts["wrong"] + (naive_counts["correct"] if effect == 0 else 0)
                print(f"{k:>5} {n_levels:>6} {name:>7} | {wrong / T:>16.1%} "
                      f"{(counts['correct'] / T if effect else float('nan')):>8.1%} {counts['keep'] / T:>6.1%} "
                      f"{sum(used) / len(used):>9.0%} | {naive_wrong / T:>16.1%} "
                      f"{(naive_counts['correct'] / T if effect else float('nan')):>13.1%}", flush=True)
    print(f"({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
