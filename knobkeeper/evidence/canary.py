"""`canary`: the candidate value on some of a role's hosts, live traffic spread by the router, those
hosts compared with the rest over the same windows (same traffic, same minutes: drift cancels),
rolled back by itself when worse, promoted with the evidence attached when better.

Windows and what is compared
----------------------------
The run is cut into windows of `interval` s. Per window and per worker host, the engine's own metrics
(knobkeeper.evidence.metrics): generated tokens/s, mean running requests, aborted requests, TTFT and
TPOT percentiles. Each (host, window) is one "run" of its arm in the evidence: arm A the baseline
hosts, arm B the canary hosts, judged with the evidence judgement (Welch on logs, family-wise).

Normalisation by running requests: a round-robin router gives every host the same NUMBER of
requests, so in a closed loop a faster host does not serve more tokens/s, it holds fewer requests in
flight (Little's law: in-flight = arrival rate x latency). Raw tokens/s per host would hide the
effect. So the metric judged is tokens/s at the window's mean load:

    output_tokens_per_s(h, k) = tokens_per_s(h, k) x mean_h'(running(h', k)) / running(h, k)

i.e. per-request token rate (1 / per-token latency) scaled back to tokens/s. With an even spread it
is the raw tokens/s; it cancels nothing real (A/A: both arms symmetric), and a knob that speeds a
host up also shrinks its batch, which speeds it a little more: the sign of the effect is kept, its
size is that of the host at its own (smaller) load. The raw tokens/s is kept in every run.

Validity: a window is invalid (listed with its reasons, not judged) when a host served no tokens or
held no running requests (no traffic), or when the running requests of the most and least loaded
host differ by more than `imbalance` x (default 2: the router is not spreading the load, e.g. a
worker it considers unhealthy). No valid window at all: the canary is put back and the command fails.

Known limit — host noise: each (host, window) is a sample, so a persistent difference between hosts
that has nothing to do with the knob (a slower GPU; on the sim the per-process run factor, sd 2%) is
read as an effect once there are enough windows. With one canary and one baseline host the A/A
false-alarm rate is therefore high (bench/bench_canary.py: A/A judged "worse" in 4 of 5 runs at
16 s; never "better"). Remedies not built yet: several hosts per arm with the host as the unit, or an
A/A calibration of the host pair before the canary (the host offset divided out).

Guards: TTFT and TPOT percentiles (lower is better) in the judgement's family, and errors: any
aborted requests on the canary hosts beyond the baseline hosts' fail the canary outright.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from statistics import median
from typing import Any, Callable

from knobkeeper.errors import UserError
from knobkeeper.evidence.metrics import Target, WindowStats, queries

METRIC = "output_tokens_per_s"
IMBALANCE = 2.0
# The first window starts at least this long after the canary's deploy: the restarted engine warms up
# and the router re-spreads the load (health checks every few seconds).
SETTLE_MIN_S = 10.0
GUARD_METRICS = {"ttft_p99_ms": ("ttft_ms", "p99"), "tpot_p99_ms": ("tpot_ms", "p99")}

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

def window_runs(plan: Plan, stats: dict[str, list[WindowStats]], imbalance: float = IMBALANCE
                ) -> tuple[list[dict], list[dict]]:
    """(runs, windows): one run per valid (host, window), and every window with its validity."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    count = min((len(v) for v in stats.values()), default=0)
    windows, pending = [], []
    for k in range(count):
        row = {key: stats[key][k] for key in arm_of}
        reasons = []
        for key, s in row.items():
            if not s.output_tokens_per_s or not s.running:
                reasons.append(f"no traffic on {key}")
        loads = [s.running for s in row.values() if s.running]
        if not reasons and max(loads) > imbalance * min(loads):
            reasons.append(f"running requests {min(loads):.1f}..{max(loads):.1f}: spread beyond {imbalance:g}x")
        first = next(iter(row.values()))
        windows.append({"index": k, "start": first.start, "end": first.end, "valid": not reasons,
                        "reasons": reasons, "hosts": {key: s.as_dict() for key, s in row.items()}})
        if not reasons:
            mean_load = sum(loads) / len(loads)
            for key, s in row.items():
                pending.append((key, k, s, s.output_tokens_per_s * mean_load / s.running))
    level = max(1, round(median([s.running for _, _, s, _ in pending]))) if pending else 1
    runs, repeat = [], {"A": 0, "B": 0}
    for key, k, s, normalised in pending:
        arm = arm_of[key]
        repeat[arm] += 1
        runs.append({"arm": arm, "repeat": repeat[arm], "concurrency": level, METRIC: normalised,
                     "raw_output_tokens_per_s": s.output_tokens_per_s, "running": s.running,
                     "errors": s.errors, "ttft_ms": s.ttft_ms, "tpot_ms": s.tpot_ms, "host": key, "window": k})
    return runs, windows


