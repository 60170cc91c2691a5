"""`ab run` orchestration: ABBA schedule, restore always, sequential stopping, and end-to-end
against the sim engine.

The end-to-end test (the sequential design) starts a real decode sim (knobkeeper.sim) per arm
block, with the arm's knobs in its environment (stopped by PID), and drives it with the real load
generator through `measure` — the same orchestration `knobkeeper ab run` uses, with an in-process
switcher instead of the deploy, and the engine's own /get_server_info as the knob probe. The fixed
design runs end to end through the real deploy on real vLLM in tests/test_real_evidence.py;
here, on a fake load.

Sim settings: --time-scale 0.25 (decode steps 7-11 ms wall, far above asyncio's timer
resolution, and light on a shared 2-core box), a fixed seed per block, short prompts so decode
dominates. Each level is measured for a fixed window (duration mode); the block warm-up keeps the
engine warm; after the per-level warm-up (one request per stream) each 1 s window completes one or
two 64-token requests per stream (TTFT and TPOT, the guards, come from completed requests).
Keep-alive connections
(the sim has no router in front, so no keep-alive delay).

What is asserted holds on a busy machine by design: the judgement's guarantees (a real gain is
never "worse"; "inconclusive" is allowed where a busy machine's noise may hide it), never a quiet
machine's exact numbers (a neighbour can take the sim's run-to-run noise from 0.5% to 5%).
The sequential test runs the sim at 2% run-to-run noise, capped at 4 repeats (looks after 3 and
4, the first spending 56% of alpha): +12.8% at 64 settles at the first look up to ~3% total
noise (p ~ 0.002 at 2% against a threshold of 0.011), while 80 (no effect) cannot settle as "no
detectable change" there (its equivalence interval is about ±5.7% wide at 2% noise, wider with
more), so 64 stops after 3 repeats and 80 goes on to the cap.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.cli.ab import ab as ab_group
from knobkeeper.errors import UserError
from knobkeeper.evidence import ab, judge
from knobkeeper.evidence import metrics
from knobkeeper.evidence import store
from knobkeeper.evidence.model import Evidence
from tests.procs import free_port, stop, wait_http
from tests.test_canary_prometheus import Exporter

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
SIM_MAIN = Path(__file__).resolve().parent.parent / "knobkeeper" / "sim" / "__main__.py"


def _raise_priority() -> None:
    """Timing under test: ask for a better CPU share on a shared box (root only; else no-op)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass


@contextlib.contextmanager
def raised_priority():
    """This process's CPU priority raised for the block (the load generator runs in it), then put back."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    _raise_priority()
    try:
        yield
    finally:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, before)
        except OSError:
            pass


class SimSwitcher:
    """Restart a decode sim with the arm's knobs in its environment; restore = the declared arm."""

    def __init__(self, tmp: Path, declared: dict, time_scale: float = 0.25, run_noise: float = 0.005):
        self.tmp, self.declared, self.time_scale, self.run_noise = tmp, declared, time_scale, run_noise
        self.effects: Path | None = None      # an effects table merged over the shipped one (--effects)
        self.port = free_port()
        self.proc = None
        self.switches: list[dict] = []
        self.restored = 0
        self.seed = 100

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, knobs: dict) -> None:
        self.stop()
        self.seed += 1
        env = {k: v for k, v in os.environ.items() if k != KNOB}
        env.update({k: str(v) for k, v in knobs.items() if v is not None})
        cmd = [sys.executable, "-m", "knobkeeper.sim", "--role", "decode", "--host", "127.0.0.1",
               "--port", str(self.port), "--time-scale", str(self.time_scale), "--seed", str(self.seed),
               "--run-noise", str(self.run_noise), "--stream-interval", "8", "--log-level", "warning"]
        if self.effects is not None:
            cmd += ["--effects", str(self.effects)]
        # procs.start() merges over os.environ, which may hold the knob: pass the whole env instead.
        with open(self.tmp / "sim.log", "ab") as handle:
            self.proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                         cwd=str(Path(__file__).resolve().parent.parent), start_new_session=True,
                                         preexec_fn=_raise_priority)
        wait_http(f"{self.endpoint}/health", timeout=30, proc=self.proc)

    def probes(self) -> ab.Probes:
        """The knob as the running engine reports it (/get_server_info "knobs")."""
        return ab.Probes(knob=lambda arm: ab.knob_seen(arm, KNOB, ab.server_info_knobs(self.endpoint),
                                                       "/get_server_info"))

    def switch(self, arm: dict) -> None:
        self.switches.append(dict(arm["knobs"]))
        self._start(arm["knobs"])

    def restore(self) -> None:
        self.restored += 1
        self._start(self.declared)

    def stop(self) -> None:
        if self.proc is not None:
            stop(self.proc)
            self.proc = None


