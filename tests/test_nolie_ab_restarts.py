"""Issue 25 finding 6 for `ab run`: a worker that crashed and was restarted during a run went
unnoticed (its counters started again, the run read like any other). Two real worker processes
(tests/worker_exporter.py: SGLang's serving metrics, a real process collector); the A/B's load is
stood in for by one that kills the first worker by PID during chosen runs and starts it again on
its port (a crash supervisord restarted). The harness's ProcessWatch samples both before and after
every run, as `ab run`'s deploy harness does.

- one crash: that run's level is invalid ("arm B repeat 1: restarted: h1/decode (1x)"), its errors
  at least the requests in flight at the crash; the other level is judged as before;
- a crash in each of arm B's three runs: the candidate failed, every level invalid, saying so."""

from __future__ import annotations

import pytest

from knobkeeper.evidence import ab
from knobkeeper.evidence import metrics
from tests.procs import stop
from tests.test_nolie_prometheus import KNOB, Exporter

ARMS = {"A": {"label": "baseline", "knobs": {KNOB: None}}, "B": {"label": "candidate", "knobs": {KNOB: 512}}}


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nolie-ab")
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