def _unjudged_runs(plan: Plan, windows: list[dict]) -> list[dict]:
    """Runs of a canary that failed on errors with no valid window: every (host, window) that served
    tokens, raw tokens/s, so the evidence of the rollback still holds what was seen."""
    arm_of = {t.key: "B" for t in plan.canary} | {t.key: "A" for t in plan.baseline}
    runs, repeat = [], {"A": 0, "B": 0}
    for w in windows:
        for key, s in w["hosts"].items():
            if s["output_tokens_per_s"]:
                repeat[arm_of[key]] += 1
                runs.append({"arm": arm_of[key], "repeat": repeat[arm_of[key]], "concurrency": 1,
                             METRIC: s["output_tokens_per_s"], "raw_output_tokens_per_s": s["output_tokens_per_s"],
                             "running": s["running"], "errors": s["errors"], "ttft_ms": s["ttft_ms"],
                             "tpot_ms": s["tpot_ms"], "host": key, "window": w["index"], "valid_window": False})
    return runs


# ---------------------------------------------------------------- the judgement (one place)

def judgement(runs: list[dict]) -> dict:
    """The evidence judgement of the windows: THE one call into knobkeeper.evidence.judge.

    The family-wise judge (schema 2) judges the guards itself; with a judge that has none, the
    guards are compared here, Bonferroni-split with throughput over the family.
    """
    from knobkeeper.evidence import judge as J

    result = J.judge(runs, METRIC)
    if "guards" in result:
        return result
    present = [g for g, (field, key) in GUARD_METRICS.items()
               if sum(1 for r in runs if (r.get(field) or {}).get(key)) >= 4]
    alpha = J.ALPHA / (1 + len(present))
    rows = []
    for guard in present:
        field, key = GUARD_METRICS[guard]
        a = [r[field][key] for r in runs if r["arm"] == "A" and not r["errors"] and (r.get(field) or {}).get(key)]
        b = [r[field][key] for r in runs if r["arm"] == "B" and not r["errors"] and (r.get(field) or {}).get(key)]
        c = J.compare(a, b, alpha)
        regression = c.p_value is not None and c.p_value < alpha and c.effect > 0
        rows.append({"concurrency": runs[0]["concurrency"], "metric": guard, "effect": c.effect,
                     "ci_low": c.ci_low, "ci_high": c.ci_high, "p_value": c.p_value,
                     "p_adjusted": None if c.p_value is None else min(1.0, c.p_value * (1 + len(present))),
                     "verdict": "worse" if regression else "inconclusive", "regression": regression})
    return {**result, "guards": rows}


def decide(plan: Plan, windows: list[dict], judged: dict | None) -> tuple[str, list[str]]:
    """(verdict, failed guards): the level's verdict, "worse" when any guard failed.

    Errors count over EVERY window, valid or not: a canary whose requests fail serves few tokens,
    which can make its windows invalid ("no traffic"), and the failures are the finding.
    """
    failed = [f"{g['metric']} {g['effect'] * 100:+.1f}%" for g in (judged or {}).get("guards") or []
              if g.get("regression")]
    per_host = {}
    for arm, targets in (("B", plan.canary), ("A", plan.baseline)):
        total = sum(w["hosts"][t.key]["errors"] for w in windows for t in targets if t.key in w["hosts"])
        per_host[arm] = total / max(1, len(targets))
    if per_host["B"] > per_host["A"]:
        failed.append(f"errors {per_host['B']:g} per canary host vs {per_host['A']:g} per baseline host")
    levels = (judged or {}).get("levels") or []
    verdict = levels[0]["verdict"] if levels else "inconclusive"
    return ("worse" if failed else verdict), failed


