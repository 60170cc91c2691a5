"""Health gates: is a service healthy, and is it the process the service manager supervises?

An answer on the port proves little on its own: a stray server holding the port answers /health
while the new process crash-loops on "address already in use". So a gate passes only when

    1. the health URL answers 200 (a router: /readiness, and /workers lists every worker healthy),
    2. the process listening on the port is the supervised PID (or one of its children), read from
       /proc on the host (`identity_command`), and
    3. for a process this run (re)started: it has been up for `settle` seconds (its age from /proc)
       and is then still the same PID, listening, healthy (a restart loop changes the PID). While it
       is not up yet, a service manager that gave up on it (supervisord FATAL, a failed unit) fails
       the gate at once, with the program log's last lines, and so does a start-up whose own log
       says it can never finish (the engine family's `stuck_start`: vLLM waiting forever for a
       listener whose port was taken).

The settle can be waited out at once (`wait_gate`) or later (`wait_gate(..., defer=True)` returns a
`Settling` to hand to `settled()`): the deploy lets the next independent work (the gates of roles
downstream that it does not restart, the record's preparation) proceed meanwhile, and settles every
pending process before it restarts anything else and before it writes the record, so nothing
downstream is restarted and no run reports success before each new process stayed up.

Waits say what they wait for: a line on stderr every few seconds ("knobkeeper: waiting for decode
127.0.0.1:30001 /health (12 s of 900 s): last status no answer").

`require_up` is the seconds-long check a partial deploy (only=ROLE, `ab run`, canary) makes first:
every role it does not restart must already be up, else it says which deploy to run.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable, Iterable

from knobkeeper import fmt
from knobkeeper.deploy.model import Service, Stack
from knobkeeper.deploy.observe import manager_status_command, parse_manager_status
from knobkeeper.deploy.onhost import RunOnHost, say as say_line
from knobkeeper.engine.routers import workers_healthy
from knobkeeper.deploy.topology import downstream
from knobkeeper.errors import UserError

POLL_S = 0.1
# While a restarted service is not up yet, how soon and how often the gate asks its manager whether
# it gave up on it: each look starts a supervisorctl (a Python process), too dear to make ten times a
# second on every host of a role at once while their engines start; a start that fails is told
# within seconds all the same (supervisord itself needs about as long to give up).
GAVE_UP_FIRST_S = 3.0
GAVE_UP_EVERY_S = 3.0
QUIET_S = 5.0  # a wait shorter than this prints nothing
PROGRESS_EVERY_S = 10.0
IDENTITY_MARKER = "knobkeeper-identity"

def probe(url: str, timeout: float = 2.0) -> tuple[int | None, str, bytes]:
    """(HTTP status or None, words for it, body)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, str(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, f"HTTP {exc.code}", exc.read() if exc.fp else b""
    except OSError as exc:
        reason = getattr(exc, "reason", exc)
        return None, f"no answer ({reason})", b""


def healthy_now(svc: Service, expected_workers: int) -> tuple[bool, str]:
    """One look at the service's health URL (and a router's /workers)."""
    code, last, _ = probe(svc.health_url)
    if code != 200:
        return False, last
    if not svc.workers_url:
        return True, last
    wcode, wlast, body = probe(svc.workers_url)
    return workers_healthy(body, expected_workers, svc.engine) if wcode == 200 else (False, f"workers: {wlast}")


# --- which process answers ----------------------------------------------------------------------------


def _listen_pattern(svc: Service, port_number: int | None = None) -> str:
    """The /proc/net/tcp{,6} local_address (hex, the IPv4 address little-endian) of a socket that
    holds the service's port: on its listen address or on the any-address. Matching the port alone
    would take another host's service for a stray where several hosts share one kernel (loopback
    addresses 127.0.0.2-6 in the fleet tests, containers with host networking): 127.0.0.2:30000 and
    127.0.0.3:30000 do not conflict. A service listening on 0.0.0.0 (or a name) conflicts with any."""
    port = f"{port_number or svc.port:04X}"
    try:
        address = ipaddress.IPv4Address(svc.listen_host)
    except ValueError:
        return f":{port}$"
    if address.is_unspecified:
        return f":{port}$"
    mine = f"{int.from_bytes(address.packed, 'little'):08X}"
    any6, mapped6 = "0" * 32, "0000000000000000FFFF0000" + mine
    return f"^({mine}|00000000|{any6}|{mapped6}):{port}$"


def identity_command(svc: Service, ctl: str, ports: Iterable[int] = (), pid: str | None = None) -> str:
    """Shell printing, for the service's port and each of `ports` (its family's per-instance ports),
    `knobkeeper-identity port=N pid=P holder=yes|no listening=yes|no age=S`: the supervised PID,
    whether it (or a child) holds a socket LISTENing on that port, whether anything does, and how
    many seconds that process has been running. One service-manager call and one `ls` of each
    process's fds for all of them: a readlink process per fd took 1.03 s against 0.19 s now for a
    process holding 300 sockets (medians of 5, a loaded 2-core machine), and a vLLM server has hundreds.
    `pid`: the shell that prints the supervised PID (default: ask the service manager)."""
    q = shlex.quote
    if pid is not None:
        pass
    elif svc.manager == "supervisord":
        pid = f"{ctl} pid {q(svc.name)} 2>/dev/null"
    else:
        pid = f"systemctl show -p MainPID --value {q(svc.name)}.service 2>/dev/null"
    shell = (
        f"pid=$({pid}); case \"$pid\" in ''|*[!0-9]*) pid=0;; esac; links=; "
        # `read`, a builtin: no process for it, on every host of a role at once
        "age=0; if [ \"$pid\" != 0 ] && read -r stat 2>/dev/null < /proc/$pid/stat; then "
        "set -- ${stat##*) }; age=$(awk -v t=\"${20}\" -v hz=\"$(getconf CLK_TCK)\" "
        "'{printf \"%.2f\", $1 - t / hz}' /proc/uptime); fi; "
    )
    # a holder that is what the service's last run left: in that run's group and working folder (the
    # launch script's rule, templates/launch.sh.j2)
    leftover = (f"g=$(cat {q(svc.group_path)} 2>/dev/null); read -r line < /proc/$other/stat 2>/dev/null; "
                f"set -- ${{line##*) }}; [ -n \"$g\" ] && [ \"$3\" = \"$g\" ] && "
                f"[ \"$(readlink /proc/$other/cwd 2>/dev/null)\" = {q(svc.service_dir)} ] && left=yes; ")
    for port in dict.fromkeys([svc.port, *ports]):
        shell += (
            f"inodes=$(awk '$4 == \"0A\" && $2 ~ /{_listen_pattern(svc, port)}/ {{print $10}}' /proc/net/tcp /proc/net/tcp6 2>/dev/null); "
            "holder=no; "
            "if [ \"$pid\" != 0 ] && [ -n \"$inodes\" ]; then "
            "[ -n \"$links\" ] || links=$(for p in $pid $(cat /proc/$pid/task/*/children 2>/dev/null); do "
            "ls -l /proc/$p/fd/ 2>/dev/null; done); "
            "for i in $inodes; do case \"$links\" in *\"socket:[$i]\"*) holder=yes;; esac; done; fi; "
            # Another process holds it: which (one `find` over every process's fds, only on this
            # path), and whether it is what the last run of this service left.
            "other=0; left=no; cmd=; if [ \"$holder\" = no ] && [ -n \"$inodes\" ]; then "
            "for i in $inodes; do other=$(find /proc/[0-9]*/fd -lname \"socket:\\[$i\\]\" 2>/dev/null "
            "| head -n 1 | cut -d/ -f3); [ -n \"$other\" ] && break; done; other=${other:-0}; "
            f"if [ \"$other\" != 0 ]; then {leftover}"
            "cmd=$(tr '\\0' ' ' < /proc/$other/cmdline 2>/dev/null | cut -c1-100); fi; fi; "
            f"echo \"{IDENTITY_MARKER} port={port} pid=$pid holder=$holder "
            "listening=$([ -n \"$inodes\" ] && echo yes || echo no) age=$age other=$other leftover=$left\"; "
            f"[ -z \"$cmd\" ] || echo \"{IDENTITY_MARKER}-cmd port={port} $cmd\"; "
        )
    return shell


@dataclass(frozen=True)
class Identity:
    pid: int | None
    holder: bool
    listening: bool
    age: float = 0.0
    other: int | None = None       # the process that holds the port when it is not the supervised one
    other_command: str = ""        # its command line (the first 100 characters)
    leftover: bool = False         # `other` is what the service's last run left (its group and folder)

    def holder_words(self) -> str:
        """Who holds the port: "pid 4242 (VLLM::EngineCore), left over from an earlier run of it"."""
        if self.other is None:
            return "another process (its PID could not be read)"
        command = f" ({self.other_command})" if self.other_command else ""
        return f"pid {self.other}{command}" + (", left over from an earlier run of it" if self.leftover else "")

    def problem(self, svc: Service) -> str | None:
        """Words for why the answer on the port is not the supervised process's, or None."""
        if self.listening and not self.holder:
            whose = f"pid {self.pid}" if self.pid else "not running"
            return f"port {svc.port} answers, but not from {svc.name} ({whose}): {self.holder_words()} holds the port (stop it)"
        if self.pid is None:
            return f"{svc.name} is not running under its service manager (crash loop?)"
        if not self.listening:
            return f"{svc.name} (pid {self.pid}) runs, but nothing listens on port {svc.port}"
        return None

    @property
    def stray(self) -> bool:
        """Something other than the supervised process listens on the port: waiting cannot help."""
        return self.listening and not self.holder


def parse_identity(lines: Iterable[str], port: int | None = None) -> Identity:
    """The identity on `port` (default: the first line, the service's own port)."""
    lines = list(lines)
    for line in lines:
        if line.startswith(IDENTITY_MARKER + " "):
            fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
            if port is not None and fields.get("port") != str(port):
                continue
            try:
                age = float(fields.get("age", "0"))
            except ValueError:
                age = 0.0
            command = next((line.split(" ", 2)[2] for line in lines if line.startswith(f"{IDENTITY_MARKER}-cmd ")
                            and line.split(" ", 2)[1] == f"port={fields.get('port')}" and line.count(" ") >= 2), "")
            return Identity(_pid(fields.get("pid")), fields.get("holder") == "yes", fields.get("listening") == "yes",
                            age, other=_pid(fields.get("other")), other_command=command.strip(),
                            leftover=fields.get("leftover") == "yes")
    return Identity(None, False, False)


def _pid(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() and text != "0" else None


# --- the gate -------------------------------------------------------------------------------------------


@dataclass
class GateOutcome:
    ok: bool
    status: str
    pid: int | None = None


@dataclass
class Settling:
    """A (re)started process that answered healthy as the supervised PID, but has not been up for
    its settle time yet: `settled()` waits out the rest and looks again."""

    svc: Service
    pid: int
    due: float            # time.monotonic() when it has been up `settle` seconds
    deadline: float       # the gate's timeout, as time.monotonic()
    settle: float
    status: str           # the health answer seen


# What a service manager says once it has given up starting a program (supervisord after its
# startretries; systemd after its restart limit).
GAVE_UP = ("FATAL", "FAILED")


def gave_up(svc: Service, ctl: str, run_on_host: RunOnHost, seen: dict | None = None) -> str | None:
    """Words for a service its manager gave up starting, with the program log's last lines; None
    while it is still starting (or running).

    `seen` (the caller's dict, kept across looks) catches an engine that crashes during its
    start-up AFTER the manager counted it as started (vLLM dies 10-60 s into loading a broken model,
    long past supervisord's startsecs): supervisord restarts it, forever, and never says FATAL.
    A process seen RUNNING whose PID is then gone or another has crashed. One that lives on but whose
    own log says it can never finish starting (`stuck_start`) fails too: waiting cannot help."""
    state, pid = parse_manager_status(run_on_host(manager_status_command(svc, ctl)))
    crashed = before = None
    if seen is not None:
        before = seen.get("running_pid")
        if before is not None and pid != before:
            crashed = f"crashed during start-up (pid {before} exited" + (f", restarted as {pid})" if pid else ")")
        if state == "RUNNING" and pid is not None:
            seen["running_pid"] = pid
    where = log_where(svc)
    if state not in GAVE_UP and crashed is None:
        stuck = stuck_start(svc, pid, run_on_host)
        return f"{svc.name} (pid {pid}) cannot finish its start-up: {stuck}; see {where}" if stuck else None
    said = log_says(svc, before if crashed else pid, run_on_host)
    if crashed:
        return f"{svc.name} {crashed}; {said}"
    return f"{svc.name} did not stay up ({state.lower()}); {said}"


def log_where(svc: Service) -> str:
    return svc.log_path if svc.manager == "supervisord" else f"journalctl -u {svc.name}.service"


def _log_tail(svc: Service, lines: int) -> str:
    if svc.manager == "supervisord":
        return f"tail -n {lines} {shlex.quote(svc.log_path)}"
    return f"journalctl -u {shlex.quote(svc.name)}.service -n {lines} --no-pager"


STUCK_LOOK_LINES = 400
# The line a Python traceback ends with ("OSError: /m/config.json is not a valid JSON file"), bare or
# behind an engine's line prefix ("(EngineCore_DP0 pid=12) ", "[rank0]: ").
_EXCEPTION = re.compile(r"(?:^|[)\]]:? )(?P<line>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?:: .+)?)$")
_QUOTE_CHARS = 240


def own_lines(svc: Service, pid: int | None, run_on_host: RunOnHost, count: int = STUCK_LOOK_LINES) -> list[str]:
    """The log lines of the process `pid` of `svc` (from the first its family's `start_marker` names it
    on, within the log's last `count` lines); of the last process the log shows when `pid` is None or
    not in it; the last `count` lines when the family marks no lines."""
    lines = run_on_host(f"{_log_tail(svc, count)} 2>&1")
    marker = svc.family.start_marker
    if marker is None:
        return lines
    mine = _from_marker(lines, marker, pid)
    if mine is not None:
        return mine
    head, _, tail = marker.partition("{pid}")
    found = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))
    starts: dict[str, int] = {}
    for i, line in enumerate(lines):
        seen = found.search(line)
        if seen:
            starts.setdefault(seen.group(1), i)
    return lines[max(starts.values()):] if starts else lines