@pytest.fixture
def sim_switcher(tmp_path):
    if not SIM_MAIN.exists():
        pytest.skip("knobkeeper.sim is not there yet")
    sw = SimSwitcher(tmp_path, declared={KNOB: None})
    try:
        with raised_priority():
            yield sw
    finally:
        sw.stop()


def _arms(a, b):
    return {"A": {"label": "baseline", "knobs": {KNOB: a}}, "B": {"label": "candidate", "knobs": {KNOB: b}}}


def _verdicts(doc):
    return {lv.concurrency: lv.verdict for lv in doc.judgement.levels}


def test_sequential_ab_on_sim_stops_64_early_and_keeps_going_at_80(sim_switcher, tmp_path):
    """What is tested is the procedure (planned looks, a level settled at a look is measured no
    more, the other goes on to the cap), not the power at the shipped +12.8%: on CI's busy 2-core
    machine the runs' noise is several times the sim's 2% (seen: +8.8%, CI +2%..+16%, not yet
    decided at the cap of 6). So this sim's knob is given +35% at 64 running requests and none from
    76 up (the shipped curve's shape, a bigger step), an effect machine noise cannot hide in 3-5
    repeats; the power at small effects is measured in bench/, where noise is reported."""
    sw = sim_switcher
    sw.run_noise = 0.02
    sw.effects = tmp_path / "effects.toml"
    sw.effects.write_text(f"""[knobs.{KNOB}.unset]
decode_step = [[1, 1.35], [64, 1.35], [76, 1.0], [4096, 1.0]]
[knobs.{KNOB}.values."512"]
decode_step = 1.0
""")
    doc = ab.measure(ab.Harness(sw.switch, sw.restore, sw.endpoint, sw.probes()),
                     ab.Design([64, 80], max_repeats=6, duration=1.0, api="chat", input_len=8, output_len=64,
                               load_options={"keepalive": True}),
                     arms=_arms(None, 512), knob=KNOB, role="decode")
    print(store.summary_line(doc), doc.sequential.looks)
    level = {lv.concurrency: lv for lv in doc.judgement.levels}
    looks = doc.sequential.looks
    assert looks[0].repeat == 3 and doc.sequential.planned_looks == [3, 5, 6]
    stopped = {int(c): look.repeat for look in looks for c in look.settled}
    assert level[64].verdict == "better" and stopped[64] < 6, store.summary_line(doc)   # before the cap
    # n counts the runs judged: a run with errors or an outlier is left out of it, never added
    assert level[64].n_a <= stopped[64] <= max(look.repeat for look in looks)
    assert "80" not in looks[0].settled                           # 80 kept going where 64 could stop
    assert level[80].verdict != "worse"
    runs_80 = [r for r in doc.runs if r.concurrency == 80]
    assert len([r for r in doc.runs if r.concurrency == 64]) == 2 * stopped[64] <= len(runs_80)
    assert sw.restored == 1 and store.verify(doc) == []


# ---------------------------------------------------------------- orchestration without HTTP

def _fake_load(calls, fail_at=None, interrupt_at=None):
    def load(endpoint, conc, **kw):
        calls.append((conc, kw.get("requests"), kw.get("duration"), kw.get("warmup")))
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("load failed")
        if interrupt_at is not None and len(calls) == interrupt_at:
            raise KeyboardInterrupt
        return {"output_tokens_per_s": 1000.0 + conc + len(calls) % 5 + len(calls) * 1e-3, "requests_per_s": 10.0,
                "errors": 0,
                "completed": kw.get("requests") or 10}
    return load


