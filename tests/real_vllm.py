"""The real vLLM environment for tests: installed by the deploy's own engine step, through pyinfra's
@local connector, into the user's knobkeeper cache (cold once per machine, about 3.5 min; cached after)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from knobkeeper.engine import vllm_install as VI

# base_python: this interpreter makes the venvs (as the local inventory should say), not whatever
# `python3` pyinfra's PATH finds: Debian's needs python3-venv, which system-packages.txt does not list.
DATA = {"vllm_version": "0.32.0", "vllm_router_version": "0.1.17", "base_python": sys.executable}
PYINFRA = str(Path(sys.executable).parent / "pyinfra")


def env_for(component: str, root: str, **data) -> VI.EngineEnv:
    return VI.EngineEnv.from_data(component, "@local", ["prefill", "decode"] if component == VI.VLLM_CPU
                                  else ["router"], {**DATA, **data}, root)


def on_host(command: str, timeout: float = 1200) -> tuple[int, list[str]]:
    """Run `command` as the deploy does on the local host: through pyinfra's @local connector."""
    done = subprocess.run([PYINFRA, "-y", "@local", "exec", "--", command], capture_output=True, text=True,
                          timeout=timeout, env={"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(Path.home()),
                                                "COLUMNS": "300", "LANG": "C.UTF-8"})
    lines = [line.split("] ", 1)[1] if line.startswith("[@local] ") else line
             for line in (done.stdout + done.stderr).splitlines()]
    return done.returncode, lines


def ensure(component: str) -> tuple[VI.EngineEnv, str, dict]:
    """(env, state, versions) of the component's environment at the default pins, installed if needed."""
    env = env_for(component, VI.default_root(local=True))
    VI.preflight(env)
    rc, lines = on_host(VI.install_command(env))
    state, versions, error = VI.parse_install(lines)
    assert rc == 0 and error is None, VI.failure_line(env, lines)
    return env, state, versions