def log_says(svc: Service, pid: int | None, run_on_host: RunOnHost) -> str:
    """What the process's own log says went wrong, in one line: each of its processes that died and
    how (the family's `deaths`: "VllmWorker-0 died of SIGILL (illegal instruction)"), the exception
    a traceback ended with (the first: the root cause of a chain; the last too when it differs),
    else its last lines; and where the whole log is."""
    lines = [line.rstrip() for line in own_lines(svc, pid, run_on_host)]
    deaths = svc.family.deaths(lines)
    exceptions = [m.group("line") for m in map(_EXCEPTION.search, lines) if m]
    parts = []
    if deaths:
        parts.append("; ".join(deaths))
    if exceptions:
        quoted = [exceptions[0]] + ([exceptions[-1]] if exceptions[-1] != exceptions[0] else [])
        parts.append(" ... ".join(f"\"{fmt.short(e, _QUOTE_CHARS)}\"" for e in quoted))
    if not parts:
        tail = " ".join(line.strip() for line in lines[-5:] if line.strip())
        return f"{log_where(svc)} ends: {fmt.short(tail, 3 * _QUOTE_CHARS) or '(nothing)'}"
    return f"its log says: {'; '.join(parts)} (see {log_where(svc)})"


def stuck_start(svc: Service, pid: int | None, run_on_host: RunOnHost) -> str | None:
    """The family's words for a start-up that its log says can never finish (its `stuck_start`),
    read from this process's own lines only (from the first line its `start_marker` names this PID
    on, within the log's last STUCK_LOOK_LINES): an earlier process's failure in the same log is not
    this one's. None for a family that reads no log, before the PID is known, or while all is well."""
    family = svc.family
    if pid is None or family.start_marker is None:
        return None
    mine = _from_marker(run_on_host(f"{_log_tail(svc, STUCK_LOOK_LINES)} 2>&1"), family.start_marker, pid)
    return None if mine is None else family.stuck_start(mine, svc)


