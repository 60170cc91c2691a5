"""The engine's own metrics, per host and per window, from either of two sources that give the same
numbers: knobkeeper scraping every worker's /metrics itself (`ScrapeSource`, the embedded default)
or a real Prometheus scraping the same endpoints (`PrometheusSource`, PromQL over its HTTP API).

Per target (one worker service: host/service) and per window (t_start, t_end], a `WindowStats` (the
evidence model's part: a canary window's `hosts` holds them as measured), under the names its
engine family exports (knobkeeper.engine: Family.metrics; shown here with SGLang's, which the sim
exports too; vLLM's are vllm:generation_tokens_total, vllm:num_requests_running, ...):

    output_tokens_per_s  rate(sglang:generation_tokens_total[W])
    running              avg_over_time(sglang:num_running_reqs[W])
    decoding             rate(sglang:inter_token_latency_seconds_sum[W]): the mean number of requests
                         generating over the window. The engine adds each request's time between
                         output batches to this sum as it streams, so its rate is the time integral of
                         the requests in flight (Little's law), exact where a sampled gauge is not.
    itl_ms               1000 x rate(..._sum[W]) / rate(..._count[W]): mean inter-token latency,
                         token-weighted (1000 / itl_ms = tokens/s per generating request)
    requests             increase(sglang:num_requests_total[W])           (finished requests)
    errors               increase(sglang:num_aborted_requests_total[W])   (0 when the engine has none)
    ttft_ms {p50,p99}    histogram_quantile(q, rate(sglang:time_to_first_token_seconds_bucket[W])) x 1000
    tpot_ms {p50,p99}    the same over sglang:request_time_per_output_token_seconds (sglang 0.5.23),
                         or sglang:time_per_output_token_seconds (older versions)

The scrape path computes the same quantities from its own samples: a counter's rate is its increase
between the last sample at or before each window edge, over the time between those samples (Prometheus
extrapolates to the window edges instead: the two agree to within one scrape interval's worth of
traffic); the gauge is the mean of the samples inside the window; a histogram quantile uses
Prometheus's own interpolation (`histogram_quantile`) on the bucket increases. Both parse the text
exposition with prometheus-client's parser (the scrape path) or leave it to Prometheus.

Restarts: a worker whose process was replaced (a new process_start_time_seconds, or its token or
request counter going down) between two samples restarted there: `restarts_in`, the one rule, for
the scrape path's samples, the raw samples Prometheus holds (`PrometheusSource.samples`) and `ab
run`'s samples before and after each run (`ProcessWatch`).

Unanswered scrapes: a window in which some scrape of a worker failed (`WindowStats.unanswered`: the
scrape path's failed fetches, Prometheus's `up == 0` samples) was not seen whole; a worker that
died in it is measured only up to its death there, so the canary does not judge that window.

A worker gone (`lost`, the one rule again, on either source's samples and failed scrapes since a
moment): its process was replaced, its port refused the connection (nothing listens: the process is
gone; only the scrape path can tell a refusal from a timeout), or it has not answered for
UNANSWERED_GONE_S. `ScrapeSource.gone` and `PrometheusSource.gone` say it while the canary runs.

`scrape_config(stack)` renders the prometheus.yml that scrapes every worker's /metrics and the
router's metrics port, each target labelled `kk_target="<host>/<service>"` so that the PromQL and
the scrape path name series the same way.
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from knobkeeper.engine.family import Metrics, Series
from knobkeeper.engine.sglang import SGLANG_METRICS
from knobkeeper.errors import UserError
from knobkeeper.evidence.model import WindowStats
from knobkeeper.timeutil import iso

QUANTILES = {"p50": 0.5, "p99": 0.99}
LABEL = "kk_target"


@dataclass(frozen=True)
class Target:
    """One scraped endpoint: `key` is "<host>/<service>", `url` its metrics URL."""

    key: str
    host: str
    role: str
    url: str
    metrics: Metrics = SGLANG_METRICS  # the names its engine family exports


def queries(window_s: float, names: Metrics) -> dict[str, str]:
    """The PromQL of every quantity for a window of `window_s` under the names of the workers' engine
    family (`names`: no default, so that no caller records one family's names for another's workers;
    recorded in the evidence)."""
    w = duration_text(window_s)
    tpot = " or ".join(f"rate({n}_bucket[{w}])" for n in names.tpot)
    itl = names.itl
    out = {
        "output_tokens_per_s": f"sum by ({LABEL}) (rate({names.tokens}[{w}]))",
        "running": f"sum by ({LABEL}) (avg_over_time({names.running}[{w}]))",
        "errors": f"sum by ({LABEL}) (increase({_promql(names.aborted)}[{w}]))",
        "requests": f"sum by ({LABEL}) (increase({_promql(names.requests)}[{w}]))",
        "decoding": f"sum by ({LABEL}) (rate({itl}_sum[{w}]))",
        "itl_ms": f"1000 * sum by ({LABEL}) (rate({itl}_sum[{w}])) / sum by ({LABEL}) (rate({itl}_count[{w}]))",
        # Prometheus's own `up` (0 for a scrape that failed), its count minus its sum: the failed scrapes
        "unanswered": f"sum by ({LABEL}) (count_over_time(up[{w}]) - sum_over_time(up[{w}]))",
    }
    for key, q in QUANTILES.items():
        out[f"ttft_ms.{key}"] = f"1000 * histogram_quantile({q}, sum by ({LABEL}, le) (rate({names.ttft}_bucket[{w}])))"
        out[f"tpot_ms.{key}"] = f"1000 * histogram_quantile({q}, sum by ({LABEL}, le) ({tpot}))"
    return out


def scrape_queries(names: Metrics) -> dict[str, str]:
    """What the scrape path computes for every quantity, under the names of the workers' engine
    family (recorded in the evidence, as `queries` is for Prometheus)."""
    tpot = " or ".join(names.tpot)
    return {
        "output_tokens_per_s": f"increase of {names.tokens} between the samples at the window edges / their "
                               f"time apart",
        "decoding": f"increase of {names.itl}_sum / the time apart",
        "itl_ms": f"1000 x increase of {names.itl}_sum / increase of {names.itl}_count",
        "running": f"mean of {names.running} samples in the window",
        "requests": f"increase of {names.requests.promql()}" if names.requests else "not counted by the engine",
        "errors": (f"increase of {names.aborted.promql()}" if names.aborted else "0 (the engine counts none)")
                  + ", plus the requests in flight at each restart",
        "unanswered": "scrapes of the worker that failed in the window",
        "ttft_ms/tpot_ms": f"histogram_quantile on the bucket increases of {names.ttft} and {tpot} "
                           f"(Prometheus's interpolation)"}


def _promql(series: Series | None) -> str:
    return series.promql() if series is not None else "vector(0)"


def duration_text(seconds: float) -> str:
    """A Prometheus duration: whole milliseconds ("2500ms")."""
    return f"{max(1, round(seconds * 1000))}ms"


# ---------------------------------------------------------------- parsing and the histogram quantile

# The standard process collector's gauge (prometheus_client, the engines' exporters): a new value is a new process.
PROCESS_START = "process_start_time_seconds"


def parse(text: str) -> dict[str, Any]:
    """One scrape as {"counters": {name: value}, "gauges": {name: value}, "buckets": {name: [(le, count)]},
    "sums": {histogram: sum}, "counts": {histogram: count}}.

    Series of one name are summed over their labels (one engine process: one model_name).
    """
    # here, not at the top: prometheus_client's parser costs ~28 ms, and most readers of this module
    # read recorded metrics, never a scrape
    from prometheus_client.parser import text_string_to_metric_families

    counters: dict[str, float] = {}
    by_label: dict[str, float] = {}  # "name{label=value}" -> sum, for label-filtered series (Series)
    gauges: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and friends for any malformed line
        raise ValueError(f"not Prometheus text ({exc})") from None
    for fam in families:
        for s in fam.samples:
            if fam.type == "counter" and s.name.endswith("_total"):
                counters[s.name] = counters.get(s.name, 0.0) + s.value
                for label, value in s.labels.items():
                    key = f"{s.name}{{{label}={value}}}"
                    by_label[key] = by_label.get(key, 0.0) + s.value
            elif fam.type == "gauge":
                gauges[s.name] = gauges.get(s.name, 0.0) + s.value
            elif fam.type == "histogram" and s.name.endswith("_bucket"):
                le = float(s.labels["le"])
                per = buckets.setdefault(s.name[: -len("_bucket")], {})
                per[le] = per.get(le, 0.0) + s.value
            elif fam.type == "histogram" and s.name in (f"{fam.name}_sum", f"{fam.name}_count"):
                into = sums if s.name.endswith("_sum") else counts
                into[fam.name] = into.get(fam.name, 0.0) + s.value
    return {"counters": counters, "by_label": by_label, "gauges": gauges,
            "buckets": {n: sorted(b.items()) for n, b in buckets.items()}, "sums": sums, "counts": counts}


def series_value(data: dict[str, Any], series: Series | None) -> float | None:
    """A counter's value in one parsed scrape (only the samples its label filter keeps)."""
    if series is None:
        return None
    if series.label is None:
        return data.get("counters", {}).get(series.name)
    found = [data.get("by_label", {}).get(f"{series.name}{{{series.label}={v}}}") for v in series.values]
    if all(f is None for f in found) and series.name not in data.get("counters", {}):
        return None
    return sum(f or 0.0 for f in found)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile on cumulative (le, count) pairs; None without observations."""
    if not buckets or buckets[-1][0] != math.inf:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if le == math.inf:
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and le <= 0:
                return le
            lower = prev_le if i > 0 else 0.0
            return lower + (le - lower) * (rank - prev_count) / (count - prev_count) if count > prev_count else le
        prev_le, prev_count = le, count
    return None


# ---------------------------------------------------------------- the scrape source

class ScrapeFailed(UserError):
    """A /metrics that did not answer; `refused`: the connection was refused (nothing listens on the
    port: the process is gone), not a timeout or an HTTP error from a process still there."""

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


def fetch(url: str, timeout: float = 5.0) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ScrapeFailed(f"{url}: cannot scrape ({reason})", isinstance(reason, ConnectionRefusedError)) from None


@dataclass
class _Sample:
    t: float
    data: dict[str, Any]


@dataclass(frozen=True)
class Unanswered:
    """A scrape of a worker that failed: when it began (unix s), why, whether it was refused."""

    t: float
    why: str
    refused: bool = False


def _counter(data: dict[str, Any], name: str | Series | None) -> float | None:
    if name is None or isinstance(name, Series):
        return series_value(data, name)
    return data.get("counters", {}).get(name)


def restarts_in(span: list[_Sample], names: Metrics = SGLANG_METRICS) -> tuple[int, int]:
    """(restarts, requests they failed) between consecutive samples of one worker: its process
    start time (process_start_time_seconds) changed, or its token or request counter went down (a
    new process counts from 0: engines without the process collector). Each restart failed the
    requests in flight at the sample before it (the engine's running gauge; at least one): the new
    process never counts them.

    THE one restart rule: the canary's own scrape (its samples), the Prometheus source (the raw
    samples Prometheus holds, `PrometheusSource.samples`) and `ab run` (a sample of every worker
    before and after each run, `ProcessWatch`) all give their samples to it."""
    restarts = lost = 0
    for p, q in zip(span, span[1:]):
        began = [x.data.get("gauges", {}).get(PROCESS_START) for x in (p, q)]
        counters = [(_counter(p.data, n), _counter(q.data, n)) for n in (names.tokens, names.requests) if n is not None]
        if (None not in began and began[0] != began[1]) or any(
                x is not None and y is not None and y < x for x, y in counters):
            restarts += 1
            lost += max(1, int(round(p.data.get("gauges", {}).get(names.running) or 0)))
    return restarts, lost


def _span(samples: list[_Sample], start: float, end: float) -> list[_Sample]:
    """The samples of one window (start, end]: from the last at or before its start on."""
    before = [s for s in samples if s.t <= start]
    first = before[-1].t if before else start
    return [s for s in samples if first <= s.t <= end]


# A worker none of whose scrapes answered for this long is gone, also when no refusal says so (a
# hung process, a host that dropped off the network, or Prometheus, whose `up` cannot tell a refusal
# from a timeout). Above the scrape path's own timeout (4 scrape intervals, at least 1 s; the default
# 1-s interval: 4 s) with room for a busy machine, so one slow answer is never a death.
UNANSWERED_GONE_S = 10.0


@dataclass(frozen=True)
class Gone:
    """A worker seen dead or replaced (`lost`): `alive`, the last moment (unix s) it was seen as the
    process it was; `seen`, when it was seen gone; `what`, what was seen, as words."""

    key: str
    alive: float
    seen: float
    what: str


def _clock(t: float) -> str:
    return iso(datetime.fromtimestamp(t, timezone.utc))[:19] + "Z"


def lost(key: str, samples: list[_Sample], unanswered: list[Unanswered], since: float, now: float,
         names: Metrics) -> Gone | None:
    """Whether the worker `key` died after `since` (unix s), from its samples and its failed scrapes
    up to `now`: THE rule for both sources (the module doc), the earliest sign first:

    - its process was replaced (`restarts_in` between two samples: a crash its manager restarted);
    - a scrape was refused (nothing listens on its port: the process is gone);
    - none of its scrapes answered for UNANSWERED_GONE_S up to `now`.
    """
    samples = [x for x in samples if x.t >= since]
    unanswered = [u for u in unanswered if u.t >= since]
    found = []
    for p, q in zip(samples, samples[1:]):
        if restarts_in([p, q], names)[0]:
            found.append(Gone(key, p.t, q.t, f"its process was replaced between {_clock(p.t)} and {_clock(q.t)} "
                                             f"(a new process start time, or its counters went back)"))
            break
    refused = next((u for u in unanswered if u.refused), None)
    if refused is not None:
        alive = max((x.t for x in samples if x.t < refused.t), default=since)
        found.append(Gone(key, alive, refused.t, f"its /metrics refused the connection at {_clock(refused.t)} "
                                                 f"(nothing listens on its port: the process is gone)"))
    last = max((x.t for x in samples), default=since)
    streak = [u for u in unanswered if u.t > last]
    if streak and now - streak[0].t >= UNANSWERED_GONE_S:
        found.append(Gone(key, last, now, f"its /metrics has not answered since {_clock(streak[0].t)} "
                                          f"({len(streak)} scrapes: {streak[-1].why})"))
    return min(found, key=lambda g: g.alive, default=None)


class ProcessWatch:
    """Every worker's /metrics sampled before and after a measurement (`ab run`: each run), to see
    a worker replaced during it (`restarts_in`). `targets`: the workers, or a function that says
    where they are now (a Slurm job's workers move with each job)."""

    def __init__(self, targets: Iterable[Target] | Callable[[], Iterable[Target]], timeout: float = 5.0):
        self._targets = targets if callable(targets) else list(targets)
        self.timeout = timeout

    def targets(self) -> list[Target]:
        return list(self._targets() if callable(self._targets) else self._targets)

    def sample(self) -> dict[str, _Sample]:
        """One sample of every worker now (one that does not answer is left out: not a restart)."""
        out = {}
        for t in self.targets():
            try:
                out[t.key] = _Sample(time.time(), parse(fetch(t.url, timeout=self.timeout)))
            except (UserError, ValueError):
                continue
        return out

    def restarts(self, before: dict[str, _Sample], after: dict[str, _Sample]) -> dict[str, tuple[int, int]]:
        """{worker: (restarts, requests they failed)} of the workers replaced between two samples."""
        out = {}
        for t in self.targets():
            if t.key in before and t.key in after:
                restarts, lost = restarts_in([before[t.key], after[t.key]], t.metrics)
                if restarts:
                    out[t.key] = (restarts, lost)
        return out


class ScrapeSource:
    """knobkeeper scrapes every target itself every `scrape_interval` s on a background thread."""

    name = "scrape"

    def __init__(self, targets: Iterable[Target], scrape_interval: float = 0.5):
        self.targets = list(targets)
        self.scrape_interval = scrape_interval
        self.samples: dict[str, list[_Sample]] = {t.key: [] for t in self.targets}
        self.unanswered: dict[str, list[Unanswered]] = {t.key: [] for t in self.targets}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Scrape every target once; UserError naming the first that fails or lacks the token counter."""
        for t in self.targets:
            try:
                data = parse(fetch(t.url))
            except ValueError as exc:
                raise UserError(f"{t.url}: {exc}") from None
            if t.metrics.tokens not in data["counters"]:
                raise UserError(f"{t.url} ({t.key}): no {t.metrics.tokens} series (is its engine serving metrics, "
                                f"e.g. SGLang with --enable-metrics?)")

    def _scrape_all(self) -> None:
        for t in self.targets:
            began = time.time()
            try:
                text = fetch(t.url, timeout=max(1.0, self.scrape_interval * 4))
                self.samples[t.key].append(_Sample(time.time(), parse(text)))
            except (UserError, ValueError) as exc:
                self.unanswered[t.key].append(Unanswered(began, str(exc), getattr(exc, "refused", False)))

    def gone(self, targets: Iterable[Target], since: float) -> Gone | None:
        """The first of `targets` that died after `since` (unix s), from the samples so far (`lost`)."""
        now = time.time()
        found = [lost(t.key, list(self.samples[t.key]), list(self.unanswered[t.key]), since, now, t.metrics)
                 for t in targets]
        return min((g for g in found if g is not None), key=lambda g: g.alive, default=None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self._scrape_all()
            self._stop.wait(max(0.0, self.scrape_interval - (time.monotonic() - began)))

    def start(self) -> None:
        self._scrape_all()  # a sample at or before the first window's start
        self._thread = threading.Thread(target=self._loop, name="knobkeeper-scrape", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self._scrape_all()  # a sample at or after the last window's end

    def windows(self, edges: list[float]) -> dict[str, list[WindowStats]]:
        """Per target, one WindowStats per consecutive pair of `edges` (unix seconds)."""
        return {t.key: [self._window(self.samples[t.key], a, b, t.metrics, self.unanswered[t.key])
                        for a, b in zip(edges, edges[1:])]
                for t in self.targets}

    @staticmethod
    def _window(samples: list[_Sample], start: float, end: float, names: Metrics = SGLANG_METRICS,
                unanswered: Iterable[Unanswered] = ()) -> WindowStats:
        before = [s for s in samples if s.t <= start]
        upto = [s for s in samples if s.t <= end]
        inside = [s for s in samples if start < s.t <= end]
        gauge = [s.data["gauges"].get(names.running) for s in inside]
        gauge = [g for g in gauge if g is not None]
        stats = WindowStats(start, end, None, sum(gauge) / len(gauge) if gauge else None, 0)
        stats.unanswered = sum(1 for u in unanswered if start < u.t <= end)
        if not before or not upto or upto[-1].t <= before[-1].t:
            return stats
        a, b = before[-1], upto[-1]
        dt = b.t - a.t
        span = [s for s in samples if a.t <= s.t <= b.t]

        def increase(name: str | Series | None, kind: str = "counters") -> float | None:
            def value(sample: _Sample) -> float | None:
                if isinstance(name, Series) or name is None:
                    return series_value(sample.data, name)
                return sample.data.get(kind, {}).get(name)

            va, vb = value(a), value(b)
            if va is None or vb is None:
                return None
            total, prev = 0.0, va   # summed sample to sample: a reset (a restart) starts again from 0
            for sample in span[1:]:
                v = value(sample)
                if v is not None:
                    total += v - prev if v >= prev else v
                    prev = v
            return total

        tokens = increase(names.tokens)
        stats.output_tokens_per_s = None if tokens is None else tokens / dt
        stats.restarts, lost = restarts_in(span, names)
        stats.errors = int(round(increase(names.aborted) or 0)) + lost
        finished = increase(names.requests)
        stats.requests = None if finished is None else int(round(finished))
        itl_sum, itl_count = increase(names.itl, "sums"), increase(names.itl, "counts")
        if itl_sum is not None and itl_count:
            stats.decoding = itl_sum / dt
            stats.itl_ms = 1000.0 * itl_sum / itl_count

        def quantiles(names: tuple[str, ...]) -> dict[str, float] | None:
            for name in names:
                ba, bb = dict(a.data["buckets"].get(name, [])), b.data["buckets"].get(name)
                if not bb:
                    continue
                delta = [(le, c - ba.get(le, 0.0)) for le, c in bb]
                out = {k: histogram_quantile(q, delta) for k, q in QUANTILES.items()}
                if all(v is not None for v in out.values()):
                    return {k: v * 1000 for k, v in out.items()}
            return None

        stats.ttft_ms = quantiles((names.ttft,))
        stats.tpot_ms = quantiles(names.tpot)
        return stats


# ---------------------------------------------------------------- the Prometheus source

class PrometheusSource:
    """A real Prometheus (scraping the same targets, labelled kk_target) queried over its HTTP API."""

    name = "prometheus"

    def __init__(self, url: str, targets: Iterable[Target], scrape_interval: float = 0.5):
        self.url = url.rstrip("/")
        self.targets = list(targets)
        self.scrape_interval = scrape_interval

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read()).get("error")
            except (ValueError, OSError):
                detail = exc.reason
            raise UserError(f"--source prometheus {self.url}: {path} answered {exc.code} ({detail})") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise UserError(f"--source prometheus {self.url}: unreachable ({getattr(exc, 'reason', exc)})") from None
        if body.get("status") != "success":
            raise UserError(f"--source prometheus {self.url}: {body.get('error') or body}")
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._get("/api/v1/query", params)["result"]

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        return self._get("/api/v1/query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": duration_text(step)})["result"]

    def check(self) -> None:
        """UserError when Prometheus is unreachable or holds no token series for some target.

        A series counts when Prometheus holds a sample of it within its own default lookback (5m),
        not only when it is live this instant: one scrape that timed out marks a target's series
        stale until the next, and a plain instant query then misses it (a fresh clone's make test
        saw a busy exporter miss its 250-ms scrape timeout for 2.5 s, `up` 0, and check refuse a
        target that was labelled right). A target never labelled has no sample at all."""
        for names in dict.fromkeys(t.metrics for t in self.targets):
            found = {r["metric"].get(LABEL) for r in self.query(f"last_over_time({names.tokens}[5m])")}
            missing = [t.key for t in self.targets if t.metrics == names and t.key not in found]
            if missing:
                raise UserError(f"--source prometheus {self.url}: no {names.tokens} series for {', '.join(missing)} "
                                f"(does its scrape config label targets {LABEL}=\"<host>/<service>\"? "
                                f"see `knobkeeper canary scrape-config`)")

    def start(self) -> None:
        pass

    def poll(self) -> None:
        """Called every few seconds while the canary waits out its windows: UserError as soon as
        Prometheus stops answering (its windows would be empty: better to stop now than after the
        whole duration)."""
        self.query("vector(1)")

    def stop(self) -> None:
        # The window's last samples reach Prometheus up to one scrape interval after its end.
        time.sleep(self.scrape_interval * 2 + 0.2)

    def gone(self, targets: Iterable[Target], since: float) -> Gone | None:
        """The first of `targets` that died after `since` (unix s), from the raw samples Prometheus
        holds and its failed scrapes (`up` 0), by the same rule as the scrape path (`lost`)."""
        targets = list(targets)
        now = time.time()
        raw = self.samples(since, now)
        keys = {t.key for t in targets}
        unanswered: dict[str, list[Unanswered]] = {}
        for series in self.query(f'up{{{LABEL}!=""}}[{duration_text(now - since)}]', at=now):
            key = series["metric"].get(LABEL)
            for t, v in series.get("values", []) if key in keys else ():
                if float(v) == 0:
                    unanswered.setdefault(key, []).append(Unanswered(float(t), "Prometheus could not scrape it (up 0)"))
        found = [lost(t.key, raw.get(t.key, []), unanswered.get(t.key, []), since, now, t.metrics) for t in targets]
        return min((g for g in found if g is not None), key=lambda g: g.alive, default=None)

    def samples(self, start: float, end: float) -> dict[str, list[_Sample]]:
        """Per target, the raw samples Prometheus holds from `start` to `end` of what `restarts_in`
        reads (the process start time, the token and request counters, the running gauge), one
        _Sample per scrape: the same rule as the canary's own scrape, on Prometheus's samples."""
        out: dict[str, dict[float, dict[str, Any]]] = {}
        for names in dict.fromkeys(t.metrics for t in self.targets):
            gauges = {PROCESS_START, names.running}
            counters = {n.name if isinstance(n, Series) else n for n in (names.tokens, names.requests) if n is not None}
            keys = {t.key for t in self.targets if t.metrics == names}
            selector = f'{{__name__=~"{"|".join(sorted(gauges | counters))}"}}[{duration_text(end - start)}]'
            for series in self.query(selector, at=end):
                metric = series["metric"]
                name, key = metric.get("__name__"), metric.get(LABEL)
                if key not in keys:
                    continue
                for t, v in series.get("values", []):
                    data = out.setdefault(key, {}).setdefault(round(float(t), 3), {
                        "counters": {}, "by_label": {}, "gauges": {}, "buckets": {}, "sums": {}, "counts": {}})
                    kind = "gauges" if name in gauges else "counters"
                    data[kind][name] = data[kind].get(name, 0.0) + float(v)
                    if kind == "counters":
                        for label, value in metric.items():
                            if label not in ("__name__", LABEL, "job", "instance", "role", "kk_host"):
                                by = f"{name}{{{label}={value}}}"
                                data["by_label"][by] = data["by_label"].get(by, 0.0) + float(v)
        return {key: [_Sample(t, data) for t, data in sorted(per.items())] for key, per in out.items()}

    def windows(self, edges: list[float]) -> dict[str, list[WindowStats]]:
        if len(edges) < 2:
            return {t.key: [] for t in self.targets}
        steps = [b - a for a, b in zip(edges, edges[1:])]
        width = sum(steps) / len(steps)
        ends = edges[1:]
        step = max(1, round(width * 1000)) / 1000  # what duration_text sends
        values: dict[str, dict[str, dict[int, float]]] = {}
        for name, promql in ((n, q) for names in dict.fromkeys(t.metrics for t in self.targets)
                             for n, q in queries(width, names).items()):
            for series in self.query_range(promql, ends[0], ends[-1] + step / 2, width):
                key = series["metric"].get(LABEL)
                per = values.setdefault(key, {}).setdefault(name, {})
                for t, v in series["values"]:
                    # query_range evaluates at start + k x step: the k-th window's end
                    per[round((float(t) - ends[0]) / step)] = float(v)
        out: dict[str, list[WindowStats]] = {}
        for t in self.targets:
            per = values.get(t.key, {})
            rows = []
            for i, end in enumerate(ends):
                def val(name: str) -> float | None:
                    v = per.get(name, {}).get(i)
                    return v if v is not None and math.isfinite(v) else None

                def pair(prefix: str) -> dict[str, float] | None:
                    got = {k: val(f"{prefix}.{k}") for k in QUANTILES}
                    return got if all(v is not None for v in got.values()) else None

                finished = val("requests")
                rows.append(WindowStats(edges[i], end, val("output_tokens_per_s"), val("running"),
                                        int(round(val("errors") or 0)), pair("ttft_ms"), pair("tpot_ms"),
                                        val("decoding"), val("itl_ms"),
                                        None if finished is None else int(round(finished)),
                                        unanswered=int(round(val("unanswered") or 0))))
            out[t.key] = rows
        # Restarts: Prometheus's rate() and increase() already step over a counter reset, so the
        # numbers above hold; which windows a worker was replaced in comes from its raw samples.
        raw = self.samples(edges[0] - max(width, 2 * self.scrape_interval), ends[-1])
        for t in self.targets:
            for row in out[t.key]:
                row.restarts, lost = restarts_in(_span(raw.get(t.key, []), row.start, row.end), t.metrics)
                row.errors += lost
        return out


# ---------------------------------------------------------------- targets and the scrape config

def targets_of(stack, roles: Iterable[str] | None = None) -> list[Target]:
    """Every worker service's /metrics (engine roles), in the stack's order; `roles` filters."""
    keep = set(roles) if roles is not None else None
    out = []
    for svc in stack.services:
        if svc.family.kind == "router" or (keep is not None and svc.role not in keep):
            continue
        out.append(Target(key=svc.key, host=svc.host, role=svc.role, url=svc.url + "/metrics",
                          metrics=svc.family.metrics or SGLANG_METRICS))
    return out


def scrape_config(stack, scrape_interval: float = 0.5) -> str:
    """prometheus.yml scraping every worker's /metrics and every router's metrics port."""
    targets = targets_of(stack)
    for svc in stack.services:
        if svc.family.kind == "router" and svc.metrics_port is not None:
            host = urllib.parse.urlsplit(svc.url).hostname
            targets.append(Target(key=svc.key, host=svc.host, role=svc.role,
                                  url=f"http://{host}:{svc.metrics_port}/metrics"))
    return scrape_config_for(targets, scrape_interval)


def scrape_config_for(targets: Iterable[Target], scrape_interval: float = 0.5) -> str:
    """prometheus.yml scraping `targets`, each labelled kk_target/role/kk_host (YAML is a superset of
    JSON, so the file is written as JSON: no YAML library, no quoting rules)."""
    interval = duration_text(scrape_interval)
    jobs = [{"job_name": f"engine-{i}", "scrape_interval": interval, "scrape_timeout": interval,
             "metrics_path": urllib.parse.urlsplit(t.url).path or "/metrics",
             "static_configs": [{"targets": [urllib.parse.urlsplit(t.url).netloc],
                                 "labels": {LABEL: t.key, "role": t.role, "kk_host": t.host}}]}
            for i, t in enumerate(targets)]
    return json.dumps({"global": {"scrape_interval": interval, "evaluation_interval": interval},
                       "scrape_configs": jobs}, indent=2) + "\n"


# ---------------------------------------------------------------- incident snapshots

def snapshot(stack, window: float = 5.0) -> dict[str, Any]:
    """Every service's gauges now: per engine running/queued requests and tokens/s over `window` s
    (two scrapes `window` apart), per router its metrics-port gauges and /workers as it sees them.
    A service that does not answer is recorded with its error: during an incident that IS the
    observation."""
    def scrape(url: str) -> dict[str, Any]:
        try:
            return parse(fetch(url))
        except (UserError, ValueError) as exc:
            return {"error": str(exc)}

    engines = [s for s in stack.services if s.family.kind != "router"]
    first = {s.key: scrape(s.url + "/metrics") for s in engines}
    t0 = time.time()
    time.sleep(window)
    services = []
    for svc in stack.services:
        row: dict[str, Any] = {"host": svc.host, "service": svc.name, "role": svc.role}
        if svc.family.kind == "router":
            if svc.metrics_port is not None:
                host = urllib.parse.urlsplit(svc.url).hostname
                got = scrape(f"http://{host}:{svc.metrics_port}/metrics")
                row["error"] = got.get("error")
                row["gauges"] = got.get("gauges", {})
            try:
                row["workers"] = json.loads(fetch(svc.workers_url)) if svc.workers_url else None
            except (UserError, ValueError) as exc:
                row["workers"] = {"error": str(exc)}
        else:
            now, before = scrape(svc.url + "/metrics"), first[svc.key]
            row["error"] = now.get("error") or before.get("error")
            gauges, names = now.get("gauges", {}), svc.family.metrics or SGLANG_METRICS
            row["running"] = gauges.get(names.running)
            row["queued"] = gauges.get(names.waiting)
            a, b = before.get("counters", {}).get(names.tokens), now.get("counters", {}).get(names.tokens)
            row["tokens_per_s"] = None if a is None or b is None else max(0.0, b - a) / max(1e-9, time.time() - t0)
            row["gauges"] = gauges
        services.append(row)
    return {"window_s": window, "services": services}


def snapshot_summary(snap: dict[str, Any]) -> str:
    """One line: `knobkeeper-decode@local running 0, queued 0, 0.0 tok/s; router: ...`."""
    parts = []
    for row in snap["services"]:
        name = row["service"] if row["host"] == "@local" else f"{row['host']}/{row['service']}"
        if row.get("error"):
            parts.append(f"{name} unreachable")
        elif row["role"] == "router" or "workers" in row:
            # requests the router has sent to workers and not yet answered (smg: smg_worker_requests_active)
            inflight = {k: v for k, v in row.get("gauges", {}).items() if "requests_active" in k or "flight" in k}
            workers = row.get("workers")
            healthy = ""
            if isinstance(workers, dict) and isinstance(workers.get("workers"), list):
                ws = workers["workers"]
                healthy = f", workers healthy {sum(1 for w in ws if w.get('is_healthy', True))}/{len(ws)}"
            parts.append(f"{name} in-flight {sum(inflight.values()):g}{healthy}" if inflight or healthy
                         else f"{name} up")
        else:
            tps = row.get("tokens_per_s")
            parts.append(f"{name} running {row.get('running') or 0:g}, queued {row.get('queued') or 0:g}, "
                         f"{0.0 if tps is None else tps:.1f} tok/s")
    return "; ".join(parts)
