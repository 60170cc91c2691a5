"""Canary benchmark on the sim: the A/A false-positive rate and the power for +5% and +12.8% against
duration, and the time from `canary` to its verdict.

Stack: one prefill, two decode workers, the real router (round robin) in PD mode, closed-loop load
through it. Each run restarts the canary worker with a fresh random seed (a new per-process run
factor: the restart noise a real canary faces) and the candidate's environment, and puts it back the
same way after the verdict. Each run collects --windows calibration windows, deploys, settles and
collects --windows canary windows with knobkeeper's own scrape; the verdict is recomputed for 2, 4, ...
windows of each phase (nested prefixes: the shape against duration at a fraction of the cost), in
the calibrated design (the default) and the uncalibrated one (--calibrate 0, host by host).

Effects come from an effects table given to both workers: KNOBKEEPER_SPLITKV_TARGET_CTAS=105 makes
decode steps 5% faster, =1128 12.8% faster; unset (the baseline, and the A/A arm) no effect.

    .venv/bin/python bench/bench_canary.py [--runs 6] [--windows 8] [--interval 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from knobkeeper.evidence import canary  # noqa: E402
from knobkeeper.evidence import canary_design  # noqa: E402
from knobkeeper.evidence import metrics  # noqa: E402
from tests.procs import free_port, start, stop, wait_http  # noqa: E402
from tests.test_canary import PY, Load, Worker  # noqa: E402

KNOB = "KNOBKEEPER_SPLITKV_TARGET_CTAS"
EFFECTS = f"""
[knobs.{KNOB}]
doc = "bench only: a knob with a chosen effect"
source = "bench/bench_canary.py"
[knobs.{KNOB}.values."105"]
decode_step = {1 / 1.05:.6f}
[knobs.{KNOB}.values."1128"]
decode_step = {1 / 1.128:.6f}
"""
CASES = (("A/A", None), ("+5%", 105), ("+12.8%", 1128))


def stats_of(doc, phase: str, upto: int, last: bool = False) -> dict[str, list[metrics.WindowStats]]:
    """The first (or last) `upto` windows of one phase of a canary's evidence, as WindowStats."""
    rows = [w for w in doc.canary.windows if w.phase == phase]
    out: dict[str, list[metrics.WindowStats]] = {}
    for w in (rows[-upto:] if last else rows[:upto]):
        for key, s in w.hosts.items():
            out.setdefault(key, []).append(s)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=26)
    ap.add_argument("--settle", type=float, default=None, help="seconds after the restart before the first window")
    ap.add_argument("--cases", default=",".join(name for name, _ in CASES), help="which of A/A,+5%%,+12.8%%")
    args = ap.parse_args()
    cases = [c for c in CASES if c[0] in args.cases.split(",")]
    tmp = Path(__import__("tempfile").mkdtemp(prefix="kkbench-canary-"))
    effects = tmp / "effects.toml"
    effects.write_text(EFFECTS)
    extra = ("--effects", str(effects))
    procs = []
    rng = random.Random(7)
    try:
        pre = Worker(tmp, "prefill", "prefill", 1, bootstrap=free_port())
        procs.append(pre)
        decodes = [Worker(tmp, f"decode{i}", "decode", rng.randrange(1 << 30), args=extra) for i in (1, 2)]
        procs += decodes
        rport = free_port()
        router = start([PY, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(rport),
                        "--pd-disaggregation", "--prefill", pre.url, str(pre.bootstrap),
                        *[x for d in decodes for x in ("--decode", d.url)], "--policy", "round_robin",
                        "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                        "--disable-circuit-breaker", "--health-check-interval-secs", "1", "--log-level", "warn"],
                       tmp / "router.log", cwd=str(ROOT))
        wait_http(f"http://127.0.0.1:{rport}/readiness", timeout=90, proc=router)
        endpoint = f"http://127.0.0.1:{rport}"
        span = 2 * args.windows * args.interval + max(args.interval, canary.SETTLE_MIN_S if args.settle is None else args.settle)
        total = len(cases) * args.runs * (span + 8)
        print(f"canary bench: {args.runs} runs x {len(cases)} cases, {args.windows} calibration + {args.windows} canary "
              f"windows of {args.interval:g} s, concurrency {args.concurrency} through the router "
              f"(about {total / 60:.0f} min)", flush=True)
        load = Load(endpoint, total * 1.5 + 60, concurrency=args.concurrency)
        time.sleep(3)
        candidate = decodes[1]
        plan_targets = [d.target for d in decodes]
        prefixes = [n for n in (2, 4, 8, 16, 32) if n <= args.windows]
        designs = ("calibrated", "uncalibrated")
        verdicts = {(d, name): {n: [] for n in prefixes} for d in designs for name, _ in cases}
        to_verdict: list[float] = []
        for run in range(args.runs):
            for name, value in cases:
                plan = canary_design.Plan(KNOB, value, None, "decode", canary=[plan_targets[1]], baseline=[plan_targets[0]])

                def restart(env):
                    candidate.seed = rng.randrange(1 << 30)   # each restart draws its own run factor
                    candidate.restart(env)

                began = time.monotonic()
                try:
                    switch = canary.Switch(lambda targets, knobs: restart({} if value is None else {KNOB: str(value)}),
                                           lambda: restart({}))
                    doc = canary.measure(plan, metrics.ScrapeSource(plan.targets, 0.5), switch,
                                         canary.Options(duration=args.windows * args.interval, interval=args.interval,
                                                        settle=args.settle))
                    restart({})
                except canary.CanaryWorse as worse:   # measure has put the canary back itself
                    doc = worse.doc
                to_verdict.append(time.monotonic() - began)
                for n in prefixes:
                    # the n calibration windows next to the deploy, the first n canary windows
                    before, after = stats_of(doc, "calibration", n, last=True), stats_of(doc, "canary", n)
                    for design in designs:
                        calibration = before if design == "calibrated" else None
                        runs, windows = canary_design.window_runs(plan, after, calibration=calibration)
                        judged = canary_design.judgement(runs, plan.unit_noise(canary.RESTART_NOISE, calibration is not None)) if runs else None
                        verdicts[(design, name)][n].append(canary_design.decide(plan, windows, judged)[0] if runs else "invalid")
            print(f"  run {run + 1}/{args.runs} done", flush=True)
        # the load thread is a daemon: it ends with the workers stopped below, no need to wait it out
    finally:
        for p in reversed(procs):
            p.stop()
        if "router" in locals():
            stop(router)
    for design in designs:
        print()
        print(f"{design} design: verdicts 'better' and 'worse' per case, against the canary's duration "
              f"(calibrated: after as long a calibration)")
        print(f"{'duration':>9} " + " ".join(f"{name + ' better':>15} {name + ' worse':>14}" for name, _ in cases))
        for n in prefixes:
            cells = []
            for name, _ in cases:
                got = verdicts[(design, name)][n]
                cells.append(f"{got.count('better'):>8}/{len(got):<6} {got.count('worse'):>7}/{len(got):<6}")
            print(f"{n * args.interval:>8g}s " + " ".join(cells))
    print()
    print("A/A 'better' or 'worse' = false positive; +5%/+12.8% 'better' = power.")
    print(f"time from canary start to verdict: median {statistics.median(to_verdict):.1f} s "
          f"(calibration {args.windows * args.interval:g} s + deploy + settle + duration "
          f"{args.windows * args.interval:g} s + judgement), "
          f"max {max(to_verdict):.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
