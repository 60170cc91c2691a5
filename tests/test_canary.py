"""The canary: metrics collection from real sim workers behind the real router (knobkeeper's own
scrape and a real Prometheus agreeing), the window judgement, the orchestration's rollback
guarantees and its refusals, and the evidence it writes. Every process is started on a free
loopback port and stopped by PID."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path

import pytest

from knobkeeper.errors import UserError
from knobkeeper.evidence import canary as C
from knobkeeper.evidence import metrics as M
from knobkeeper.evidence import store
from tests.infra import kk, make_infra_repo
from tests.procs import free_port, start, stop, wait_http
from tests.prometheus import Prometheus

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
SCRAPE = 0.25
TIME_SCALE = "0.3"   # decode steps of ~3.5 ms wall at the test's load: above asyncio's timer resolution


class Worker:
    """One sim worker process; restart() replaces it on the same port with another environment."""

    def __init__(self, tmp: Path, name: str, role: str, seed: int, env: dict | None = None,
                 bootstrap: int | None = None, args: tuple[str, ...] = ()):
        self.tmp, self.name, self.role, self.seed, self.bootstrap, self.args = tmp, name, role, seed, bootstrap, args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.launch(env or {})

    def launch(self, env: dict, args: tuple[str, ...] = ()) -> None:
        cmd = [PY, "-m", "knobkeeper.sim", "--role", self.role, "--host", "127.0.0.1", "--port", str(self.port),
               "--time-scale", TIME_SCALE, "--seed", str(self.seed), "--log-level", "warning", *self.args, *args]
        if self.bootstrap is not None:
            cmd += ["--bootstrap-port", str(self.bootstrap)]
        self.proc = start(cmd, self.tmp / f"{self.name}.log", env={KNOB: "", **env}, cwd=str(ROOT))
        wait_http(self.url + "/health", timeout=60, proc=self.proc)

    def restart(self, env: dict, args: tuple[str, ...] = ()) -> None:
        stop(self.proc)
        self.launch(env, args)

    def stop(self) -> None:
        stop(self.proc)

    @property
    def target(self) -> M.Target:
        return M.Target(key=f"127.0.0.1/{self.name}", host=self.name, role=self.role, url=self.url + "/metrics")


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    """A prefill, two decode workers and the real router in PD mode in front of them."""
    tmp = tmp_path_factory.mktemp("canary")
    procs = []
    try:
        pre = Worker(tmp, "prefill", "prefill", 1, bootstrap=free_port())
        procs.append(pre)
        decodes = [Worker(tmp, f"decode{i}", "decode", 10 + i) for i in (1, 2)]
        procs += decodes
        rport = free_port()
        cmd = [PY, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(rport),
               "--pd-disaggregation", "--prefill", pre.url, str(pre.bootstrap),
               *[x for d in decodes for x in ("--decode", d.url)], "--policy", "round_robin",
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
               "--disable-circuit-breaker", "--health-check-interval-secs", "1", "--log-level", "warn"]
        router = start(cmd, tmp / "router.log", cwd=str(ROOT))
        procs.append(type("R", (), {"stop": lambda self: stop(router)})())
        wait_http(f"http://127.0.0.1:{rport}/readiness", timeout=90, proc=router)
        yield {"tmp": tmp, "prefill": pre, "decodes": decodes, "router": f"http://127.0.0.1:{rport}"}
    finally:
        for p in reversed(procs):
            p.stop()


class Load:
    """Closed-loop load through the router on a thread (knobkeeper.loadgen), for `seconds`."""

    def __init__(self, endpoint: str, seconds: float, concurrency: int = 24):
        from knobkeeper.loadgen import run_load

        self.result = None
        self.thread = threading.Thread(target=lambda: setattr(self, "result", run_load(
            endpoint, concurrency, duration=seconds, api="generate", input_len=64, output_len=48,
            output_range=0.5, warmup=0)), daemon=True)
        self.thread.start()

    def join(self) -> dict:
        self.thread.join(180)
        return self.result


def collect(sources, seconds: float, windows: int):
    """Run every source over the same `windows` window edges, `seconds` apart."""
    for s in sources:
        s.start()
    time.sleep(seconds)
    edges = [time.time()]
    for k in range(windows):
        time.sleep(max(0.0, edges[0] + (k + 1) * seconds - time.time()))
        edges.append(time.time())
    for s in sources:
        s.stop()
    return [s.windows(edges) for s in sources]


# ---------------------------------------------------------------- 1. collection: two sources, same numbers

def test_scrape_and_prometheus_agree_on_real_workers(pd):
    """The 512 worker against the unset one, both sources over the same windows: the same tokens/s and
    running requests per host (within one scrape interval's traffic) and the same verdict."""
    decodes = pd["decodes"]
    decodes[1].restart({KNOB: "512"})
    targets = [d.target for d in decodes]
    prom = Prometheus(pd["tmp"], M.scrape_config_for(targets, SCRAPE))
    try:
        prom.wait_scraped(len(targets))
        scrape = M.ScrapeSource(targets, SCRAPE)
        promsrc = M.PrometheusSource(prom.url, targets, SCRAPE)
        load = Load(pd["router"], 20)
        time.sleep(2)
        scrape.check()
        promsrc.check()
        by_scrape, by_prom = collect([scrape, promsrc], 2.0, 7)
        summary = load.join()
    finally:
        prom.stop()
        decodes[1].restart({})
    assert summary["completed"] > 0, summary
    for t in targets:
        a = [w.output_tokens_per_s for w in by_scrape[t.key]]
        b = [w.output_tokens_per_s for w in by_prom[t.key]]
        assert all(x and x > 0 for x in a + b), (t.key, a, b)
        assert math.isclose(sum(a), sum(b), rel_tol=0.1), (t.key, a, b)
        ra = [w.running for w in by_scrape[t.key]]
        rb = [w.running for w in by_prom[t.key]]
        assert math.isclose(sum(ra), sum(rb), rel_tol=0.2), (t.key, ra, rb)
    plan = C.Plan(KNOB, 512, None, "decode", canary=[targets[1]], baseline=[targets[0]])
    verdicts = []
    for stats in (by_scrape, by_prom):
        runs, windows = C.window_runs(plan, stats)
        assert runs, windows
        verdicts.append(C.decide(runs, C.judgement(runs))[0])
    assert verdicts[0] == verdicts[1] == "better", verdicts