def _from_marker(lines: list[str], marker: str, pid: int | None) -> list[str] | None:
    """`lines` from the first that `marker` names `pid` on; None when none does (or no pid)."""
    if pid is None:
        return None
    first = next((i for i, line in enumerate(lines) if marker.format(pid=pid) in line), None)
    return None if first is None else lines[first:]


def wait_gate(svc: Service, expected_workers: int, timeout: float, run_on_host: RunOnHost, ctl: str, *,
              settle: float = 0.0, say: Callable[[str], None] = say_line, restarted: bool = False,
              defer: bool = False, identity: list[str] | None = None) -> GateOutcome | Settling:
    """Wait (up to `timeout` s) until `svc` is healthy and it is the supervised process that answers;
    with `settle`, also until it stayed so (same PID) for that long: waited out here, or with `defer`
    returned as a Settling for `settled()` (when some of it is left). `restarted`: this run started
    the process (its manager giving up on it fails the gate at once, not at the timeout).
    `identity`: identity_command's lines read on the host just before (with the service's state, in
    the same command): the first look takes them with its health answer instead of asking the host
    again; every later look asks again."""
    started = time.monotonic()
    deadline = started + timeout
    next_say = started + QUIET_S
    next_start_check = started + GAVE_UP_FIRST_S
    what = f"{svc.role} {svc.url.split('//', 1)[1]} {svc.health_path}"
    last = "not checked"
    seen: dict = {}
    while True:
        given, identity = identity, None
        ok, last = healthy_now(svc, expected_workers)
        now = time.monotonic()
        if ok:
            ident = parse_identity(given if given is not None else run_on_host(identity_command(svc, ctl)))
            problem = ident.problem(svc)
            if ident.stray:
                return GateOutcome(False, problem or "", ident.pid)
            if problem is None:
                if ident.age >= settle:
                    return GateOutcome(True, last, ident.pid)
                rest = settle - ident.age
                pending = Settling(svc, ident.pid, time.monotonic() + rest, deadline, settle, last)
                if defer:
                    return pending
                if rest >= QUIET_S:
                    say(f"{what}: healthy (pid {ident.pid}); settling {rest:.0f} s")
                return settled(pending, expected_workers, run_on_host, ctl)
            last = problem
        elif restarted and now >= next_start_check:   # not up yet: has its manager given up on it?
            next_start_check = now + GAVE_UP_EVERY_S
            failed = gave_up(svc, ctl, run_on_host, seen)
            if failed:
                return GateOutcome(False, failed)
        if now >= deadline:
            return GateOutcome(False, last)
        if now >= next_say:
            say(f"waiting for {what} ({now - started:.0f} s of {timeout:g} s): last status {last}")
            next_say = now + PROGRESS_EVERY_S
        time.sleep(POLL_S)