# ---------------------------------------------------------------- orchestration

def run_canary(plan: Plan, source, apply: Apply, restore: Callable[[], None], *, duration: float,
               interval: float, settle: float | None = None, imbalance: float = IMBALANCE,
               setup: dict | None = None, on_window: Callable[[int, int], None] | None = None) -> dict:
    """Deploy the candidate to the canary hosts, collect the windows, judge; returns the doc (unwritten).

    `apply(canary_targets, {knob: value})` puts the candidate on the canary hosts (gated);
    `restore()` puts them back to the declared state. restore() runs on every failure, Ctrl-C or
    SIGTERM, and after a "worse" verdict (then CanaryWorse carries the doc). On any other verdict the
    canary stays in place: the caller promotes it or calls restore().
    `settle`: seconds after the deploy before the first window (default: one interval, at least
    SETTLE_MIN_S: the restarted engine warms up and the router re-spreads the load).
    """
    from knobkeeper.evidence.store import build_doc

    if interval <= 0 or duration < 2 * interval:
        raise UserError(f"--duration {duration:g} / --interval {interval:g}: expected at least 2 windows "
                        f"(duration >= 2 x interval > 0)")
    source.check()  # unreachable Prometheus, a worker without series: refused before anything deploys
    n_windows = int(duration // interval)
    started = time.time()
    rolled_back = False
    from knobkeeper.deploy.api import terminate_as_interrupt

    with terminate_as_interrupt():  # SIGTERM as Ctrl-C: the same `except` puts the hosts back
        try:
            apply(plan.canary, {plan.knob: plan.value})
            deployed = time.time()
            source.start()
            time.sleep(max(interval, SETTLE_MIN_S) if settle is None else settle)
            edges = [time.time()]
            for k in range(n_windows):
                time.sleep(max(0.0, edges[0] + (k + 1) * interval - time.time()))
                edges.append(time.time())
                if on_window:
                    on_window(k + 1, n_windows)
            source.stop()
            stats = source.windows(edges)
            runs, windows = window_runs(plan, stats, imbalance)
            verdict, failed = decide(plan, windows, judgement(runs) if runs else None)
            if not runs and verdict == "worse":
                runs = _unjudged_runs(plan, windows)
            if not runs:
                reasons = sorted({r for w in windows for r in w["reasons"]})
                raise UserError(f"canary: no valid window ({'; '.join(reasons[:3]) or 'no data'}); the canary "
                                f"hosts were put back")
        except BaseException:
            rolled_back = True
            restore()
            raise
        if verdict == "worse":
            restore()
            rolled_back = True
    verdict_s = time.time() - started
    arms = {"A": {"label": "baseline hosts", "knobs": {plan.knob: plan.baseline_value}},
            "B": {"label": "canary hosts", "knobs": {plan.knob: plan.value}}}
    invalid = [w for w in windows if not w["valid"]]
    canary_block = {
        "hosts": {"canary": [t.key for t in plan.canary], "baseline": [t.key for t in plan.baseline]},
        "source": {"kind": source.name, "url": getattr(source, "url", None)},
        "queries": queries(interval) if source.name == "prometheus" else {
            "output_tokens_per_s": "increase of sglang:generation_tokens_total between the samples at the "
                                   "window edges / their time apart",
            "running": "mean of sglang:num_running_reqs samples in the window",
            "errors": "increase of sglang:num_aborted_requests_total",
            "ttft_ms/tpot_ms": "histogram_quantile on the bucket increases (Prometheus's interpolation)"},
        "interval_s": interval, "duration_s": duration, "imbalance_threshold": imbalance,
        "normalisation": "tokens/s x window mean running / host running (see knobkeeper.evidence.canary)",
        "windows": windows, "verdict": verdict, "failed_guards": failed,
        "rolled_back": rolled_back, "deployed_at": deployed, "seconds_to_verdict": round(verdict_s, 3),
    }
    validity = {"levels": [{"concurrency": runs[0]["concurrency"], "valid": True, "reasons": []}],
                "reasons": [f"window {w['index']}: {'; '.join(w['reasons'])}" for w in invalid]}
    import inspect

    # Schema 2's build_doc computes `validity` itself and takes file-level reasons as `notes`;
    # schema 1's has no validity: the windows' reasons go where the store in use keeps them.
    if "notes" in inspect.signature(build_doc).parameters:
        placed = {"extra": {"canary": canary_block}, "notes": validity["reasons"]}
    else:
        placed = {"extra": {"canary": canary_block, "validity": validity}}
    doc = build_doc(knob=plan.knob, role=plan.role, arms=arms, runs=runs,
                    setup={**(setup or {}), "workload": {"api": None, "duration_s": duration}},
                    source={"tool": "knobkeeper canary", "format": "canary"}, **placed)
    if verdict == "worse":
        raise CanaryWorse(doc, f"canary worse: {', '.join(failed) or 'throughput'}; canary hosts rolled back")
    return doc


def longer_canary(doc: dict) -> str | None:
    """"a canary of ~N s would decide" from the judgement's repeats_needed (runs per arm = windows
    x hosts of that arm), or None when the verdict is settled."""
    levels = doc["judgement"]["levels"]
    needed = levels[0].get("repeats_needed") if levels else None
    if not needed:
        return None
    c = doc["canary"]
    per_window = min(len(c["hosts"]["canary"]), len(c["hosts"]["baseline"]))
    seconds = needed / per_window * c["interval_s"]
    return f"a canary of about {seconds:.0f} s ({needed} windows per arm) would detect ±5%"


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
                         imbalance=imbalance, setup=setup, on_window=on_window)
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
                   scrape_interval: float = 1.0, on_window: Callable[[int, int], None] | None = None) -> Outcome:
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
    declared = value_of(read_declared(project.knobs_path), role, knob) if project.knobs_path.exists() else None
    plan = Plan(knob, value, declared, role, canary_t, baseline_t)
    apply, restore, promote_rest = deploy_switch(project, inventory, plan)
    source = (PrometheusSource(prometheus, plan.targets, scrape_interval) if prometheus
              else ScrapeSource(plan.targets, scrape_interval))
    setup = {"inventory": inventory, "git_sha": git_sha(project),
             "engine": ", ".join(sorted({s.engine for s in stack.services if s.role == role}))}
    return canary(project, plan, source, apply, restore, duration=duration, interval=interval, promote=promote,
                  promote_rest=promote_rest, reason=reason, setup=setup, on_window=on_window)


def report_lines(out: Outcome) -> list[str]:
    """What `knobkeeper canary` prints: verdict, effect, windows, what was done, the evidence."""
    from knobkeeper.evidence.store import summary_line

    c = out.doc["canary"]
    valid = sum(1 for w in c["windows"] if w["valid"])
    lines = [f"canary {out.doc['knob']}={_raw(out.doc['arms']['B']['knobs'][out.doc['knob']])} on "
             f"{', '.join(c['hosts']['canary'])} vs {', '.join(c['hosts']['baseline'])}: {out.verdict}",
             f"  {summary_line(out.doc)}",
             f"  windows: {valid} valid of {len(c['windows'])} ({c['interval_s']:g} s each, source {c['source']['kind']})"]
    if c["failed_guards"]:
        lines.append(f"  failed guards: {', '.join(c['failed_guards'])}")
    lines.append(f"  {out.action}; evidence {out.doc['id']} ({out.evidence_path})")
    if out.entry:
        lines.append(f"  entry {out.entry}: set {out.doc['knob']} on {out.doc['role']} with --evidence {out.doc['id']}")
    hint = longer_canary(out.doc)
    if hint and out.verdict == "inconclusive":
        lines.append(f"  {hint}")
    return lines
