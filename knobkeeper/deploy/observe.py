"""What a host has, seen from the controller: shell commands on any host of an inventory (this
machine for @local, SSH through pyinfra's own connector otherwise), the state of one service (the
service manager's view and the files it was started from), and the knobs a launch script on the
host exports. Used by `status` and `plan` (outside a pyinfra run) and by the deploy's facts.

Imports inside functions: pyinfra (~130 ms, -X importtime) only when `status` or `plan` reach a host
over SSH; on @local they never load it (inside a deploy it is loaded already).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

from knobkeeper import fmt
from knobkeeper.deploy.model import Service
from knobkeeper.deploy.render import parse_meta, strip_header
from knobkeeper.knobs.catalog import ENV_NAME
STARTED_MARKER = "--knobkeeper-started--"
STARTED_MANAGER_MARKER = "--knobkeeper-started-manager--"
LAUNCH_MARKER = "--knobkeeper-launch--"
FAILED_GATE_MARKER = "--knobkeeper-failed-gate--"
LOCAL_NAMES = ("@local", "localhost")
# Up and past start-up. STARTING / BACKOFF (supervisord) and ACTIVATING (systemd) are not: a
# program that crash-loops spends its life in them.
RUNNING_STATES = ("RUNNING", "ACTIVE", "RELOADING")


# --- one service's state ----------------------------------------------------------------------------


def manager_status_command(svc: Service, ctl: str) -> str:
    """Shell printing the service manager's view of `svc` (state and main PID)."""
    if svc.manager == "supervisord":
        return f"{ctl} status {shlex.quote(svc.name)} 2>&1 || true"
    return f"systemctl show -p ActiveState -p SubState -p MainPID {shlex.quote(svc.name)}.service 2>&1 || true"


def state_command(svc: Service, ctl: str, with_launch: bool = False, status: str | None = None) -> str:
    """Shell printing the service manager's view of `svc`, then (each after a marker) started.sh and
    the started program section / unit (the files the process was started from), the mark of a
    failed gate (`failed_gate_path`) and, with `with_launch`, the launch script the service manager
    runs now. `status`: the shell that prints the manager's view (default manager_status_command)."""
    q = shlex.quote
    status = status or manager_status_command(svc, ctl)
    out = (f"{status}; echo '{STARTED_MARKER}'; cat {q(svc.started_path)} 2>/dev/null || true; "
           f"echo '{STARTED_MANAGER_MARKER}'; cat {q(svc.started_manager_path)} 2>/dev/null || true; "
           f"echo '{FAILED_GATE_MARKER}'; cat {q(svc.failed_gate_path)} 2>/dev/null || true")
    if with_launch:
        out += f"; echo '{LAUNCH_MARKER}'; cat {q(svc.launch_path)} 2>/dev/null || true"
    return out


def parse_manager_status(lines: Iterable[str]) -> tuple[str, int | None]:
    """(state, pid) from `manager_status_command` output. A systemd unit waiting to be restarted
    after a failure (SubState=auto-restart) is in a restart loop: state "RESTART-LOOP"."""
    state, pid, sub = "UNKNOWN", None, ""
    for line in lines:
        if line.startswith("ActiveState="):
            state = line.split("=", 1)[1].strip().upper()
        elif line.startswith("SubState="):
            sub = line.split("=", 1)[1].strip()
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
    if sub == "auto-restart":
        state = "RESTART-LOOP"
    return state, pid if state in RUNNING_STATES else None


def parse_service_state(output: list[str]) -> dict[str, Any]:
    """{"running", "pid", "state", "started", "started_text", "started_manager", "failed_gate",
    "launch"} from state_command's output ("started": started.sh's machine-readable header line;
    "failed_gate": the failed gate's mark, {"deploy", "at", "status"}; the texts and the mark are
    None when a file is absent or was not asked for)."""
    sections: dict[str, list[str] | None] = {"status": [], "started": None, "manager": None, "failed": None,
                                             "launch": None}
    current = "status"
    markers = {STARTED_MARKER: "started", STARTED_MANAGER_MARKER: "manager", FAILED_GATE_MARKER: "failed",
               LAUNCH_MARKER: "launch"}
    for line in output:
        if line.strip() in markers:
            current = markers[line.strip()]
            sections[current] = []
            continue
        sections[current].append(line)  # type: ignore[union-attr]

    def text(name: str) -> str | None:
        lines = sections[name]
        return "\n".join(lines) + "\n" if lines else None

    state, pid = parse_manager_status(sections["status"] or [])
    started_text = text("started")
    return {"running": state in RUNNING_STATES, "pid": pid, "state": state,
            "started": parse_meta(started_text) if started_text else None, "started_text": started_text,
            "started_manager": text("manager"), "failed_gate": _failed_gate(text("failed")), "launch": text("launch")}


