"""`canary`: the candidate value on some of a role's hosts, live traffic spread by the router, those
hosts compared with the rest over the same windows (same traffic, same minutes: drift cancels),
rolled back by itself when worse, promoted with the evidence attached when better.

    canary(project, KNOB=VALUE, role=..., options=Options())   `knobkeeper canary`: the one call
    run(project, plan, source, switch, options)                 the same on a stack of your own
    measure(plan, source, switch, options)                      the windows and the judgement only

`Options` takes every default from knobkeeper.evidence.defaults (the CLI shows them); `Switch` is how the candidate goes on and
comes off the canary hosts (the deploy, or a test's restart).

A canary owns its role while it runs
------------------------------------
From its start (before the first calibration window) to its put-back or promote, the canary holds
its lock and marker (knobkeeper.deploy.canary_state): a `set`, `unset`, `revert` or `restore` of
a knob on that role, and a deploy whose scope holds that role, are refused with one line naming the
canary (exit 2, nothing written); its own promote and deploys pass. The alternative, letting the
change through and aborting the canary with its evidence marked invalid, was rejected: the change
would land while the canary's candidate is on (the colleague's deploy restarts the canary hosts too,
or the canary's put-back deploys the colleague's value unannounced), an hour of windows would be
thrown away by anyone's routine `set`, and the person changing the role is the one at a prompt
who can wait or Ctrl-C the canary, which puts its hosts back. It refuses to start when another
canary holds the repo, when an earlier one was abandoned, or when a worker of the role is not in
sync with what is declared (`status`'s view): arm A must be the declared value.

The design (windows, a calibration, a difference of differences; restart noise; the throughput
judged; validity; restarts; guards and errors) and its statistics: knobkeeper/evidence/canary_design.py.

The candidate dying is the verdict. From the candidate deploy on, every poll (below) asks the source
whether a canary worker died (metrics.lost: its process replaced, its port refusing connections, or
no answer for metrics.UNANSWERED_GONE_S). The first sign stops the measuring there: the windows up to
then are kept, the one it died in is cut at that moment, every window from the last moment it was
seen alive on is invalid ("the candidate died"), and the verdict is "worse" with the failed guard
"the candidate died: HOST/SERVICE: what was seen", whatever the windows before said. A restart of a
canary worker seen only afterwards in a canary window (a source that cannot watch) is the same
death. As for any "worse", the evidence is written and committed first, then the hosts are put back
(`run`), so a canary killed during that put-back has left its evidence. Before this, a candidate
killed mid-canary had its dead windows measured, came out "no valid window" and was put back with
no evidence at all (issue 38).

A source that dies: while it waits out its windows the canary polls the source every POLL_S s
(PrometheusSource.poll) and at every window edge; one that stops answering stops the canary at
once, its hosts put back, the line saying so.

The evidence names the metrics under the names of the engine family it measured (the targets'
`metrics`, knobkeeper.engine: vLLM's vllm:*, SGLang's and the sim's sglang:*), written above with
SGLang's.

"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from knobkeeper.changelog.ops import set_knob
from knobkeeper.changelog.store import repo_lock
from knobkeeper.deploy import api, canary_state
from knobkeeper.deploy import status as deploy_status
from knobkeeper.deploy.api import terminate_as_interrupt
from knobkeeper.deploy.canary_state import CanaryMarker
from knobkeeper.deploy.options import DEFAULT_INVENTORY
from knobkeeper.deploy.record import DEPLOY_BUSY, deploy_lock
from knobkeeper.deploy.stack import load_stack
from knobkeeper.deploy.target import target_of
from knobkeeper.engine.pins import evidence_setup
from knobkeeper.errors import UserError
from knobkeeper.evidence import judge, metrics
from knobkeeper.evidence.canary_design import (
    CALIBRATION,
    Plan,
    candidate_death,
    choose,
    decide,
    errors_test,
    judgement,
    unjudged_runs,
    window_runs,
)
from knobkeeper.evidence.defaults import (
    ALPHA,
    CANARY_DURATION_S,
    CANARY_INTERVAL_S,
    IMBALANCE,
    RESTART_NOISE,
    SCRAPE_INTERVAL_S,
)
from knobkeeper.evidence.metrics import Gone, Target, queries, scrape_queries
from knobkeeper.evidence.model import CanaryBlock, CanarySource, Evidence, Run, Setup, Window, Workload
from knobkeeper.evidence.store import build_doc, parse_knob_spec, write
from knobkeeper.fmt import pct
from knobkeeper.fsio import lock_file, unlock_file
from knobkeeper.knobs.state import read_declared, value_of
from knobkeeper.timeutil import iso, utcnow

# The first window starts at least this long after the canary's deploy: the restarted engine warms up
# and the router re-spreads the load (health checks every few seconds).
SETTLE_MIN_S = 10.0

Apply = Callable[[list[Target], dict], None]


@dataclass
class Options:
    """How a canary runs; its defaults are knobkeeper.evidence.defaults (`knobkeeper canary --help`
    shows those). `calibrate`: seconds of windows before the deploy (None: as long as `duration`,
    the most power for the time; 0: none, the uncalibrated design). `settle`: seconds after the
    deploy before the first window (None: one interval, at least SETTLE_MIN_S). `alpha`: the
    family-wise error rate of the judgement (a stricter one asks more of a canary before it promotes
    or rolls back). `promote`: on "better", `set` the value with the evidence and deploy the role."""

    duration: float = CANARY_DURATION_S
    interval: float = CANARY_INTERVAL_S
    calibrate: float | None = None
    settle: float | None = None
    restart_noise: float = RESTART_NOISE
    alpha: float = ALPHA
    imbalance: float = IMBALANCE
    scrape_interval: float = SCRAPE_INTERVAL_S
    promote: bool = False
    reason: str | None = None
    lock_wait: float = 600.0   # s a canary deploy waits for another deploy of the repo to finish
    on_window: Callable[[int, int], None] | None = None
    on_written: Callable[[str], None] | None = None   # "ID (path)" once the evidence is committed

    def check(self) -> None:
        """UserError (one line, naming the option) for options a canary cannot run with."""
        calibrate = self.calibration_s
        if self.interval <= 0 or self.duration < 2 * self.interval:
            raise UserError(f"--duration {self.duration:g} / --interval {self.interval:g}: expected at least 2 "
                            f"windows (duration >= 2 x interval > 0)")
        if calibrate and calibrate < 2 * self.interval:
            raise UserError(f"--calibrate {calibrate:g}: expected 0 or at least 2 windows of {self.interval:g} s")
        if not 0 < self.alpha < 1:
            raise UserError(f"--alpha {self.alpha:g}: expected a probability between 0 and 1 ({ALPHA:g})")
        if not 0 <= self.restart_noise < 1:
            raise UserError(f"--restart-noise {self.restart_noise:g}: expected a log-sd from 0 to 1 "
                            f"({RESTART_NOISE:g}: {RESTART_NOISE:.0%})")

    @property
    def calibration_s(self) -> float:
        return self.duration if self.calibrate is None else self.calibrate

    @property
    def settle_s(self) -> float:
        return max(self.interval, SETTLE_MIN_S) if self.settle is None else self.settle


@dataclass
class Switch:
    """How the candidate goes on the canary hosts and comes off: `apply(canary targets, {knob:
    value})` (gated), `restore()` back to the declared state, `promote_rest()` the whole role at the
    declared state (after the promote's `set`; None: no promote possible)."""

    apply: Apply
    restore: Callable[[], None]
    promote_rest: Callable[[], None] | None = None


class NothingApplied(UserError):
    """The candidate deploy did not start (the deploy lock stayed held): nothing to put back."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM stopped the canary; `line` says what was put back (the CLI prints it, exit 130)."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


class CanaryWorse(Exception):
    """The canary was judged worse (or failed a guard) and was rolled back; `doc` is its evidence."""

    def __init__(self, doc: Evidence, reason: str):
        super().__init__(reason)
        self.doc = doc
        self.reason = reason


# ---------------------------------------------------------------- measuring

# While it waits, the canary asks its source every this many seconds whether it still can measure
# (PrometheusSource.poll: Prometheus answers) and, once the candidate is on, whether a canary worker
# died (`gone`): a source or a candidate that died stops the canary within a window.
POLL_S = 5.0


class CandidateDied(Exception):
    """A canary worker died after the candidate deploy, as the source saw it (`gone`, metrics.lost)."""

    def __init__(self, gone: Gone):
        super().__init__(gone.what)
        self.gone = gone


def _watch(source, plan: Plan, since: float) -> Callable[[], None] | None:
    """The check each poll makes once the candidate is on: CandidateDied when a canary worker died
    after `since` (the deploy's own restart is before it); None for a source that cannot tell."""
    gone = getattr(source, "gone", None)
    if gone is None:
        return None

    def watch() -> None:
        seen = gone(plan.canary, since)
        if seen is not None:
            raise CandidateDied(seen)
    return watch


def _wait_until(deadline: float, source, watch: Callable[[], None] | None = None) -> None:
    """Sleep until `deadline` (unix s), calling `source.poll()` (where it has one) and `watch` every
    POLL_S s and at the deadline."""
    poll = getattr(source, "poll", None)
    while True:
        left = deadline - time.time()
        if left <= 0:
            return
        time.sleep(min(left, POLL_S))
        if poll is not None:
            poll()
        if watch is not None:
            watch()


def _windows_of(count: int, interval: float, on_window: Callable[[int, int], None] | None, done: int,
                total: int, source=None, watch: Callable[[], None] | None = None,
                edges: list[float] | None = None) -> list[float]:
    """Wait out `count` windows of `interval` s (polling `source`, calling `watch`); their edges (unix
    s), appended to `edges` as they pass (what a caller stopped by `watch` has of them)."""
    edges = [] if edges is None else edges
    edges.append(time.time())
    for k in range(count):
        _wait_until(edges[0] + (k + 1) * interval, source, watch)
        edges.append(time.time())
        if on_window:
            on_window(done + k + 1, total)
    return edges


def _stop_quietly(source) -> None:
    try:
        source.stop()   # a second stop is harmless; the scrape thread must not outlive the run
    except Exception:
        pass


@dataclass
class _Measured:
    """What a canary saw: every window, the runs judged, the judgement, the verdict."""

    windows: list[Window]
    runs: list[Run]
    noise: float
    verdict: str
    failed: list[str]
    calibrated: bool
    deployed: float | None
    died: Gone | None = None


def _collect(plan: Plan, source, switch: Switch, options: Options) -> _Measured:
    """Calibration windows, the candidate deploy, the settle, the canary windows, the verdict.
    Once apply has begun, any failure, Ctrl-C or SIGTERM puts the canary hosts back (and re-raises);
    a candidate that died ends the windows there with the verdict "worse" (the module doc)."""
    n_windows, n_calibration = int(options.duration // options.interval), int(options.calibration_s // options.interval)
    total = n_windows + n_calibration
    applied = False
    try:
        source.start()
        calibration_edges = (_windows_of(n_calibration, options.interval, options.on_window, 0, total, source)
                             if n_calibration else [])
        applied = True
        try:
            switch.apply(plan.canary, {plan.knob: plan.value})
        except NothingApplied:
            applied = False
            raise
        deployed = time.time()
        watch, edges, died = _watch(source, plan, deployed), [], None
        try:
            _wait_until(deployed + options.settle_s, source, watch)
            _windows_of(n_windows, options.interval, options.on_window, n_calibration, total, source, watch, edges)
            source.stop()
            if watch is not None:
                watch()   # a death after the last poll: the source's last samples
        except CandidateDied as dead:
            _stop_quietly(source)
            died = dead.gone
            if len(edges) <= n_windows:   # stopped inside the windows (or the settle: one from the deploy on)
                edges = edges or [deployed]
                edges.append(max(died.seen, edges[-1]))   # the window it died in, cut where it was seen gone
        return _verdict(plan, source, options, calibration_edges, edges, died, deployed)
    except NothingApplied:
        _stop_quietly(source)
        raise
    except UserError as exc:   # the source died, no valid window, a failed deploy: say what was left
        _stop_quietly(source)
        if not applied:
            raise UserError(f"{exc}; canary stopped, nothing was deployed") from None
        try:
            switch.restore()
        except UserError as failed:
            raise UserError(f"{exc}; canary stopped: {failed}") from None
        services, hosts = ", ".join(t.key for t in plan.canary), ", ".join(sorted({t.host for t in plan.canary}))
        raise UserError(f"{exc}; canary stopped: {services} (hosts {hosts}) put back to the declared state") from None
    except BaseException:
        if applied:
            switch.restore()
        _stop_quietly(source)
        raise


def _verdict(plan: Plan, source, options: Options, calibration_edges: list[float], edges: list[float],
             died: Gone | None, deployed: float) -> _Measured:
    """The windows read from the source, judged; a dead candidate (`died`, or seen in its windows)
    is "worse" with whatever the windows before its death hold (never a window from it on)."""
    calibration = source.windows(calibration_edges) if calibration_edges else None
    runs, windows = window_runs(plan, source.windows(edges), options.imbalance, calibration, died)
    died = died or candidate_death(plan, windows)
    noise = plan.unit_noise(options.restart_noise, bool(calibration))
    judged = judgement(runs, noise, options.alpha) if runs and {r.arm for r in runs} >= {"A", "B"} else None
    verdict, failed = decide(plan, windows, judged, options.alpha, died)
    if not runs and died is not None:
        # Nothing comparable before the death: what the baseline hosts served meanwhile (arm A only:
        # an invalid level), never a number from the dead candidate's windows.
        runs, noise = [r for r in unjudged_runs(plan, windows) if r.arm == "A"], 0.0
    elif not runs and verdict == "worse":
        runs, noise = unjudged_runs(plan, windows), 0.0
    if not runs:
        reasons = sorted({r for w in windows for r in w.reasons})
        dead = f"{failed[0]}; " if died is not None else ""
        raise UserError(f"canary: {dead}no valid window ({'; '.join(reasons[:3]) or 'no data'})")
    return _Measured(windows, runs, noise, verdict, failed, bool(calibration), deployed, died)


def measure(plan: Plan, source, switch: Switch, options: Options | None = None, setup: Setup | None = None) -> Evidence:
    """Calibrate, deploy the candidate to the canary hosts, collect the windows, judge; returns the
    evidence (unwritten).

    `switch.restore()` runs on every failure, Ctrl-C or SIGTERM once the candidate went on. After the
    windows, whatever the verdict, the canary stays in place: a "worse" one raises CanaryWorse with
    the evidence, and the caller writes it, then rolls back (`run`: the windows measured are kept
    whether or not the put-back works); on any other the caller promotes it or calls restore().
    """
    options = options or Options()
    options.check()
    source.check()  # unreachable Prometheus, a worker without series: refused before anything deploys
    started = time.time()
    with terminate_as_interrupt():  # SIGTERM as Ctrl-C: the same `except` puts the hosts back
        seen = _collect(plan, source, switch, options)
    before = "canary hosts before the change, relative to the baseline hosts" if seen.calibrated else "baseline hosts"
    after = "canary hosts with the candidate, relative to the baseline hosts" if seen.calibrated else "canary hosts"
    arms = {"A": {"label": before, "knobs": {plan.knob: plan.baseline_value}},
            "B": {"label": after, "knobs": {plan.knob: plan.value}}}
    block = _record(plan, source, options, seen, round(time.time() - started, 3))
    reasons = [f"window {w.index} ({w.phase}): {'; '.join(w.reasons)}" for w in seen.windows if not w.valid]
    setup = setup or Setup()
    setup.workload = Workload(duration_s=options.duration)
    # a dead candidate's evidence is kept with what it has (a level of arm A only is invalid)
    doc = build_doc(knob=plan.knob, role=plan.role, arms=arms, runs=seen.runs, setup=setup,
                    source={"tool": "knobkeeper canary", "format": "canary"}, canary=block,
                    notes=reasons, judge_options=_judge_options(seen.noise, options.alpha),
                    keep_invalid=seen.died is not None)
    if seen.verdict == "worse":
        raise CanaryWorse(doc, f"canary worse: {', '.join(seen.failed) or 'throughput'}; canary hosts rolled back")
    return doc


def _record(plan: Plan, source, options: Options, seen: _Measured, seconds: float) -> CanaryBlock:
    """The evidence's `canary` block: the design, every window, the errors test, what was done."""
    return CanaryBlock(
        hosts={"canary": [t.key for t in plan.canary], "baseline": [t.key for t in plan.baseline]},
        source=CanarySource(kind=source.name, url=getattr(source, "url", None)),
        # the names of the family measured (issue 37: a vLLM canary recorded SGLang's here)
        queries=(queries(options.interval, plan.metrics) if source.name == "prometheus"
                 else scrape_queries(plan.metrics)),
        design=("calibrated: per-window canary/baseline ratios, canary windows (B) against calibration "
                "windows (A)" if seen.calibrated else "uncalibrated: every (host, canary window) a run"),
        interval_s=options.interval, duration_s=options.duration,
        calibration_s=(options.calibration_s // options.interval) * options.interval if seen.calibrated else 0,
        calibration_windows=sum(1 for w in seen.windows if w.phase == CALIBRATION),
        imbalance_threshold=options.imbalance, restart_noise=options.restart_noise,
        normalisation="tokens/s per request in flight x the window's mean requests in flight "
                      "(see knobkeeper.evidence.canary)",
        windows=seen.windows, errors=errors_test(plan, seen.windows, options.alpha), verdict=seen.verdict,
        failed_guards=seen.failed, rolled_back=seen.verdict == "worse", deployed_at=seen.deployed,
        seconds_to_verdict=seconds)


def _judge_options(unit_noise: float, alpha: float) -> dict | None:
    """What the doc records of the judgement's parameters (the defaults are left out)."""
    options = {**({"unit_noise": unit_noise} if unit_noise else {}), **({"alpha": alpha} if alpha != ALPHA else {})}
    return options or None


def longer_canary(doc: Evidence) -> str | None:
    """"a canary of ~N s would detect ±5%", from the observed window noise and the restart noise of
    the design (windows per arm: per phase, or host-windows / hosts uncalibrated); None when the
    verdict is settled or no length would do."""
    levels = doc.judgement.levels
    if not levels or levels[0].verdict != "inconclusive":
        return None
    c = doc.canary
    logs = {arm: [math.log(r.output_tokens_per_s) for r in doc.runs if r.arm == arm] for arm in ("A", "B")}
    if min(len(v) for v in logs.values()) < 2:
        return None
    pooled = sum(sum((x - sum(v) / len(v)) ** 2 for x in v) for v in logs.values())
    sd = math.sqrt(pooled / (sum(len(v) for v in logs.values()) - 2))
    per_window = 1 if c.calibration_windows else min(len(c.hosts["canary"]), len(c.hosts["baseline"]))
    noise = float(doc.judgement.unit_noise or 0.0)
    alpha = judge.level_alpha(1, guards=bool(doc.judgement.guards), alpha=doc.judgement.alpha)
    needed = judge._recommended(float(f"{max(sd, 1e-6):.3g}"), judge.MDE, alpha, judge.POWER, noise)
    if needed >= judge.MAX_REPEATS:
        return (f"no canary length on {len(c.hosts['canary'])} canary host(s) would detect ±{judge.MDE:.0%}: "
                f"their restart noise (±{noise:.1%}) stays whatever the windows; use more canary hosts (--hosts)")
    windows = math.ceil(needed / per_window)
    if c.calibration_windows:
        return (f"a canary of about {windows * c.interval_s:.0f} s after {windows * c.interval_s:.0f} s of "
                f"calibration ({windows} windows each) would detect ±{judge.MDE:.0%}")
    return f"a canary of about {windows * c.interval_s:.0f} s ({windows} windows) would detect ±{judge.MDE:.0%}"


# ---------------------------------------------------------------- the canary: measure, write, act

@dataclass
class Outcome:
    doc: Evidence
    verdict: str
    action: str            # "rolled back" | "promoted" | "put back"
    evidence_path: str
    entry: str | None = None

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "worse" else 0


def run(project, plan: Plan, source, switch: Switch, options: Options | None = None,
        setup: Setup | None = None) -> Outcome:
    """Run the canary, write its evidence (one commit), then roll back, promote or put back.

    Promote ("better" and `options.promote`): `set KNOB=VALUE --role R --evidence ID` (the usual
    entry, one commit), then `switch.promote_rest()` deploys the declared state to the whole role.
    Any other verdict but "worse": the canary hosts are put back and knobs.toml is left as it was.
    `options.on_written("ID (path)")` once the evidence is committed: an interruption after that
    names it.
    """

    options = options or Options()
    if options.promote and switch.promote_rest is None:
        raise UserError("--promote: no deploy to promote with")
    try:
        doc = measure(plan, source, switch, options, setup)
    except CanaryWorse as worse:
        with terminate_as_interrupt():
            path = _written_then_put_back(project, worse.doc, switch, options.on_written)
        return Outcome(worse.doc, "worse", "rolled back", project.rel(path))
    verdict = doc.canary.verdict
    if verdict == "better" and options.promote:
        path = write(project, doc)
        _written(project, doc, path, options.on_written)
        try:
            change = set_knob(project, plan.knob, _raw(plan.value), plan.role,
                              options.reason or f"canary on {', '.join(t.key for t in plan.canary)}: "
                                                f"{pct(doc.judgement.levels[0].effect)} tokens/s",
                              [doc.id])
        except BaseException:
            switch.restore()
            raise
        switch.promote_rest()
        return Outcome(doc, verdict, "promoted", project.rel(path), change.entry.id)
    with terminate_as_interrupt():
        path = _written_then_put_back(project, doc, switch, options.on_written)
    return Outcome(doc, verdict, "put back", project.rel(path))


def _written(project, doc: Evidence, path, on_written: Callable[[str], None] | None) -> None:
    if on_written is not None:
        on_written(f"{doc.id} ({project.rel(path)})")


def _written_then_put_back(project, doc: Evidence, switch: Switch,
                           on_written: Callable[[str], None] | None = None):
    """Write the evidence (one commit), then put the canary hosts back, also when the write fails
    or is interrupted: the windows measured are kept whatever the put-back does. A put-back that
    fails says so with the evidence written (its message names the hosts left on the candidate)."""
    try:
        path = write(project, doc)
    except BaseException:
        switch.restore()
        raise
    _written(project, doc, path, on_written)
    try:
        switch.restore()
    except UserError as exc:
        raise UserError(f"{exc}; evidence {doc.id} kept ({project.rel(path)})") from None
    return path


def _raw(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def deploy_switch(project, inventory: str, plan: Plan, lock_wait: float = Options.lock_wait) -> Switch:
    """The Switch backed by the real deploy (knobkeeper.deploy.api.run_deploy).

    apply: the role only, the canary hosts only (pyinfra --limit), the candidate as a knob override
    keyed by service ("HOST/SERVICE", the targets' keys), so only the canary workers' launch scripts
    change and only they restart, also on a host that runs baseline workers too (never in
    knobs.toml); recorded as a deploy with options.canary = {"phase": "candidate", ...};
    restore: the same workers back to the declared state (phase "rollback"); promote_rest: the whole
    role at the declared state (after the `set`), phase "promote". Every gate holds as usual. Each
    waits up to `lock_wait` s for another deploy of the repo to finish (progress on stderr) instead
    of failing on the deploy lock; a put-back that still fails names the services left on the
    candidate and `knobkeeper canary abort`; a candidate deploy that never started raises
    NothingApplied (nothing to roll back).
    """
    hosts = sorted({t.host for t in plan.canary})
    services = [t.key for t in plan.canary]
    tag = {"knob": plan.knob, "value": plan.value, "hosts": hosts, "services": services}
    left_on = (f"{', '.join(services)} (hosts {', '.join(hosts)}) still on {plan.knob}={_raw(plan.value)}; put them "
               f"back with `knobkeeper canary abort`")

    def deploy(phase: str, overrides: dict | None, limit: list[str] | None) -> None:
        deadline = time.monotonic() + lock_wait
        while True:
            busy = _wait_for_deploy_lock(project, deadline, phase, lock_wait)
            if busy is not None:
                break
            result = api.run_deploy(project, inventory, only=plan.role, knob_overrides=overrides, limit=limit,
                                    extra_data={"canary": {**tag, "phase": phase}})
            if result.ok:
                return
            if DEPLOY_BUSY not in (result.error or ""):
                break
            # taken between our look and pyinfra's: wait again, within the same bound
        busy = busy or (result.error if DEPLOY_BUSY in (result.error or "") else None)
        if phase == "candidate" and busy is not None:
            raise NothingApplied(f"canary: the candidate deploy of {inventory} did not start ({busy}); "
                                 f"nothing was applied, nothing to put back")
        why = busy or f"the {phase} deploy of {inventory} failed: {result.error}"
        if phase == "candidate":
            raise UserError(f"canary: {why}")
        raise UserError(f"canary: {phase} not done ({why}); {left_on}")

    return Switch(apply=lambda targets, knobs: deploy("candidate", {t.key: dict(knobs) for t in targets},
                                                      sorted({t.host for t in targets})),
                  restore=lambda: deploy("rollback", None, hosts),
                  promote_rest=lambda: deploy("promote", None, None))


def _wait_for_deploy_lock(project, deadline: float, phase: str, lock_wait: float) -> str | None:
    """Wait until no other deploy of the repo holds the deploy lock, or `deadline` (monotonic) passes;
    None when free (released at once: pyinfra takes it), else why not. Progress on stderr every 10 s."""
    lock, started, said = deploy_lock(project), time.monotonic(), None
    while True:
        try:
            unlock_file(lock_file(lock, wait=False))
            return None
        except UserError:
            now = time.monotonic()
            if now >= deadline:
                return f"{DEPLOY_BUSY} (lock {project.rel(lock)}) for {lock_wait:g} s"
            if said is None or now - said >= 10:
                said = now
                print(f"knobkeeper: canary {phase}: waiting for another deploy of this repo to finish "
                      f"({now - started:.0f} s of {max(0.0, deadline - started):.0f} s)", file=sys.stderr, flush=True)
            time.sleep(min(0.5, max(0.0, deadline - now)))


def canary(project, spec: str, *, role: str, inventory: str = DEFAULT_INVENTORY, hosts: int | None = None,
           host_names: list[str] | None = None, prometheus: str | None = None,
           options: Options | None = None) -> Outcome:
    """`knobkeeper canary KNOB=VALUE --role R ...`: everything checked before anything deploys, then
    `run` through the deploy, the metrics from knobkeeper's own scrape or from `prometheus`."""
    line = canary_state.abandoned_line(project)   # an earlier canary's candidate may still be on
    if line:
        raise UserError(line)
    options = options or Options()
    options.check()
    knob, value = parse_knob_spec(project, spec, role, "KNOB=VALUE")
    stack = load_stack(project.root, inventory)
    if role not in stack.roles:
        raise UserError(f"--role {role}: not a role of {inventory} (roles: {', '.join(stack.order)})")
    refusal = target_of(stack).canary_refusal
    if refusal:
        raise UserError(f"canary: {inventory}: {refusal}")
    canary_t, baseline_t = choose(metrics.targets_of(stack, [role]), role, hosts, host_names)
    handle = canary_state.hold(project)   # for the whole run: its death is what makes a marker abandoned
    try:
        with repo_lock(project):   # a `set` of the role is before this (and read below) or refused after it
            now = iso(utcnow())
            canary_state.write_marker(project, CanaryMarker(
                knob=knob, value=value, role=role, scope=stack.scope(role), inventory=inventory,
                services=[t.key for t in canary_t], hosts=sorted({t.host for t in canary_t}),
                phase="calibrating", started_at=now, seen_at=now, pid=os.getpid()))
            declared = (value_of(read_declared(project.knobs_path), stack.scope(role), knob)
                        if project.knobs_path.exists() else None)
        require_in_sync(project, inventory, role)
        plan = Plan(knob, value, declared, role, canary_t, baseline_t)
        source = (metrics.PrometheusSource(prometheus, plan.targets, options.scrape_interval) if prometheus
                  else metrics.ScrapeSource(plan.targets, options.scrape_interval))
        setup = Setup.build(project, inventory=inventory, **evidence_setup(stack, role))
        done: dict[str, bool] = {}
        switch = marked_switch(project, inventory, plan, deploy_switch(project, inventory, plan, options.lock_wait), done)
        try:
            options.on_written = lambda line: done.__setitem__("evidence", line)
            return run(project, plan, source, switch, _heartbeat(project, options), setup)
        except KeyboardInterrupt as stop:
            raise Interrupted(_interrupted_line(plan, done, str(stop))) from None
    finally:
        data = canary_state.read_marker(project)
        if data is not None and data.pid == os.getpid() and not data.applied_at:
            canary_state.clear_marker(project)   # nothing was applied: nothing to put back
        canary_state.release(project, handle)


def require_in_sync(project, inventory: str, role: str) -> None:
    """UserError unless every worker of `role` runs what is declared (deploy/status): a calibration
    measured with a drifted worker (an abandoned candidate, a hand edit, a deploy not run since a
    `set`) would be evidence of a baseline that is not the declared value."""
    off = [row for row in deploy_status.stack_status(project, inventory) if row.role == role and row.state != "in sync"]
    if off:
        row = off[0]
        more = f" (and {len(off) - 1} more)" if len(off) > 1 else ""
        raise UserError(f"canary: {row.host}/{row.service} is {row.state} ({row.detail or row.manager_state}){more}: "
                        f"the {role} workers must run the declared state; run `knobkeeper deploy {inventory} "
                        f"--only {role}` first (see `knobkeeper status {inventory}`)")


def _interrupted_line(plan: Plan, done: dict[str, bool], why: str) -> str:
    """`canary K=V stopped by SIGTERM: S put back to the declared state; no evidence written` (or what
    else was so: `evidence ID (path) written` once it was committed)."""
    by = "SIGTERM" if why == f"signal {signal.SIGTERM}" else "Ctrl-C" if not why else why
    services = ", ".join(t.key for t in plan.canary)
    if done.get("put_back"):
        state = f"{services} put back to the declared state (a recorded deploy)"
    elif done.get("applied"):
        state = f"{services} may still be on the candidate: put them back with `knobkeeper canary abort`"
    else:
        state = "nothing was deployed"
    evidence = f"evidence {done['evidence']} written" if done.get("evidence") else "no evidence written"
    return f"canary {plan.knob}={_raw(plan.value)} stopped by {by}: {state}; {evidence}"


def marked_switch(project, inventory: str, plan: Plan, switch: Switch, done: dict[str, bool] | None = None) -> Switch:
    """`switch` with the canary's marker (knobkeeper.deploy.canary_state): written before the
    candidate deploy starts (a kill during that deploy leaves it too), removed once the canary hosts
    are put back or the value is promoted; a put-back that fails leaves it, naming what is still on.
    `done` gets "applied" once the candidate deploy started and "put_back" once it came off."""
    done = {} if done is None else done

    def apply(targets, knobs):
        now = iso(utcnow())
        marker = canary_state.read_marker(project) or CanaryMarker(
            knob=plan.knob, value=plan.value, role=plan.role, scope=plan.role, inventory=inventory, started_at=now)
        canary_state.write_marker(project, dataclasses.replace(
            marker, knob=plan.knob, value=plan.value, inventory=inventory,
            services=[t.key for t in targets], hosts=sorted({t.host for t in targets}),
            phase="candidate-deploy", applied_at=now, seen_at=now, pid=os.getpid()))
        done["applied"] = True
        try:
            switch.apply(targets, knobs)
        except NothingApplied:
            done["applied"] = False   # not on anywhere: back to a marker that leaves nothing to put back
            canary_state.update_marker(project, applied_at=None, phase="calibrating")
            raise
        _phase(project, "candidate")

    def settled(step: Callable[[], None], phase: str) -> Callable[[], None]:
        def finished() -> None:
            _phase(project, phase)
            step()
            canary_state.clear_marker(project)
            done["put_back"] = True
        return finished

    return Switch(apply=apply, restore=settled(switch.restore, "put-back"),
                  promote_rest=settled(switch.promote_rest, "promote") if switch.promote_rest is not None else None)


def _phase(project, phase: str) -> None:
    """The marker's `phase` now (canary_state.PHASES): which deploy a kill would interrupt."""
    canary_state.update_marker(project, phase=phase, seen_at=iso(utcnow()))


def _heartbeat(project, options: Options) -> Options:
    """`options` whose on_window also stamps the marker's `seen_at` (when an abandoned canary was last alive)."""
    inner = options.on_window

    def on_window(k: int, n: int) -> None:
        canary_state.update_marker(project, seen_at=iso(utcnow()))
        if inner is not None:
            inner(k, n)

    options.on_window = on_window
    return options


def abort(project) -> tuple[CanaryMarker, Any]:
    """`knobkeeper canary abort`: deploy the services an abandoned canary left on its candidate back
    to the declared state (recorded as a deploy, canary phase "abort", `abandoned`: the phase it died
    in), or, killed during its promote, the whole role at the declared state (the promote's deploy),
    and remove its marker; (the marker, the deploy result)."""
    data = canary_state.abandoned(project)
    if data is None:
        running = canary_state.read_marker(project)
        if running is not None:
            raise UserError(f"canary abort: canary {running.knob}={running.value} is still running "
                            f"(pid {running.pid}); stop it (Ctrl-C puts it back)")
        raise UserError("canary abort: no abandoned canary in this repo (nothing to put back)")
    tag = {"knob": data.knob, "value": data.value, "hosts": data.hosts, "services": data.services}
    # Killed during its promote: the value is declared, the canary hosts run it; the rest of the role
    # is what is not done. Otherwise the canary hosts go back to the declared state.
    limit = None if data.phase == "promote" else list(data.hosts) or None
    result = api.run_deploy(project, data.inventory, only=data.role, limit=limit,
                        extra_data={"canary": {**tag, "phase": "abort", "abandoned": data.phase}})
    if not result.ok:
        raise UserError(f"canary abort: the deploy of {', '.join(data.services)} back to the declared state "
                        f"failed ({result.error}); they are still on {data.knob}={data.value}; run "
                        f"`knobkeeper deploy {data.inventory} --only {data.role}`")
    canary_state.clear_marker(project)
    return data, result


def report_lines(out: Outcome) -> list[str]:
    """What `knobkeeper canary` prints: verdict, effect, windows, what was done, the evidence."""
    doc, c = out.doc, out.doc.canary
    phases = ", ".join(f"{phase} {valid} valid of {n}" for phase, (valid, n) in c.counts().items() if n)
    lines = [f"canary {doc.knob}={_raw(doc.candidate)} on {', '.join(c.hosts['canary'])} vs "
             f"{', '.join(c.hosts['baseline'])}: {out.verdict}",
             f"  {doc.summary_line()}",
             f"  windows: {phases} ({c.interval_s:g} s each, source {c.source.kind}; "
             f"restart noise ±{c.restart_noise:.1%})"]
    if c.failed_guards:
        lines.append(f"  failed guards: {', '.join(c.failed_guards)}")
    lines.append(f"  {out.action}; evidence {doc.id} ({out.evidence_path})")
    if out.entry:
        lines.append(f"  entry {out.entry}: set {doc.knob} on {doc.role} with --evidence {doc.id}")
    hint = longer_canary(doc)
    if hint and out.verdict == "inconclusive":
        lines.append(f"  {hint}")
    return lines
