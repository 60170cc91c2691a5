"""A deploy dies with the process that started it, on every OS.

`run_deploy` starts pyinfra in its own session (a Ctrl-C at the caller's terminal must reach the
caller, which puts things back, not the deploy half-way), so nothing kills the deploy when its
caller is SIGKILLed. On Linux the child asks for SIGTERM at its parent's death (PR_SET_PDEATHSIG,
deploy/api._parent_death_hook). Everywhere, pyinfra's process also watches its parent itself:
run_deploy puts its own PID in PARENT_ENV, config.py (pyinfra loads it before anything connects)
calls `watch_parent()`, and a thread compares os.getppid() with it every POLL_S s. A dead parent's
child is handed to init (or a subreaper), so its parent PID changes, and PID reuse cannot fake the
old one. The deploy then gets SIGTERM, as with PR_SET_PDEATHSIG: its record journal says how far
it got (deploy/record.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time

PARENT_ENV = "KNOBKEEPER_DEPLOY_PARENT"
POLL_S = 1.0
THREAD_NAME = "knobkeeper-parent-watch"


def parent_env() -> dict[str, str]:
    """What run_deploy adds to the environment of the deploy it starts."""
    return {PARENT_ENV: str(os.getpid())}


def watch_parent(poll_s: float = POLL_S) -> bool:
    """In the deploy's process: SIGTERM to itself once the process named by PARENT_ENV is no longer
    its parent. False (nothing watched) when it was not started by run_deploy. The variable is
    removed here, so what the deploy starts does not inherit it."""
    want = os.environ.pop(PARENT_ENV, None)
    if not want or not want.isdigit():
        return False
    parent = int(want)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name=THREAD_NAME, daemon=True).start()
    return True