def settled(pending: Settling, expected_workers: int, run_on_host: RunOnHost, ctl: str) -> GateOutcome:
    """Wait until the pending process has been up its settle time, then look again: still the same
    PID and listening (else it failed), and healthy (polled up to the gate's timeout)."""
    svc = pending.svc
    time.sleep(max(0.0, pending.due - time.monotonic()))
    while True:
        again = parse_identity(run_on_host(identity_command(svc, ctl)))
        still, status = healthy_now(svc, expected_workers)
        if again.pid != pending.pid:
            return GateOutcome(False, f"restart loop: pid {pending.pid} -> {again.pid} within {pending.settle:g} s",
                               again.pid)
        later = again.problem(svc)
        if later:
            return GateOutcome(False, later, again.pid)
        if still:
            return GateOutcome(True, status, again.pid)
        if time.monotonic() >= pending.deadline:
            return GateOutcome(False, status, again.pid)
        time.sleep(POLL_S)


# --- before a partial deploy ----------------------------------------------------------------------------


def require_up(stack: Stack, scope: Iterable[str], inventory_path: str) -> None:
    """Refuse (one line) when a role this run does not restart is not up right now. A role the
    scope starts after must be healthy; a role downstream of the scope (gated again after the
    restart, judged by its own gate then) must at least be running: answer on its port."""
    scope = list(scope)
    later = downstream(stack.order, stack.roles, scope)
    for role in (r for r in stack.order if r not in scope):
        for svc in (s for s in stack.services if s.role == role):
            code, status, _ = probe(svc.health_url)
            if code is None:
                problem = "is not running"
            elif code != 200 and role not in later:
                problem = "is not healthy"
            else:
                continue
            raise UserError(f"the {role} {problem} ({svc.key}, {svc.health_url}: {status}): "
                            f"run `knobkeeper deploy {inventory_path}` first")
