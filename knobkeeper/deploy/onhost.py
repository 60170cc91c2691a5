"""What every deploy target uses while a deploy runs (deploy/hosts.py and deploy/slurm/ alike): a
command on a pyinfra host, the one progress printer, and the failed gate.

    >>> on_host()("supervisorctl -c /srv/kk/supervisord.conf status")   # inside an operation
    ['knobkeeper-decode  RUNNING  pid 4242, uptime 0:01:02']
    >>> say("decode: healthy in 12.3 s")                                 # stderr, one line
    knobkeeper: decode: healthy in 12.3 s

Nothing of deploy/ is imported here, so a target's modules import these names at their top.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

RunOnHost = Callable[[str], list[str]]


class GateFailed(Exception):
    """A service did not become healthy in time; the message names host, service, URL, last status."""


def say(text: str) -> None:
    """A progress line of the deploy, on stderr: `knobkeeper: TEXT`."""
    print(f"knobkeeper: {text}", file=sys.stderr, flush=True)


def on_host(host: Any = None) -> RunOnHost:
    """`run(command) -> output lines` on `host` (a pyinfra Host), default the host whose operation
    runs (health identity checks; a pending settle is checked on its own host from any operation)."""
    # pyinfra on first use: status and the CLI import deploy/health.py, which imports this module,
    # and need none of pyinfra (its import is most of a second on a busy machine).
    from pyinfra import host as current_host
    from pyinfra.api import StringCommand

    target = host or current_host

    def run(command: str) -> list[str]:
        _, output = target.run_shell_command(StringCommand(command))
        return list(output.stdout_lines) + list(output.stderr_lines)

    return run
