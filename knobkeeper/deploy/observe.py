"""What a host has, seen from the controller: shell commands on any host of an inventory (this
machine for @local, SSH through pyinfra's own connector otherwise), the state of one service, and
the knobs a launch script on the host exports. Used by `status` and `plan` (outside a pyinfra run)
and by the deploy's restart decision (inside one).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from knobkeeper.deploy.render import META_PREFIX

STARTED_MARKER = "--knobkeeper-started--"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LAUNCH_MARKER = "--knobkeeper-launch--"
LOCAL_NAMES = ("@local", "localhost")


# --- one service's state ----------------------------------------------------------------------------


def state_command(manager: str, ctl: str, program: str, started_path: str, launch_path: str | None = None) -> str:
    """Shell printing the service manager's view of `program`, started.sh's meta line and (when
    `launch_path` is given) the launch script the service manager runs, each after a marker."""
    if manager == "supervisord":
        status = f"{ctl} status {shlex.quote(program)} 2>&1 || true"
    else:
        status = f"systemctl show -p ActiveState -p MainPID {shlex.quote(program)}.service 2>&1 || true"
    grep = f"grep -m1 '^{META_PREFIX}' {shlex.quote(started_path)} 2>/dev/null || true"
    out = f"{status}; echo '{STARTED_MARKER}'; {grep}"
    if launch_path:
        out += f"; echo '{LAUNCH_MARKER}'; cat {shlex.quote(launch_path)} 2>/dev/null || true"
    return out


def parse_service_state(output: list[str]) -> dict[str, Any]:
    """{"running", "pid", "state", "started", "launch"} from state_command's output lines
    ("launch": the host's launch script text, None when absent or not asked for)."""
    state, pid, started = "UNKNOWN", None, None
    section = "status"
    launch: list[str] | None = None
    for line in output:
        if line.strip() == STARTED_MARKER:
            section = "started"
            continue
        if line.strip() == LAUNCH_MARKER:
            section = "launch"
            launch = []
            continue
        if section == "launch":
            assert launch is not None
            launch.append(line)
            continue
        if section == "started":
            if line.startswith(META_PREFIX):
                try:
                    started = json.loads(line[len(META_PREFIX):])
                except ValueError:
                    started = None
            continue
        if line.startswith("ActiveState="):
            state = line.split("=", 1)[1].strip().upper()
        elif line.startswith("MainPID="):
            value = line.split("=", 1)[1].strip()
            pid = int(value) if value.isdigit() and value != "0" else None
        elif "no such process" in line:
            state = "ABSENT"
        elif "no such file" in line.lower() or "refused" in line.lower():
            state = "NO-SUPERVISORD"
        else:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isupper():
                state = parts[1]
                match = re.search(r"pid (\d+)", line)
                pid = int(match.group(1)) if match else None
    running = state in ("RUNNING", "STARTING", "ACTIVE", "ACTIVATING", "RELOADING")
    text = "\n".join(launch) + "\n" if launch else None
    return {"running": running, "pid": pid if running else None, "state": state, "started": started, "launch": text}


# --- launch scripts ---------------------------------------------------------------------------------


def script_body(text: str) -> str:
    """A launch script without its header (the `# ...` lines after the shebang): what the digest covers."""
    lines = text.splitlines()
    out, i = [], 0
    if lines and lines[0].startswith("#!"):
        out.append(lines[0])
        i = 1
    while i < len(lines) and (lines[i].startswith("# ") or lines[i] == "#"):
        i += 1
    return "\n".join(out + lines[i:]).strip() + "\n"


def script_knobs(text: str, names: Iterable[str] | None = None) -> dict[str, str]:
    """{name: value} a launch script exports (only `names` when given; a secret read from its file
    shows as "(secret)"). A hand-edited line is read the way the shell would read it."""
    wanted = set(names) if names is not None else None
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("export "):
            line = line[len("export "):]
        name, sep, rest = line.partition("=")
        if not sep or not _NAME.match(name) or (wanted is not None and name not in wanted):
            continue
        if rest.startswith('"$(cat ') or rest.startswith("$(cat "):
            out[name] = "(secret)"
            continue
        try:
            words = shlex.split(rest, comments=True)
        except ValueError:
            words = [rest]
        out[name] = words[0] if words else ""
    return out


def knob_differences(declared: Mapping[str, str], running: Mapping[str, str]) -> list[str]:
    out = []
    for name in sorted(set(declared) | set(running)):
        d, r = declared.get(name), running.get(name)
        if d != r:
            out.append(f"{name}: running {show(r)}, declared {show(d)}")
    return out


def show(value: str | None) -> str:
    return "(unset)" if value is None else json.dumps(value) if any(c in value for c in " \n\"'$") else value


def hand_edits(rendered_launch: str, host_launch: str | None) -> list[str] | None:
    """None when the host's launch script has the rendered body (headers aside) or is absent; else
    what differs: the exported variables (as `knob_differences`), or one line saying it was edited."""
    if host_launch is None or script_body(host_launch) == script_body(rendered_launch):
        return None
    diffs = knob_differences(script_knobs(rendered_launch), script_knobs(host_launch))
    return diffs or ["launch script on the host differs from the rendered one (edited by hand?)"]


def decide(mode: str, in_scope: bool, only: str | None, rendered: Any, observed: Mapping[str, Any],
           host_launch: str | None = None) -> tuple[str, str]:
    """What a deploy does to one service, and why: ("started" | "restarted" | "unchanged", reason).

        not in only=ROLE                        -> unchanged
        restart=none                            -> unchanged
        not running                             -> started   (a rerun repairs what a failed run left down)
        restart=co                              -> restarted (co-restart)
        digest of started.sh != rendered digest -> restarted (files changed: the knobs that differ)
        the host's launch script was edited     -> restarted (what the edit changed)
        otherwise                               -> unchanged
    `rendered` is a RenderedService; `observed` parse_service_state's dict; `host_launch` the host's
    launch script as it was before this deploy uploaded anything (None: absent or not looked at).
    """
    digest = rendered.digest
    started = observed.get("started") or {}
    before = started.get("digest")
    if not in_scope:
        return "unchanged", f"not in only={only}"
    if mode == "none":
        return "unchanged", "restart=none" + ("" if observed["running"] else " (not running)")
    if not observed["running"]:
        return "started", f"not running ({str(observed['state']).lower()})"
    if mode == "co":
        return "restarted", "co-restart"
    if before != digest:
        knobs = knob_differences(rendered.knobs, started.get("knobs") or {}) if before else []
        return "restarted", f"files changed ({before or 'no started.sh'} -> {digest})" + (
            ": " + "; ".join(knobs) if knobs else "")
    edits = hand_edits(rendered.launch, host_launch)
    if edits:
        return "restarted", "launch script edited on the host: " + "; ".join(edits)
    return "unchanged", "files unchanged and running"


# --- shell on the hosts of an inventory ---------------------------------------------------------------


class HostShell:
    """Run commands on the hosts of a pyinfra Inventory; connect lazily, one connection per host."""

    def __init__(self, inventory: Any) -> None:
        self.inventory = inventory
        self.state = None
        self.errors: dict[str, str] = {}
        self._connected: dict[str, Any] = {}

    def _host(self, name: str):
        for host in self.inventory:
            if host.name == name:
                return host
        raise KeyError(name)

    def run(self, name: str, command: str) -> list[str] | None:
        """Output lines (stdout, then stderr), or None when the host cannot be reached (see .errors)."""
        if name in LOCAL_NAMES:
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            return (done.stdout + done.stderr).splitlines()
        if name in self.errors:
            return None
        host = self._connected.get(name)
        if host is None:
            host = self._connect(name)
            if host is None:
                return None
        from pyinfra.api import StringCommand
        from pyinfra.context import ctx_state

        with ctx_state.use(self.state):
            _, output = host.run_shell_command(StringCommand(command))
        return list(output.stdout_lines) + list(output.stderr_lines)

    def _connect(self, name: str):
        from pyinfra.api import Config, State
        from pyinfra.context import ctx_state

        if self.state is None:
            self.state = State(self.inventory, Config())
        host = self._host(name)
        with ctx_state.use(self.state):
            try:
                host.connect(reason="knobkeeper status", raise_exceptions=True)
            except Exception as exc:  # pyinfra's ConnectError and anything paramiko raises
                self.errors[name] = f"could not connect: {exc}"
                return None
        self._connected[name] = host
        return host

    def close(self) -> None:
        from pyinfra.context import ctx_state

        for host in self._connected.values():
            try:
                with ctx_state.use(self.state):
                    host.disconnect()
            except Exception:
                pass
        self._connected.clear()


@contextmanager
def host_shell(inventory: Any) -> Iterator[HostShell]:
    shell = HostShell(inventory)
    try:
        yield shell
    finally:
        shell.close()