def test_measure_switches_arms_abba_restores_once_and_judges_the_guards_in_the_family():
    """The orchestration on a fake load whose runs carry TTFT/TPOT percentiles: arms switched in ABBA
    order, the declared state restored once, every level's guards in the family (5 tests a level),
    adjusted p never below raw, and the evidence verifies. (The same through the deploy, against
    real vLLM processes: tests/test_real_evidence.py.)"""
    import math
    import random

    rng = random.Random(11)
    switched, restored = [], []

    def load(endpoint, conc, **kw):
        speed = 1.128 if switched[-1][KNOB] == 512 else 1.0
        return {"output_tokens_per_s": 1000.0 * speed * math.exp(rng.gauss(0, 0.01)), "errors": 0, "completed": 50,
                "ttft_ms": {"p50": 80 * math.exp(rng.gauss(0, 0.05)), "p99": 140 * math.exp(rng.gauss(0, 0.05))},
                "tpot_ms": {"p50": 12 * math.exp(rng.gauss(0, 0.03)), "p99": 20 * math.exp(rng.gauss(0, 0.05))}}

    doc = ab.measure(ab.Harness(lambda arm: switched.append(dict(arm["knobs"])), lambda: restored.append(1),
                                "http://x", load=load),
                     ab.Design([64, 96], 3, requests=50), arms=_arms(None, 512), knob=KNOB, role="decode")
    assert switched == [{KNOB: None}, {KNOB: 512}, {KNOB: 512}, {KNOB: None}, {KNOB: None}, {KNOB: 512}]
    assert restored == [1]
    assert doc.judgement.family.size == 2 * 5 and len(doc.judgement.guards) == 2 * 4
    assert all(lv.p_adjusted >= lv.p_value for lv in doc.judgement.levels)
    assert {lv.verdict for lv in doc.judgement.levels} == {"better"} and store.verify(doc) == []


def test_schedule_is_abba():
    assert ab.schedule(3) == [(1, "A"), (1, "B"), (2, "B"), (2, "A"), (3, "A"), (3, "B")]


@pytest.mark.parametrize("fail_at,exc", [(3, RuntimeError), (6, KeyboardInterrupt)])
def test_restore_runs_on_failure_and_ctrl_c(fail_at, exc):
    switched, restored, calls = [], [], []
    load = _fake_load(calls, fail_at=fail_at if exc is RuntimeError else None,
                      interrupt_at=fail_at if exc is KeyboardInterrupt else None)
    with pytest.raises(exc):
        ab.measure(ab.Harness(switched.append, lambda: restored.append(1), "http://x", load=load),
                   ab.Design([64, 96], 2, requests=10), arms=_arms(None, 512), knob=KNOB, role="decode")
    assert restored == [1]


def test_restore_runs_when_switch_fails():
    restored = []

    def switch(arm):
        raise UserError("deploy: decode gate failed")

    with pytest.raises(UserError):
        ab.measure(ab.Harness(switch, lambda: restored.append(1), "http://x", load=_fake_load([])),
                   ab.Design([64], 2, requests=10), arms=_arms(None, 512), knob=KNOB, role="decode")
    assert restored == [1]


def test_measure_runs_warmup_then_every_level_per_block():
    calls, switched = [], []
    doc = ab.measure(ab.Harness(switched.append, lambda: None, "http://x", load=_fake_load(calls)),
                     ab.Design([96, 64], 2, requests=50), arms=_arms(None, 512), knob=KNOB, role="decode",
                     progress=False)
    # per block: warm-up at the top level (warmup=0 inside), then 64, 96
    assert calls[:3] == [(96, 96, None, 0), (64, 50, None, None), (96, 50, None, None)]
    assert len(calls) == 4 * 3 and len(doc.runs) == 8
    assert doc.setup.schedule.order == "ABBA"
    assert doc.setup.workload.requests_per_run == 50