def _failed_gate(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        mark = json.loads(text)
    except ValueError:
        mark = None
    return mark if isinstance(mark, dict) else {"status": text.strip()}


def failed_gate_words(mark: Mapping[str, Any]) -> str:
    """`its gate failed in deploy 1a2b3c4d at T: STATUS` of a failed gate's mark (parse_service_state)."""
    where = f" in deploy {mark['deploy']}" if mark.get("deploy") else ""
    when = f" at {mark['at']}" if mark.get("at") else ""
    return f"its gate failed{where}{when}: {fmt.short(str(mark.get('status') or 'no status'), 160)}"


# --- launch scripts ---------------------------------------------------------------------------------


def shell_lines(text: str) -> list[str]:
    """The script's lines as the shell reads them: a newline inside quotes does not end a line, so an
    export of a multi-line knob value is ONE line here (its later lines are neither template lines
    nor exports of their own). A backslash-newline still ends one (the exec line's continuations are
    read as such). One pass over the text: a 60 KB value is read once, not once per line."""
    out: list[str] = []
    start, quote, prev, i, n = 0, "", "\n", 0, len(text)
    while i < n:
        c = text[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif quote == '"':
            if c == "\\":
                i += 1
            elif c == '"':
                quote = ""
        elif c == "\n":
            out.append(text[start:i])
            start = i + 1
        elif c == "\\" and text[i + 1:i + 2] != "\n":
            i += 1
        elif c in "'\"":
            quote = c
        elif c == "#" and prev in " \t\n;&|()":  # a comment, to the end of its line (an apostrophe in it opens nothing)
            end = text.find("\n", i)
            i = (n if end < 0 else end) - 1
        prev = c
        i += 1
    if start < n:
        out.append(text[start:])
    return out


def script_knobs(text: str, names: Iterable[str] | None = None) -> dict[str, str]:
    """{name: value} a launch script exports (only `names` when given; a secret read from its file
    shows as "(secret)"). A hand-edited line is read the way the shell would read it."""
    wanted = set(names) if names is not None else None
    out: dict[str, str] = {}
    for raw in shell_lines(text):
        line = raw.strip()
        if line.startswith("export "):
            line = line[len("export "):]
        name, sep, rest = line.partition("=")
        if not sep or not ENV_NAME.fullmatch(name) or (wanted is not None and name not in wanted):
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
            out.append(f"{name}: running {fmt.quoted_if_needed(r)}, declared {fmt.quoted_if_needed(d)}")
    return out


def hand_edits(rendered_launch: str, host_launch: str | None) -> list[str] | None:
    """None when the host's launch script has the rendered body (headers aside) or is absent; else
    what differs: the exported variables (as `knob_differences`), or one line saying it was edited."""
    if host_launch is None or strip_header(host_launch) == strip_header(rendered_launch):
        return None
    diffs = knob_differences(script_knobs(rendered_launch), script_knobs(host_launch))
    return diffs or ["launch script on the host differs from the rendered one (edited by hand?)"]


# --- shell on the hosts of an inventory ---------------------------------------------------------------


def host_runner(shell: "HostShell", host: str, unreachable: Callable[[str], Exception]) -> Callable[[str], list[str]]:
    """`run(command) -> output lines` on `host` through `shell`, for a target's own client (Slurm's,
    kubectl); a host that cannot be reached raises `unreachable(why)`."""
    def run(command: str) -> list[str]:
        lines = shell.run(host, command)
        if lines is None:
            raise unreachable(shell.errors.get(host, "could not connect"))
        return lines

    return run


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
