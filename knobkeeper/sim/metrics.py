"""GET /metrics: the engine's own metric names, types, labels and buckets, through prometheus-client.

Names and bucket layouts are those of sglang 0.5.23 (sglang/srt/observability/metrics_collector.py):

    tokenizer side, per finished request (labels model_name, engine_type, is_streaming)
      counter   sglang:prompt_tokens_total, sglang:generation_tokens_total, sglang:num_requests_total
      histogram sglang:time_to_first_token_seconds, sglang:e2e_request_latency_seconds,
                sglang:request_time_per_output_token_seconds
      histogram sglang:inter_token_latency_seconds (labels model_name, engine_type), one observation
                per output token after the first
      counter   sglang:num_aborted_requests_total (labels model_name, engine_type): the sim counts a
                request whose client went away and every failed one (fault injection, faults.py)
    scheduler side, set when scraped (labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank)
      gauge     sglang:num_running_reqs, sglang:num_queue_reqs, sglang:num_used_tokens,
                sglang:gen_throughput, sglang:cache_hit_rate (0: the sim has no prefix cache)

0.5.23 has no `sglang:time_per_output_token_seconds` (older versions did): its per-token latency is
`sglang:inter_token_latency_seconds` and its per-request TPOT `..._request_time_per_output_token_...`.
Not exported: token_usage and the KV-pool gauges (the sim models no KV pool).

The sim's own series are all `sim_*`: sim_requests_total{outcome}, sim_decode_steps_total,
sim_prefill_steps_total, sim_busy_seconds_total, sim_dropped_lag_seconds_total, sim_knob{name,value},
sim_info, sim_run_factor, sim_started_at_seconds. Each server has its own CollectorRegistry.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

# sglang 0.5.23 TokenizerMetricsCollector defaults.
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
INTER_TOKEN_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
                       0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)

CONTENT_TYPE = CONTENT_TYPE_LATEST


def engine_type(role: str) -> str:
    """sglang's DisaggregationMode.to_engine_type."""
    return role if role in ("prefill", "decode") else "unified"


class Metrics:
    def __init__(self, server):
        self.server = server
        cfg = server.cfg
        self.registry = CollectorRegistry()
        base = {"model_name": cfg.served_model_name, "engine_type": engine_type(cfg.role)}
        sched = {**base, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        req_labels = [*base, "is_streaming"]
        reg = self.registry

        def counter(name, doc, labels):
            return Counter(name, doc, labels, registry=reg)

        self.prompt_tokens = counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", req_labels)
        self.generation_tokens = counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                         req_labels)
        self.num_requests = counter("sglang:num_requests_total", "Number of requests processed.", req_labels)
        self.aborted = counter("sglang:num_aborted_requests_total", "Number of requests aborted.", list(base))
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              req_labels, buckets=TTFT_BUCKETS, registry=reg)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             list(base), buckets=INTER_TOKEN_BUCKETS, registry=reg)
        self.tpot = Histogram("sglang:request_time_per_output_token_seconds",
                              "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                              "(completion_tokens - 1).", req_labels, buckets=INTER_TOKEN_BUCKETS, registry=reg)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             req_labels, buckets=E2E_BUCKETS, registry=reg)
        # Children exist from the start, so every name is in the first scrape (as after SGLang's warm-up).
        self._by_stream = {}
        for streaming in ("false", "true"):
            lab = {**base, "is_streaming": streaming}
            self._by_stream[streaming == "true"] = tuple(
                m.labels(**lab) for m in (self.prompt_tokens, self.generation_tokens, self.num_requests,
                                          self.ttft, self.tpot, self.e2e))
        self._itl = self.itl.labels(**base)
        self._aborted = self.aborted.labels(**base)

        def gauge(name, doc):
            return Gauge(name, doc, list(sched), registry=reg).labels(**sched)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        reg.register(_SimCollector(server))

    def finished(self, req, streaming: bool) -> None:
        """Observe one answered request (engine Req with its timestamps)."""
        prompt, gen, nreq, ttft, tpot, e2e = self._by_stream[streaming]
        prompt.inc(req.prompt_tokens)
        gen.inc(req.generated)
        nreq.inc()
        t = req.t
        start, first, end = t["received_at"], t.get("first_token_at"), t.get("finished_at")
        if first is not None:
            ttft.observe(max(0.0, first - start))
        if end is not None:
            e2e.observe(max(0.0, end - start))
            if first is not None and req.generated > 1:
                per_token = max(0.0, end - first) / (req.generated - 1)
                tpot.observe(per_token)
                observe = self._itl.observe
                for _ in range(req.generated - 1):
                    observe(per_token)

    def aborted_one(self) -> None:
        self._aborted.inc()

    def exposition(self) -> bytes:
        running, waiting, tokens = self.server.load()
        self.running.set(running)
        self.queue.set(waiting)
        self.used_tokens.set(tokens)
        self.gen_throughput.set(self.server.engine.gen_throughput)
        self.cache_hit_rate.set(0.0)
        return generate_latest(self.registry)


class _SimCollector:
    """The sim_* series, read from the server and its engine at scrape time."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        s, e, c = self.server, self.server.engine, self.server.cfg
        lbl = {"model_name": c.served_model_name}
        names = list(lbl)

        def one(family, cls, doc, value):
            m = cls(family, doc, labels=names)
            m.add_metric(list(lbl.values()), value)
            return m

        outcomes = CounterMetricFamily("sim_requests", "Generation requests by outcome.", labels=[*names, "outcome"])
        for outcome, n in sorted((s.counts or {"ok": 0}).items()):
            outcomes.add_metric([c.served_model_name, outcome], n)
        yield outcomes
        yield one("sim_decode_steps", CounterMetricFamily, "Decode steps run.", e.decode_steps)
        yield one("sim_prefill_steps", CounterMetricFamily, "Prefill steps run.", e.prefill_steps)
        yield one("sim_busy_seconds", CounterMetricFamily, "Modelled engine busy time (scaled).", e.busy_s)
        yield one("sim_dropped_lag_seconds", CounterMetricFamily,
                  "Event-loop lateness given up as saturation (above the engine's MAX_LAG_S).", e.dropped_lag_s)
        knob = GaugeMetricFamily("sim_knob", "Knob values read from the environment at start-up (1 = set, 0 = unset).",
                                 labels=["name", "value"])
        for k, v in s.knobs.items():
            knob.add_metric([k, v or ""], 1 if v is not None else 0)
        yield knob
        info = GaugeMetricFamily("sim_info", "Simulated engine (not a GPU).",
                                 labels=[*names, "role", "version", "seed", "time_scale"])
        info.add_metric([c.served_model_name, c.role, s.version, str(c.seed), str(c.time_scale)], 1)
        yield info
        yield one("sim_run_factor", GaugeMetricFamily, "Per-process multiplicative noise on step times.", s.run_factor)
        yield one("sim_started_at_seconds", GaugeMetricFamily, "Process start (unix time).", s.started_at)
