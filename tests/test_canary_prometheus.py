"""The canary with `--source prometheus` (issue 25): a real Prometheus scraping two real worker
processes (tests/worker_exporter.py: SGLang's serving metrics at steady rates, a real process
collector), every process stopped by its PID. The canary's other tests: tests/test_canary.py;
`Exporter` also stands for the workers of tests/test_evidence_ab.py's restart tests.

- finding 6: a worker killed by PID and started again on its port (a crash supervisord restarted:
  new PID, new process_start_time_seconds, counters from 0) is a restart in the window it happened
  in, as the canary's own scrape says: the window is invalid ("restarted"), the requests in flight
  at the crash count as its errors. Before, only the scrape source saw restarts;
- finding 10: Prometheus killed by PID mid-canary is noticed within a poll (not after the whole
  duration); the canary stops, puts its hosts back, and its one line says so."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from knobkeeper.errors import UserError
from knobkeeper.evidence import canary
from knobkeeper.evidence import canary_design
from knobkeeper.evidence import metrics
from tests.procs import free_port, start, stop, wait_http
from tests.prometheus import Prometheus

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
EXPORTER = str(Path(__file__).resolve().parent / "worker_exporter.py")
SCRAPE = 0.25


class Exporter:
    def __init__(self, tmp: Path, name: str):
        self.tmp, self.name, self.port = tmp, name, free_port()
        self.launch()

    def launch(self) -> None:
        self.proc = start([sys.executable, EXPORTER, str(self.port)], self.tmp / f"{self.name}.log")
        wait_http(f"http://127.0.0.1:{self.port}/metrics", timeout=30, proc=self.proc)

    def crash_and_restart(self) -> None:
        """SIGKILL by PID, then a new process on the same port (what supervisord does)."""
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.launch()

    @property
    def target(self) -> metrics.Target:
        return metrics.Target(key=f"{self.name}/decode", host=self.name, role="decode",
                              url=f"http://127.0.0.1:{self.port}/metrics")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("canary-prom")
    workers = []
    prom = None
    try:
        workers = [Exporter(tmp, "h1"), Exporter(tmp, "h2")]
        prom = Prometheus(tmp, metrics.scrape_config_for([w.target for w in workers], SCRAPE))
        prom.wait_scraped(2)
        yield {"tmp": tmp, "workers": workers, "prom": prom}
    finally:
        if prom is not None:
            prom.stop()
        for w in workers:
            stop(w.proc)


def _plan(workers) -> canary_design.Plan:
    return canary_design.Plan(KNOB, 512, None, "decode", canary=[workers[0].target], baseline=[workers[1].target])


def test_a_worker_restarted_mid_window_is_a_restart_in_the_prometheus_source(stack):
    workers, prom = stack["workers"], stack["prom"]
    source = metrics.PrometheusSource(prom.url, [w.target for w in workers], SCRAPE)
    source.check()
    edges = [time.time()]
    for k in range(3):
        if k == 1:
            time.sleep(0.3)
            workers[0].crash_and_restart()   # inside the second window
        time.sleep(max(0.0, edges[0] + (k + 1) * 3.0 - time.time()))
        edges.append(time.time())
    source.stop()
    got = source.windows(edges)
    h1, h2 = got["h1/decode"], got["h2/decode"]
    assert [w.restarts for w in h2] == [0, 0, 0], h2
    assert sum(w.restarts for w in h1) == 1, h1
    crashed = next(w for w in h1 if w.restarts)
    assert h1.index(crashed) >= 1 and crashed.errors >= 8, h1   # the 8 in flight at the crash
    assert h1[0].restarts == 0 and h1[0].errors == 0 and h1[0].output_tokens_per_s > 50, h1
    # the window judgement: that window is invalid, its reason says which worker restarted
    windows = canary_design.assess_windows(_plan(workers), got, canary_design.CANARY)
    # The restart's window is invalid and says which worker restarted. A scrape Prometheus could not
    # make (a worker starved of CPU past the scrape timeout: seen in a fresh clone's make test beside
    # the API server's build) makes its window invalid too, as the design says, and only that way.
    reasons = [r for w in windows for r in w.reasons]
    assert [r for r in reasons if r.startswith("restarted")] == ["restarted: h1/decode (1x)"], reasons
    assert all(r == "restarted: h1/decode (1x)" or r.startswith("unanswered: ") for r in reasons), reasons
    assert canary_design.restarts_of(_plan(workers), windows) == 1


def test_a_candidate_crash_seen_through_prometheus_is_worse_and_stops_the_windows(stack, project):
    """Issue 38 through `--source prometheus`: the candidate worker killed by PID and started again
    on its port (a crash supervisord restarted) one second into the canary windows. The raw samples
    Prometheus holds show the new process at the next poll: the measuring stops, the evidence says
    the candidate died and is committed before the put-back."""
    from knobkeeper.evidence import store
    from tests.infra import git

    workers, prom = stack["workers"], stack["prom"]
    plan = _plan(workers)
    calls, crashed = [], {}

    def crash():
        crashed["at"] = time.time()
        workers[0].crash_and_restart()

    def apply(targets, knobs):
        calls.append("apply")
        threading.Timer(1.0, crash).start()

    out = canary.run(project, plan, metrics.PrometheusSource(prom.url, plan.targets, SCRAPE),
                     canary.Switch(apply, lambda: calls.append(("restore", git(project.root, "log", "-1", "--format=%s")))),
                     canary.Options(duration=40, interval=2, calibrate=4, settle=0))
    assert out.verdict == "worse" and out.action == "rolled back"
    assert calls[0] == "apply" and calls[1][0] == "restore" and len(calls) == 2, calls
    cause = "the candidate died: h1/decode: its process was replaced between "
    assert out.doc.canary.failed_guards[0].startswith(cause), out.doc.canary.failed_guards
    assert f"canary worse: {cause}" in calls[1][1], calls          # committed before the put-back
    in_canary = [w for w in out.doc.canary.windows if w.phase == "canary"]
    assert 0 < len(in_canary) < 20, in_canary                          # not the 40 s of windows
    after = [w for w in in_canary if w.end > crashed["at"]]
    assert after and all(not w.valid and "the candidate died: h1/decode" in w.reasons for w in after), in_canary
    assert store.verify(store.load(project, out.doc.id)) == []


def test_check_accepts_a_target_whose_last_scrape_failed(stack):
    """One failed scrape marks a target's series stale until the next: an instant query misses it,
    and check refused a target that was labelled right (a busy exporter past its 250-ms scrape
    timeout, in a fresh clone's make test). Check asks for a sample within Prometheus's lookback."""
    workers, prom = stack["workers"], stack["prom"]
    source = metrics.PrometheusSource(prom.url, [w.target for w in workers], SCRAPE)
    down = workers[1]
    os.kill(down.proc.pid, signal.SIGKILL)
    down.proc.wait(10)
    try:
        deadline = time.monotonic() + 30
        while any(r["metric"].get(metrics.LABEL) == down.target.key for r in source.query("sglang:generation_tokens_total")):
            assert time.monotonic() < deadline, "Prometheus never marked the killed exporter's series stale"
            time.sleep(0.1)
        source.check()   # the series is stale this instant, not missing
        gone = metrics.PrometheusSource(prom.url, [metrics.Target(key="h3/decode", host="h3", role="decode",
                                                                  url="http://127.0.0.1:1/metrics")], SCRAPE)
        with pytest.raises(UserError, match="no sglang:generation_tokens_total series for h3/decode"):
            gone.check()  # a target Prometheus never scraped is still refused
    finally:
        down.launch()
        prom.wait_scraped(2)


def test_prometheus_dying_mid_canary_stops_it_within_a_poll_and_puts_the_hosts_back(stack, project):
    """Last in the module: it kills the module's Prometheus."""
    workers, prom = stack["workers"], stack["prom"]
    plan = _plan(workers)
    calls = []

    def apply(targets, knobs):
        calls.append("apply")
        threading.Timer(1.0, lambda: os.kill(prom.proc.pid, signal.SIGKILL)).start()

    began = time.monotonic()
    with pytest.raises(UserError) as caught:
        canary.run(project, plan, metrics.PrometheusSource(prom.url, plan.targets, SCRAPE),
                   canary.Switch(apply, lambda: calls.append("restore")),
                   canary.Options(duration=600, interval=120, calibrate=0, settle=0))
    took = time.monotonic() - began
    prom.proc.wait(10)
    line = str(caught.value)
    assert calls == ["apply", "restore"], calls
    assert took < 60, took                 # a poll every C.POLL_S s, not the 600 s of windows
    assert line.startswith(f"--source prometheus {prom.url}: unreachable"), line
    assert line.endswith("canary stopped: h1/decode (hosts h1) put back to the declared state"), line
    assert "\n" not in line