def test_ab_run_library_writes_and_commits_evidence_with_fake_switcher(project):
    restored = []
    doc = ab.ab_run(project, inventory="inventory/local.py", role="decode", set_spec=f"{KNOB}=512",
                    design=ab.Design([64], 2, requests=10), endpoint="http://x",
                    harness=ab.Harness(lambda arm: None, lambda: restored.append(1), None, load=_fake_load([])))
    assert restored == [1]
    assert doc.arms["A"].knobs == {KNOB: None} and doc.arms["B"].knobs == {KNOB: 512}
    log = os.popen(f"git -C {project.root} log -1 --format=%B").read()
    assert log.startswith(f"evidence: {KNOB}=512 on decode") and f"Evidence: {doc.id}" in log


def test_ab_run_cli_errors_are_one_line_exit_2(project):
    runner = CliRunner()
    out = runner.invoke(ab_group, ["run", "--repo", str(project.root), "--inventory", "inventory/local.py", "--role",
                                   "decode", "--set", f"{KNOB}=99999", "--requests", "10"])
    assert out.exit_code == 2 and "SGLANG_SM120_MMA_TARGET_CTAS=" in out.output and "8192" in out.output
    out = runner.invoke(ab_group, ["run", "--repo", str(project.root), "--inventory", "inventory/local.py", "--role",
                                   "decode", "--set", f"{KNOB}=512"])
    assert out.exit_code == 2 and "--requests or --duration" in out.output
    out = runner.invoke(ab_group, ["run", "--repo", str(project.root), "--inventory", "inventory/local.py", "--role",
                                   "decode", "--set", f"{KNOB}=512", "--requests", "5", "--concurrency", "64,x"])
    assert out.exit_code == 2 and "--concurrency" in out.output


def test_ab_run_library_defaults_to_the_sequential_design(project):
    calls = []
    doc = ab.ab_run(project, inventory="inventory/local.py", role="decode", set_spec=f"{KNOB}=512",
                    design=ab.Design([64, 96], requests=10), endpoint="http://x",
                    harness=ab.Harness(lambda arm: None, lambda: None, None, load=_fake_load(calls)))
    cap = doc.sequential.max_repeats
    assert cap == judge.sequential_repeats(levels=2, guards=True)
    assert doc.setup.schedule.design == "sequential"
    # the fake load's arms differ by a 0.5% wobble, nothing else: both levels settle as no change early
    assert doc.setup.schedule.blocks < 2 * cap
    assert {lv.verdict for lv in doc.judgement.levels} == {"no detectable change"}
    assert store.verify(doc) == []


def test_ab_run_cli_refuses_repeats_with_max_repeats(project):
    out = CliRunner().invoke(ab_group, ["run", "--repo", str(project.root), "--inventory", "inventory/local.py", "--role",
                                        "decode", "--set", f"{KNOB}=512", "--requests", "5", "--repeats", "3",
                                        "--max-repeats", "6"])
    assert out.exit_code == 2 and "--repeats and --max-repeats" in out.output
    with pytest.raises(UserError, match="give one of --repeats"):
        ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", load=_fake_load([])),
                   ab.Design([64], requests=10), arms=_arms(None, 512), knob=KNOB, role="decode")


# ---------------------------------------------------------------- the real engine's design (issue 23, item 6)

def test_a_real_engine_gets_the_real_noise_design_and_the_sim_keeps_its_own():
    """Neither --requests nor --duration on a real engine: 25-s runs after a 5-s block warm-up,
    the sequential design capped at 10 (knobkeeper.evidence.judge, "Real noise"); what the user
    gave is kept; the sim (or an unknown engine: a custom harness) is left as given."""
    from knobkeeper.evidence import defaults

    real = ab.engine_design(ab.Design([16]), simulated=False)
    assert (real.duration, real.requests, real.warmup_duration, real.max_repeats, real.repeats) == (
        defaults.REAL_RUN_S, None, defaults.REAL_WARMUP_S, defaults.REAL_MAX_REPEATS, None) == (25.0, None, 5.0, 10, None)
    given = ab.engine_design(ab.Design([16], repeats=2, requests=64, warmup_requests=16), simulated=False)
    assert (given.requests, given.duration, given.repeats, given.max_repeats, given.warmup_requests,
            given.warmup_duration) == (64, None, 2, None, 16, None)
    for simulated in (True, None):
        assert ab.engine_design(ab.Design([16]), simulated=simulated) == ab.Design([16])


