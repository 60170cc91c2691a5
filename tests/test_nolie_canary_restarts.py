"""Issue 25 finding 6: a worker crash mid-canary went unnoticed: supervisord restarted it, its
counters started again from 0, errors read 0 vs 0 and the crash window was dropped as "spread
beyond 2x" with no restart note. Here the scrapes of a worker that crashes between two samples (its
counters reset, its process_start_time_seconds changes) are parsed from Prometheus text as the
scrape source reads them; then the canary's protocol with prepared windows (test_canary's fakes)."""

from __future__ import annotations

from knobkeeper.evidence import canary
from knobkeeper.evidence import metrics
from knobkeeper.evidence import store
from tests.infra import git, make_infra_repo
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


def test_a_restart_of_the_candidate_is_its_death_and_no_window_from_it_on_is_judged(tmp_path):
    """Issue 38: a candidate's crash is itself the verdict. Seen afterwards in its windows (a source
    that cannot watch): worse, "the candidate died" first among the failed guards and in the commit,
    the windows from the crash on not judged (before: three restarts were needed, one cost a window)."""
    project = make_infra_repo(tmp_path)
    plan = _plan()
    scraped = _with_requests(_noisy(31))
    scraped["h1/decode"][1].restarts = 1            # the candidate crashes in the second canary window
    calls = []
    out = canary.run(project, plan, FakeSource(_with_requests(_noisy(30)), scraped),
                canary.Switch(lambda t, k: calls.append("apply"), lambda: calls.append("restore")),
                canary.Options(duration=0.04, interval=0.01, settle=0))
    assert out.verdict == "worse" and out.action == "rolled back" and calls == ["apply", "restore"]
    doc = store.load(project, out.doc["id"])
    windows = [w for w in doc["canary"]["windows"] if w["phase"] == "canary"]
    assert [w["reasons"] for w in windows] == [[], ["restarted: h1/decode (1x)", "the candidate died: h1/decode"],
                                               ["the candidate died: h1/decode"], ["the candidate died: h1/decode"]]
    assert doc["canary"]["failed_guards"][0] == "the candidate died: h1/decode: its process was replaced in window 5"
    assert {r["window"] for r in doc["runs"] if r["arm"] == "B"} == {4}   # only the window before the crash
    assert git(project.root, "log", "-1", "--format=%s").endswith(
        "canary worse: the candidate died: h1/decode: its process was replaced in window 5, rolled back)")
    assert store.verify(doc) == []


def test_a_baseline_restart_is_an_invalid_window_not_a_failure():
    """A baseline worker's crash is not the candidate's: it costs that window only."""
    plan = _plan()
    scraped = _with_requests(_noisy(41, n=6))
    scraped["h2/decode"][2].restarts = 1
    runs, windows = canary.window_runs(plan, scraped, calibration=_with_requests(_noisy(40, n=6)))
    invalid = [w for w in windows if not w.valid]
    assert [w.reasons for w in invalid] == [["restarted: h2/decode (1x)"]]
    assert canary.candidate_death(plan, windows) is None and canary.restarts_of(plan, windows) == 0
    verdict, failed = canary.decide(plan, windows, canary.judgement(runs))
    assert not any(f.startswith("the candidate died") for f in failed), failed


# ---------------------------------------------------------------- the candidate seen dying (metrics.lost)

def _steady(until: int) -> list:
    return [s for s in _samples(None) if s.t <= until]


def test_lost_names_a_replaced_process_and_ignores_the_deploys_own_restart():
    gone = metrics.lost("h1/decode", _samples(5), [], since=0.0, now=9.0, names=metrics.SGLANG_METRICS)
    assert (gone.alive, gone.seen) == (5.0, 6.0)
    assert gone.what.startswith("its process was replaced between 1970-01-01T00:00:05Z and 1970-01-01T00:00:06Z")
    # the candidate deploy's own restart is before `since` (the moment the deploy returned)
    assert metrics.lost("h1/decode", _samples(5), [], since=6.0, now=9.0, names=metrics.SGLANG_METRICS) is None


def test_lost_a_refused_scrape_is_death_a_slow_one_is_not_until_it_lasts():
    refused = [metrics.Unanswered(4.5, "connection refused", refused=True)]
    gone = metrics.lost("h1/decode", _steady(4), refused, since=0.0, now=5.0, names=metrics.SGLANG_METRICS)
    assert (gone.alive, gone.seen) == (4.0, 4.5) and "refused the connection at 1970-01-01T00:00:04Z" in gone.what
    # one timeout, then answers again: alive (that window is "unanswered", not judged, but no death)
    slow = [metrics.Unanswered(4.5, "timed out")]
    assert metrics.lost("h1/decode", _samples(None), slow, since=0.0, now=9.0, names=metrics.SGLANG_METRICS) is None
    # timeouts with no answer since: death only once they last UNANSWERED_GONE_S
    streak = [metrics.Unanswered(4.0 + 0.5 * k, "timed out") for k in range(1, 30)]
    limit = 4.5 + metrics.UNANSWERED_GONE_S
    assert metrics.lost("h1/decode", _steady(4), streak, since=0.0, now=limit - 0.1, names=metrics.SGLANG_METRICS) is None
    gone = metrics.lost("h1/decode", _steady(4), streak, since=0.0, now=limit, names=metrics.SGLANG_METRICS)
    assert gone.alive == 4.0 and "has not answered since 1970-01-01T00:00:04Z" in gone.what, gone


def test_a_window_with_a_failed_scrape_is_not_judged():
    stats = metrics.ScrapeSource._window(_samples(None), 4.0, 8.0, unanswered=[metrics.Unanswered(5.5, "refused", True)])
    assert stats.unanswered == 1 and stats.as_dict()["unanswered"] == 1
    assert metrics.ScrapeSource._window(_samples(None), 0.0, 4.0, unanswered=[metrics.Unanswered(5.5, "x")]).unanswered == 0
    plan = _plan()
    rows = _noisy(50, n=3)
    rows["h2/decode"][1].unanswered = 2
    windows = canary.assess_windows(plan, rows, canary.CANARY)
    assert [w.reasons for w in windows] == [[], ["unanswered: h2/decode (2 scrapes failed)"], []]
