"""Issue 25 finding 6: a worker crash mid-canary went unnoticed: supervisord restarted it, its
counters started again from 0, errors read 0 vs 0 and the crash window was dropped as "spread
beyond 2x" with no restart note. Here the scrapes of a worker that crashes between two samples (its
counters reset, its process_start_time_seconds changes) are parsed from Prometheus text as the
scrape source reads them; then the canary's protocol with prepared windows (test_canary's fakes)."""

from __future__ import annotations

from knobkeeper.evidence import canary
from knobkeeper.evidence import metrics
from knobkeeper.evidence import store
from tests.infra import make_infra_repo
from tests.test_canary import FakeSource, _noisy, _plan, _with_requests


def _scrape(tokens: float, requests: float, aborted: float, running: float, started: float, itl_sum: float,
            itl_count: float) -> str:
    return (f"# TYPE sglang:generation_tokens_total counter\nsglang:generation_tokens_total {tokens}\n"
            f"# TYPE sglang:num_requests_total counter\nsglang:num_requests_total {requests}\n"
            f"# TYPE sglang:num_aborted_requests_total counter\nsglang:num_aborted_requests_total {aborted}\n"
            f"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs {running}\n"
            f"# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds {started}\n"
            f"# TYPE sglang:inter_token_latency_seconds histogram\n"
            f"sglang:inter_token_latency_seconds_bucket{{le=\"+Inf\"}} {itl_count}\n"
            f"sglang:inter_token_latency_seconds_sum {itl_sum}\nsglang:inter_token_latency_seconds_count {itl_count}\n")


def _samples(crash_after: int | None) -> list:
    """One sample a second for 9 s: 100 tokens/s, 2 requests/s, 8 in flight; a crash (restart) between
    second `crash_after` and the next: the new process counts from 0 and started later."""
    out = []
    for t in range(9):
        age, started = (t - crash_after - 0.5, 1000.5 + crash_after) if crash_after is not None and t > crash_after \
            else (t + 10, 990.0)
        out.append(metrics._Sample(float(t), metrics.parse(_scrape(100 * age, 2 * age, 0, 8, started, 0.08 * age, 100 * age))))
    return out


def test_a_restart_inside_a_window_is_counted_with_the_requests_it_failed():
    steady = metrics.ScrapeSource._window(_samples(None), 4.0, 8.0)
    assert steady.restarts == 0 and steady.errors == 0 and round(steady.output_tokens_per_s) == 100
    crashed = metrics.ScrapeSource._window(_samples(5), 4.0, 8.0)
    assert crashed.restarts == 1
    assert crashed.errors == 8                      # the 8 in flight at the crash: the new process never counts them
    assert 60 < crashed.output_tokens_per_s < 100   # summed sample to sample, not "the last value since the reset"
    before = metrics.ScrapeSource._window(_samples(5), 0.0, 4.0)
    assert before.restarts == 0 and before.errors == 0   # the window before the crash is untouched
    assert crashed.as_dict()["restarts"] == 1 and "restarts" not in steady.as_dict()


def test_restarts_invalidate_their_windows_and_three_fail_the_candidate(tmp_path):
    project = make_infra_repo(tmp_path)
    plan = _plan()
    windows = _with_requests(_noisy(31))
    for w in windows["h1/decode"][:3]:                # the candidate crashes the engine in three windows
        w.restarts = 1
    calls = []
    out = canary.run(project, plan, FakeSource(_with_requests(_noisy(30)), windows),
                canary.Switch(lambda t, k: calls.append("apply"), lambda: calls.append("restore")),
                canary.Options(duration=0.04, interval=0.01, settle=0))
    assert out.verdict == "worse" and out.action == "rolled back" and calls == ["apply", "restore"]
    doc = store.load(project, out.doc["id"])
    reasons = [w["reasons"] for w in doc["canary"]["windows"] if w["phase"] == "canary" and not w["valid"]]
    assert reasons == [["restarted: h1/decode (1x)"]] * 3, reasons
    assert "restarts: the canary workers restarted 3 times in the canary windows (3 fail the candidate)" \
        in doc["canary"]["failed_guards"], doc["canary"]["failed_guards"]
    notes = doc.validity.reasons
    assert sum("restarted: h1/decode" in note for note in notes) == 3, notes


def test_one_restart_is_an_invalid_window_not_a_failure_by_itself():
    plan = _plan()
    scraped = _with_requests(_noisy(41, n=6))
    scraped["h1/decode"][2].restarts = 1
    runs, windows = canary.window_runs(plan, scraped, calibration=_with_requests(_noisy(40, n=6)))
    invalid = [w for w in windows if not w.valid]
    assert [w.reasons for w in invalid] == [["restarted: h1/decode (1x)"]]
    assert canary.restarts_of(plan, windows) == 1
    verdict, failed = canary.decide(plan, windows, canary.judgement(runs))
    assert not any(f.startswith("restarts") for f in failed), failed