def test_the_block_warm_up_is_measured_recorded_and_never_judged():
    calls = []
    load = _fake_load(calls)
    doc = ab.measure(ab.Harness(lambda arm: None, lambda: None, "http://x", load=load),
                     ab.Design([64, 96], 2, duration=25, warmup_duration=5), arms=_arms(None, 512), knob=KNOB,
                     role="decode")
    # per block: a 5-s warm-up at the top level (loadgen's own per-stream warm-up inside), then 64, 96
    assert calls[:3] == [(96, None, 5, None), (64, None, 25, None), (96, None, 25, None)]
    schedule = doc.setup.schedule
    assert schedule.warmup_requests is None and schedule.extra["warmup_s"] == 5
    warmups = schedule.extra["warmups"]
    assert [(w["arm"], w["repeat"], w["concurrency"]) for w in warmups] == [
        ("A", 1, 96), ("B", 1, 96), ("B", 2, 96), ("A", 2, 96)]
    assert all(w["output_tokens_per_s"] > 0 for w in warmups)
    # the judged runs are the 25-s ones only, and the evidence (with its warm-ups) round-trips and verifies
    assert len(doc.runs) == 8 and all(r.concurrency in (64, 96) for r in doc.runs)
    again = Evidence.from_json(json.loads(json.dumps(doc.to_json())))
    assert again.setup.schedule.extra["warmups"] == warmups and store.verify(again) == []
    with pytest.raises(UserError, match="warmup_requests or warmup_duration"):
        ab.Design([64], 2, duration=5, warmup_requests=4, warmup_duration=5).check()


def test_the_sim_inventory_is_simulated(project):
    assert ab.role_simulated(project, "inventory/local.py", "decode") is True
    assert ab.role_simulated(project, "inventory/local.py", "nosuchrole") is None


def test_the_baseline_of_a_stack_scoped_knob_is_its_stack_table(project):
    """inventory/local_vllm.py names stack "vllm": `--baseline current` is [vllm.decode]'s declared
    value, not the unscoped [decode] table's (where the knob is unset)."""
    from knobkeeper.deploy.stack import load_stack

    from tests.infra import kk

    done = kk(project, "set", "VLLM_CPU_OMP_THREADS_BIND=1", "--stack", "vllm", "--role", "decode", "--reason", "own core")
    assert done.exit_code == 0, done.output
    scope = load_stack(project.root, "inventory/local_vllm.py").scope("decode")
    assert scope == "vllm.decode"
    knob, arms = ab.arms_from_specs(project, "decode", "VLLM_CPU_OMP_THREADS_BIND=0-1", scope=scope)
    assert arms["A"]["knobs"] == {knob: "1"} and arms["B"]["knobs"] == {knob: "0-1"}
    assert ab.role_simulated(project, "inventory/local_vllm.py", "decode") is False


def test_an_undeclared_knob_s_baseline_is_what_the_inventory_runs(project):
    """Not declared: the baseline arm is the inventory's knob_defaults value (what the stack runs),
    not "unset" (which would drop the default and measure vLLM's own); declared: the declared one."""
    from tests.infra import kk

    inv = "inventory/local_vllm.py"
    knob, arms = ab.inventory_arms(project, inv, "decode", "VLLM_CPU_OMP_THREADS_BIND=0-1")
    assert arms["A"] == {"label": "baseline (inventory default)", "knobs": {knob: "1"}}
    with pytest.raises(UserError, match="already runs VLLM_CPU_OMP_THREADS_BIND=1"):
        ab.inventory_arms(project, inv, "decode", "VLLM_CPU_OMP_THREADS_BIND=1")
    assert kk(project, "set", f"{knob}=0", "--stack", "vllm", "--role", "decode", "--reason", "x").exit_code == 0
    _, arms = ab.inventory_arms(project, inv, "decode", "VLLM_CPU_OMP_THREADS_BIND=0-1")
    assert arms["A"] == {"label": "baseline (declared)", "knobs": {knob: "0"}}


