"""The A/A rate and the power of `ab run`'s real-engine design, from the judged runs of REAL ab runs
(data/ab_runs.jsonl, written by ab_runs.py on the real PD stack): what each ab run decided, the noise
of one judged 25-s run, the block warm-up against the judged run after it, the cost of a repeat, and
by resampling the real residuals: the A/A false-verdict rate and the power at a 2x (fixed design at
n = 2..10, and the sequential design capped at 10, judged by knobkeeper.evidence.judge itself), the
smallest effect a 10-minute ab run decides.

    .venv/bin/python bench/real_noise/analyse_ab.py [--draws 2000]   (writes results_ab.json)

Resampling: a residual is one judged run's ln(throughput) minus its arm's mean in its ab run (times
sqrt(n/(n-1)), so the pool has the arms' variance); an A/A draw takes n residuals per arm with
replacement, a 2x draw adds ln 0.5 to B's. The residuals include the restart-to-restart noise only
where the block was a restart (the `aa` experiment restarts every block; the A/B ones skip a switch
to the arm already running, as the deploy does): the table says which pool it used.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections import defaultdict
from pathlib import Path
from statistics import mean, median, stdev

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from knobkeeper.evidence import judge  # noqa: E402
from knobkeeper.evidence.model import Look  # noqa: E402
from knobkeeper.evidence.defaults import REAL_MAX_REPEATS  # noqa: E402

DATA = Path(__file__).parent / "data"
TEN_MINUTES = 600.0


def load(name: str = "ab_runs") -> list[dict]:
    path = DATA / f"{name}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def arm_logs(doc: dict) -> dict[str, list[float]]:
    out = defaultdict(list)
    for run in doc["runs"]:
        if not run.get("errors") and run.get("output_tokens_per_s"):
            out[run["arm"]].append(math.log(run["output_tokens_per_s"]))
    return dict(out)


def residuals(doc: dict) -> list[float]:
    out = []
    for logs in arm_logs(doc).values():
        if len(logs) >= 2:
            m, k = mean(logs), math.sqrt(len(logs) / (len(logs) - 1))
            out += [(x - m) * k for x in logs]
    return out


def warmup_offsets(doc: dict) -> list[float]:
    """ln(warm-up window) - ln(the judged run right after it, same block)."""
    judged = {(r["arm"], r["repeat"]): r["output_tokens_per_s"] for r in doc["runs"] if r.get("output_tokens_per_s")}
    out = []
    for w in doc["setup"].get("schedule", {}).get("warmups", []):
        after = judged.get((w["arm"], w["repeat"]))
        if w.get("output_tokens_per_s") and after:
            out.append(math.log(w["output_tokens_per_s"]) - math.log(after))
    return out


def judged(runs: list[dict], sequential: dict | None = None) -> str:
    return judge.judge(runs, sequential=sequential).levels[0].verdict


def fixed_rate(pool: list[float], n: int, effect: float, draws: int, rng: random.Random) -> dict:
    verdicts = defaultdict(int)
    for _ in range(draws):
        runs = [{"arm": arm, "repeat": i + 1, "concurrency": 16, "errors": 0,
                 "output_tokens_per_s": math.exp(7.0 + (effect if arm == "B" else 0.0) + rng.choice(pool))}
                for arm in "AB" for i in range(n)]
        verdicts[judged(runs)] += 1
    return {k: round(v / draws, 3) for k, v in sorted(verdicts.items())}


def sequential_rate(pool: list[float], effect: float, cap: int, draws: int, rng: random.Random) -> dict:
    verdicts, used = defaultdict(int), []
    for _ in range(draws):
        record = judge.sequential_rule(cap)
        runs, verdict, repeats = [], "inconclusive", cap
        for repeat in range(1, cap + 1):
            for arm in "AB":
                runs.append({"arm": arm, "repeat": repeat, "concurrency": 16, "errors": 0,
                             "output_tokens_per_s": math.exp(7.0 + (effect if arm == "B" else 0.0) + rng.choice(pool))})
            if repeat in record.planned_looks:
                record.looks.append(Look(repeat, [16], {}))
                level = judge.judge(runs, sequential=record).levels[0]
                if judge.settled(level) or repeat == cap:
                    verdict, repeats = level.verdict, repeat
                    break
        verdicts[verdict] += 1
        used.append(repeats)
    return {"verdicts": {k: round(v / draws, 3) for k, v in sorted(verdicts.items())},
            "median_repeats_per_arm": median(used), "cap": cap}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=23)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows = load()
    if not rows:
        print("no data/ab_runs.jsonl yet: run ab_runs.py first")
        return 1
    out: dict = {"ab_runs": [], "pools": {}}
    pools = defaultdict(list)
    offsets = []
    for row in rows:
        doc = row["evidence"]
        [level] = doc["judgement"]["levels"]
        restarts = [r for r in row["restarts"] if r["action"] == "restarted"]
        logs = arm_logs(doc)
        blocks = doc["setup"]["schedule"]["blocks"]
        out["ab_runs"].append({
            "experiment": row["experiment"], "baseline": row["baseline"], "candidate": row["candidate"],
            "verdict": level["verdict"], "effect": level["effect"], "p_adjusted": level.get("p_adjusted"),
            "n_a": level["n_a"], "n_b": level["n_b"], "blocks": blocks, "wall_s": row["wall_s"],
            "restarts": len(restarts), "restart_s": [r["total_s"] for r in restarts],
            "tok_s": {arm: [round(math.exp(x)) for x in v] for arm, v in logs.items()},
            "warmup_tok_s": [round(w["output_tokens_per_s"] or 0) for w in doc["setup"]["schedule"].get("warmups", [])],
            "hog": row.get("hog")})
        pools["aa (every block a restart)" if row["baseline"] == row["candidate"] else "ab (as the deploy switches)"] += \
            residuals(doc)
        offsets += warmup_offsets(doc)
    pools["all"] = [x for k, v in pools.items() for x in v]
    for name, pool in pools.items():
        if len(pool) < 4:
            continue
        sd = stdev(pool)
        entry = {"n": len(pool), "sd_log": round(sd, 3)}
        entry["fixed"] = {n: {"aa": fixed_rate(pool, n, 0.0, args.draws, rng),
                              "2x": fixed_rate(pool, n, math.log(0.5), args.draws, rng)} for n in (2, 3, 4, 6, 10)}
        seq_draws = max(200, args.draws // 5)
        entry["sequential"] = {"aa": sequential_rate(pool, 0.0, REAL_MAX_REPEATS, seq_draws, rng),
                               "2x": sequential_rate(pool, math.log(0.5), REAL_MAX_REPEATS, seq_draws, rng)}
        out["pools"][name] = entry
    if offsets:
        out["warmup_vs_judged"] = {"n": len(offsets), "median_ratio": round(math.exp(median(offsets)), 3),
                                   "sd_log": round(stdev(offsets), 3) if len(offsets) > 1 else None}
    # The cost of a repeat as the deploy switches (one restart per repeat after the first) and the
    # smallest effect a 10-minute ab run decides with 80% power (fixed design at the n that fits).
    restart = [s for r in out["ab_runs"] for s in r["restart_s"]]
    block = [r["wall_s"] / r["blocks"] for r in out["ab_runs"] if r["blocks"]]
    if restart and block and "all" in out["pools"]:
        per_restart = median(restart)
        per_block_load = median(block) - per_restart * median(
            r["restarts"] / r["blocks"] for r in out["ab_runs"] if r["blocks"])
        per_repeat = per_restart + 2 * per_block_load
        n = max(2, int(TEN_MINUTES // per_repeat))
        sd = out["pools"]["all"]["sd_log"]
        level_alpha = judge.level_alpha(1, guards=True)
        mde = next((m / 100 for m in range(1, 400) if judge.power(n, sd, m / 100, level_alpha) >= 0.8), None)
        out["ten_minutes"] = {"median_restart_s": round(per_restart, 1), "block_load_s": round(per_block_load, 1),
                              "per_repeat_s": round(per_repeat, 1), "repeats_in_600_s": n, "sd_log": sd,
                              "smallest_effect_80pct_power": mde,
                              "how": "estimated from the real noise (fixed design, one level, throughput + guards' "
                                     "alpha share), not run"}
    (Path(__file__).parent / "results_ab.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
