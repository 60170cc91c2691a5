"""The router engines (knobkeeper.engine.routers): smg 1.13.0 and sglang-router 0.3.2, for real.

The commands the table builds are parsed by each router's own argument parser; the gate's judgement of
/workers is checked on each router's real answers; smg sees a worker restarted on the same address
healthy again (its PR 2468); sglang-router 0.3.2 still fronts the sim in PD mode. The openai client
through smg in PD mode is in tests/test_sim.py (the `stack` fixture runs smg). Every process is
started on a free loopback port and stopped by PID."""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from knobkeeper.engine.routers import ROUTERS, SGLANG_ROUTER, SMG, workers_healthy
from tests.procs import free_port, start, stop, wait_http

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
FAST_HEALTH = ["--health-check-interval-secs", "1", "--health-failure-threshold", "1",
               "--health-success-threshold", "1"]


def http(url: str, body: dict | None = None, timeout: float = 10) -> tuple[int | None, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return None, b""


def gate(engine: str, url: str, expected: int, timeout: float) -> tuple[bool, str]:
    """The deploy's router gate, as it reads the table: readiness 200, then every worker healthy."""
    r = ROUTERS[engine]
    deadline = time.monotonic() + timeout
    while True:
        code, _ = http(url + r.endpoints.readiness, timeout=2)
        last = f"readiness {code}"
        if code == 200:
            wcode, body = http(url + r.endpoints.workers, timeout=2)
            ok, last = workers_healthy(body, expected, engine) if wcode == 200 else (False, f"workers {wcode}")
            if ok:
                return True, last
        if time.monotonic() >= deadline:
            return False, last
        time.sleep(0.2)


class Stack:
    """A prefill and a decode sim and one router in PD mode."""

    def __init__(self, tmp: Path, engine: str, router_args: list[str] = ()):
        self.tmp, self.engine, self.procs = tmp, engine, {}
        self.bootstrap, self.ports = free_port(), {"prefill": free_port(), "decode": free_port()}
        for role in ("prefill", "decode"):
            self.start_worker(role)
        rport, mport = free_port(), free_port()
        self.url = f"http://127.0.0.1:{rport}"
        cmd = ROUTERS[engine].argv(PY, "127.0.0.1", rport, [(self.worker_url("prefill"), self.bootstrap)],
                                      [self.worker_url("decode")], "round_robin", "127.0.0.1", mport)
        self.procs["router"] = start(cmd + ["--disable-circuit-breaker", "--shutdown-grace-period-secs", "1",
                                            "--log-level", "warn", *router_args], tmp / f"{engine}.log", cwd=str(ROOT))

    def worker_url(self, role: str) -> str:
        return f"http://127.0.0.1:{self.ports[role]}"

    def start_worker(self, role: str) -> None:
        cmd = [PY, "-m", "knobkeeper.sim", "--role", role, "--host", "127.0.0.1", "--port", str(self.ports[role]),
               "--time-scale", "0.05", "--log-level", "warning"]
        if role == "prefill":
            cmd += ["--bootstrap-port", str(self.bootstrap)]
        self.procs[role] = start(cmd, self.tmp / f"{role}.log", env={"SGLANG_SM120_MMA_TARGET_CTAS": ""}, cwd=str(ROOT))
        wait_http(self.worker_url(role) + "/health", timeout=30, proc=self.procs[role])

    def workers(self) -> list[dict]:
        code, body = http(self.url + "/workers")
        assert code == 200, body
        return json.loads(body)["workers"]

    def router_state(self) -> str:
        """For a failed gate: is the router still running, and the last lines of its log."""
        router = self.procs["router"]
        alive = "running" if router.poll() is None else f"exited {router.returncode}"
        tail = (self.tmp / f"{self.engine}.log").read_text(errors="replace").splitlines()[-5:]
        return f"router {alive}; its log ends: " + " | ".join(tail)

    def close(self) -> None:
        for p in reversed(list(self.procs.values())):
            stop(p)


def test_commands_are_what_each_router_parser_accepts():
    argv = SMG.argv(PY, "127.0.0.1", 1, [("http://p:1", 8998), ("http://p:2", None)], ["http://d:3"],
                       "round_robin", "127.0.0.1", 4)
    assert argv[:3] == [PY, "-m", "smg.launch_router"]
    from smg.launch_router import parse_router_args as smg_parse

    a = smg_parse(argv[3:])
    assert a.pd_disaggregation and a.prefill_urls == [("http://p:1", 8998), ("http://p:2", None)]
    assert (a.decode_urls, a.host, a.port, a.prometheus_host, a.prometheus_port) == (["http://d:3"], "127.0.0.1", 1,
                                                                                   "127.0.0.1", 4)
    from sglang_router.launch_router import parse_router_args as sgr_parse

    argv = SGLANG_ROUTER.argv(PY, "127.0.0.1", 1, [("http://p:1", 8998)], ["http://d:3"], "round_robin",
                                 "127.0.0.1", 4)
    assert argv[:3] == [PY, "-m", "sglang_router.launch_router"]
    b = sgr_parse(argv[3:])
    assert b.pd_disaggregation and b.prefill_urls == [("http://p:1", 8998)] and b.prometheus_port == 4
    assert SMG.requirement("1.13.0") == "smg==1.13.0"


def test_workers_judgement_reads_each_routers_worker_states():
    # smg 1.13.0's /workers: is_healthy plus a state; a worker is healthy only when "ready"
    smg = {"workers": [{"url": "http://p:1", "worker_type": "prefill", "is_healthy": True, "status": "ready"},
                       {"url": "http://d:2", "worker_type": "decode", "is_healthy": True, "status": "draining"}],
           "total": 2}
    ok, why = workers_healthy(json.dumps(smg).encode(), 2, "smg")
    assert not ok and why == "workers unhealthy: http://d:2 (draining)"
    smg["workers"][1]["status"] = "ready"
    assert workers_healthy(json.dumps(smg).encode(), 2, "smg") == (True, "200, 2 workers healthy")
    assert workers_healthy(json.dumps(smg).encode(), 3, "smg") == (False, "workers: 2 of 3 registered")
    # sglang-router 0.3.2's: is_healthy only
    sgr = {"workers": [{"url": "http://d:2", "worker_type": "decode", "is_healthy": False}], "total": 1}
    assert workers_healthy(json.dumps(sgr).encode(), 1, "sglang-router") == (False, "workers unhealthy: http://d:2")
    assert workers_healthy(b"<html>", 1, "smg") == (False, "workers: not JSON")


def test_smg_sees_a_worker_restarted_on_the_same_address_healthy_again(tmp_path):
    """Before smg's PR 2468 a worker that went Failed stayed Failed after it came back on the same
    address; 1.13.0 probes it again. The gate fails while the router sees the decode worker failed and
    passes once the router sees the restarted worker ready, and requests flow again."""
    s = Stack(tmp_path, "smg", FAST_HEALTH)
    try:
        ok, why = gate("smg", s.url, 2, timeout=60)
        assert ok, (why, s.router_state())
        assert {(w["worker_type"], w["status"]) for w in s.workers()} == {("prefill", "ready"), ("decode", "ready")}
        stop(s.procs.pop("decode"))
        deadline = time.monotonic() + 60
        while {w["worker_type"]: w["status"] for w in s.workers()}["decode"] != "failed":
            assert time.monotonic() < deadline, s.workers()
            time.sleep(0.2)
        ok, why = gate("smg", s.url, 2, timeout=0.5)
        assert not ok, why
        s.start_worker("decode")  # the same port
        ok, why = gate("smg", s.url, 2, timeout=60)
        assert ok, (why, s.workers())
        code, body = http(s.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 3}})
        assert code == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 3
    finally:
        s.close()


@pytest.mark.parametrize("engine", ["sglang-router"])
def test_sglang_router_032_still_fronts_the_sim_in_pd_mode(tmp_path, engine):
    from openai import OpenAI

    s = Stack(tmp_path, engine)
    try:
        ok, why = gate(engine, s.url, 2, timeout=60)
        assert ok, why
        client = OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=30)
        r = client.chat.completions.create(model="knobkeeper-sim", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4)
        assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length"
        chunks = list(client.completions.create(model="knobkeeper-sim", prompt="abcd", max_tokens=3, stream=True))
        assert sum(1 for c in chunks if c.choices and c.choices[0].text) == 3
        code, body = http(s.worker_url("decode") + "/debug/rooms")
        assert code == 200 and len(json.loads(body)["rooms"]) == 2  # both went through prefill first
    finally:
        s.close()