# ---------------------------------------------------------------- a worker restarted during a run (issue 25, finding 6)
# A worker that crashed and was restarted during a run went unnoticed (its counters started again,
# the run read like any other). Two real worker processes (tests/worker_exporter.py: SGLang's serving
# metrics, a real process collector); the A/B's load is stood in for by one that kills the first
# worker by PID during chosen runs and starts it again on its port (a crash supervisord restarted).
# The harness's ProcessWatch samples both before and after every run, as `ab run`'s deploy harness does.
# - one crash: that run's level is invalid ("arm B repeat 1: restarted: h1/decode (1x)"), its errors at
#   least the requests in flight at the crash; the other level is judged as before;
# - a crash in each of arm B's three runs: the candidate failed, every level invalid, saying so.

ARMS = {"A": {"label": "baseline", "knobs": {KNOB: None}}, "B": {"label": "candidate", "knobs": {KNOB: 512}}}


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ab-restarts")
    made = []
    try:
        made += [Exporter(tmp, "h1"), Exporter(tmp, "h2")]
        yield made
    finally:
        for w in made:
            stop(w.proc)


def _measure(workers, crash_when) -> ab.Evidence:
    """An A/B at levels 4 and 8, 3 repeats, whose load crashes h1 in the runs `crash_when(arm, conc)` says."""
    schedule = iter(ab.schedule(3))
    block: list = []

    def switch(arm):
        block[:] = [next(schedule)]

    def load(url, conc, requests=None, warmup=None, **kw):
        repeat, arm = block[0]
        if warmup and crash_when(arm, repeat, conc):   # a level's load (warmup=4), not the block's warm-up (0)
            workers[0].crash_and_restart()
        speed = 100.0 * (1.0 + 0.001 * repeat) * (1.02 if arm == "B" else 1.0)
        return {"output_tokens_per_s": speed * conc, "completed": 20, "errors": 0, "requests_target": 20,
                "ttft_ms": {"p50": 10.0, "p99": 20.0}, "tpot_ms": {"p50": 5.0, "p99": 9.0}}

    harness = ab.Harness(switch, lambda: None, "http://127.0.0.1:9/", load=load,
                         probes=ab.Probes(workers=metrics.ProcessWatch([w.target for w in workers])))
    design = ab.Design(levels=[4, 8], repeats=3, requests=20, level_warmup=4, keep_invalid=True)
    return ab.measure(harness, design, knob=KNOB, role="decode", arms=ARMS)


def test_a_crash_during_a_run_invalidates_its_level(workers):
    doc = _measure(workers, lambda arm, repeat, conc: (arm, repeat, conc) == ("B", 1, 8))
    crashed = [r for r in doc.runs if r.extra.get("restarts")]
    assert [(r.arm, r.repeat, r.concurrency) for r in crashed] == [("B", 1, 8)], doc.runs
    assert crashed[0].extra["restarts"] == {"h1/decode": 1}
    assert crashed[0].errors >= 8            # the 8 requests in flight at the crash
    levels = {lv.concurrency: lv for lv in doc.validity.levels}
    assert "arm B repeat 1: restarted: h1/decode (1x)" in levels[8].reasons, levels[8].reasons
    assert not levels[8].valid and levels[4].valid, doc.validity.levels
    assert all(not r.extra.get("restarts") for r in doc.runs if r.concurrency == 4)


def test_three_crashes_of_the_candidate_fail_it(workers):
    doc = _measure(workers, lambda arm, repeat, conc: arm == "B" and conc == 8)
    assert sum(r.extra.get("restarts", {}).get("h1/decode", 0) for r in doc.runs) == 3
    failed = "the candidate failed: its workers restarted 3 times during arm B's runs (3 fail the candidate)"
    for level in doc.validity.levels:
        assert not level.valid and failed in level.reasons, level
    assert all(lv.verdict == "invalid" for lv in doc.judgement.levels), doc.judgement.levels
