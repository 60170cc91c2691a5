"""knobkeeper_nixl_progress: a delay for nixl's progress thread, installed into the CPU engine's
environment by knobkeeper's engine step (knobkeeper.engine.vllm_install), never imported by knobkeeper.

Why. nixl 1.5.1's Python agent (`nixl_agent.__init__` in nixl_cu12/_api.py and nixl_cu13/_api.py)
creates every agent with `pthrDelay = 0`, and vLLM's NixlConnector passes no way to change it. The
UCX backend's progress thread uses that delay as its `poll()` timeout (nixl PR #347), so at 0 it
polls without ever sleeping: one core per vLLM worker, idle or not (seen on 2 cores: both busy with
an idle stack, a shell loop ~50x slower beside it, the stack's own throughput halved). With a delay
the thread still wakes at once on its workers' events and sleeps up to the delay otherwise.

What. With KNOBKEEPER_NIXL_PROGRESS_DELAY_US=N in the process's environment (the launch script sets
it: inventory data `environment`), every nixl agent is created with pthrDelay = N microseconds (nixl
rounds it up to whole milliseconds). Unset or empty: nothing is hooked, nixl runs as shipped. Not an
integer: one warning line on stderr, nixl as shipped.

How. `knobkeeper_nixl_progress.pth` imports this module at interpreter start-up; it only adds an
import finder (nixl itself is imported when vLLM wants it). When one of nixl's `_api` modules has
run, its `nixlBind` (the C++ bindings it creates agents with) is wrapped so that `nixlAgent(name,
config)` sets `config.pthrDelay` first. The alternatives: editing nixl's _api.py in place (the file
pip installed would no longer be the wheel's) or carrying a patched vLLM connector (every vLLM pin a
new patch); the wrapper touches neither and is removed with `pip uninstall knobkeeper-nixl-progress`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

VARIABLE = "KNOBKEEPER_NIXL_PROGRESS_DELAY_US"
API_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")


class DelayedBindings:
    """nixl's bindings module, except that every agent is created with the progress delay."""

    def __init__(self, bindings, delay_us: int):
        self._bindings = bindings
        self.delay_us = delay_us

    def __getattr__(self, name):
        return getattr(self._bindings, name)

    def nixlAgent(self, name, config):  # noqa: N802 (nixl's name)
        config.pthrDelay = self.delay_us
        return self._bindings.nixlAgent(name, config)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, delay_us: int):
        self.delay_us = delay_us

    def find_spec(self, fullname, path, target=None):
        if fullname not in API_MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        run, delay_us = spec.loader.exec_module, self.delay_us

        def exec_module(module):
            run(module)
            module.nixlBind = DelayedBindings(module.nixlBind, delay_us)

        spec.loader.exec_module = exec_module
        return spec


def install(environ=os.environ) -> int | None:
    """Add the finder when the variable holds a delay; the delay, or None (nothing hooked)."""
    raw = environ.get(VARIABLE, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        print(f"knobkeeper_nixl_progress: {VARIABLE}={raw!r}: expected microseconds (an integer); "
              "nixl's progress thread keeps its shipped delay 0", file=sys.stderr)
        return None
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(int(raw)))
    return int(raw)


install()
