"""False-positive rate and power of the A/B judgement against the number of repeats, next to the
naive rule "B beat A by more than 3% in one run each".

Synthetic throughputs with multiplicative log-normal run-to-run noise (sd 3% on the log scale,
seeded), in-process. FPR: A/A comparisons judged "better" or "worse" (naive: |B/A - 1| > 3%).
Power: B = A x 1.05, judged "better" (naive: B/A - 1 > 3%). The naive rule cannot use repeats: it
always looks at one run each (shown on every row for comparison).

    .venv/bin/python bench/bench_judgement.py [--trials 4000] [--noise 0.03]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from knobkeeper.evidence import judge as J  # noqa: E402


def _runs(arm, values):
    return [{"arm": arm, "repeat": i, "concurrency": 64, "output_tokens_per_s": v, "errors": 0}
            for i, v in enumerate(values)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--effect", type=float, default=0.05)
    args = parser.parse_args(argv)
    rng = random.Random(20261129)
    sd = args.noise

    def draw(n, scale=1.0):
        return [1000.0 * scale * math.exp(rng.gauss(0, sd)) for _ in range(n)]

    t = time.perf_counter()
    naive_fp = sum(abs(b / a - 1) > 0.03 for a, b in ((draw(1)[0], draw(1)[0]) for _ in range(args.trials)))
    naive_pow = sum(b / a - 1 > 0.03 for a, b in ((draw(1)[0], draw(1, 1 + args.effect)[0]) for _ in range(args.trials)))
    rec = J.recommended_repeats(sd, args.effect)
    print(f"noise sd {sd:.1%} (log scale), effect +{args.effect:.0%}, {args.trials} trials per cell; "
          f"recommended repeats: {rec}")
    print(f"{'repeats':>7} | {'judge FPR':>9} {'judge power':>11} {'inconclusive(+5%)':>17} | "
          f"{'naive FPR':>9} {'naive power':>11}")
    for n in (2, 3, 4, 5, 6, 8, 10, 12):
        fp = sum(J.judge(_runs("A", draw(n)) + _runs("B", draw(n)))["levels"][0]["verdict"] in ("better", "worse")
                 for _ in range(args.trials))
        verdicts = [J.judge(_runs("A", draw(n)) + _runs("B", draw(n, 1 + args.effect)))["levels"][0]["verdict"]
                    for _ in range(args.trials)]
        hits = verdicts.count("better")
        inc = verdicts.count("inconclusive")
        mark = " <- recommended" if n == rec else ""
        print(f"{n:>7} | {fp / args.trials:>9.1%} {hits / args.trials:>11.1%} {inc / args.trials:>17.1%} | "
              f"{naive_fp / args.trials:>9.1%} {naive_pow / args.trials:>11.1%}{mark}")
    print(f"({time.perf_counter() - t:.1f}s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
