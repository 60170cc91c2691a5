"""The deploy's data model: a Stack of HostPlans, each with its Services (and, on supervisord hosts,
its own Supervisor). Plain dataclasses with the paths and URLs derived from them; built by
knobkeeper.deploy.stack from an inventory, read by every other module of the package.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from knobkeeper.deploy.topology import Role
from knobkeeper.engine import family
from knobkeeper.knobs.values import scope


@dataclass(frozen=True)
class Service:
    """One supervised process: (host, service name) is unique in a stack."""

    host: str
    role: str
    name: str
    index: int
    prefix: str
    manager: str
    engine: str
    listen_host: str
    address: str
    port: int
    bootstrap_port: int | None
    metrics_port: int | None
    health_path: str
    workers_path: str | None
    health_timeout: float
    settle: float
    user: str | None
    stop_timeout: int
    unit_dir: str
    engine_version: str | None = None  # as knobkeeper.engine.role_engine read the pin
    ports: tuple[tuple[str, int], ...] = ()  # the family's per-instance ports, e.g. (("side_channel", 5600),)

    @property
    def family(self):
        """The engine family that runs it (knobkeeper.engine)."""
        return family(self.engine)

    @property
    def key(self) -> str:
        return f"{self.host}/{self.name}"

    @property
    def group_path(self) -> str:
        """The process group of the service's last run, written by its launch script: a process still
        in it whose working folder is service_dir is what that run left (vLLM's engine core and worker
        after a kill -9 of its API server), stopped before the next start (templates/launch.sh.j2)."""
        return f"{self.service_dir}/run.pgid"

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.address in ("@local", "localhost") else self.address
        return f"http://{host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.url + self.health_path

    @property
    def workers_url(self) -> str | None:
        return self.url + self.workers_path if self.workers_path else None

    @property
    def service_dir(self) -> str:
        return f"{self.prefix}/services/{self.name}"

    @property
    def launch_path(self) -> str:
        return f"{self.service_dir}/launch.sh"

    @property
    def started_path(self) -> str:
        """A copy of the launch script taken when the service was last (re)started: what runs."""
        return f"{self.service_dir}/started.sh"

    @property
    def started_manager_path(self) -> str:
        """A copy of the program section / unit taken at the last (re)start."""
        return f"{self.service_dir}/started.{'conf' if self.manager == 'supervisord' else 'service'}"

    @property
    def previous_launch_path(self) -> str:
        """The launch script that ran before the last (re)start: what a rollback puts back."""
        return f"{self.service_dir}/previous.sh"

    @property
    def previous_manager_path(self) -> str:
        return f"{self.service_dir}/previous.{'conf' if self.manager == 'supervisord' else 'service'}"

    @property
    def failed_gate_path(self) -> str:
        """Written when a deploy stopped the service after the gate of the process it started failed
        (which deploy, when, the gate's last status); removed by the next (re)start."""
        return f"{self.service_dir}/failed-gate.json"

    @property
    def secrets_dir(self) -> str:
        return f"{self.prefix}/secrets/{self.role}"

    @property
    def supervisor_conf_path(self) -> str:
        return f"{self.prefix}/supervisor/conf.d/{self.name}.conf"

    @property
    def unit_path(self) -> str:
        return f"{self.unit_dir}/{self.name}.service"

    @property
    def log_path(self) -> str:
        return f"{self.prefix}/supervisor/logs/{self.name}.log"

    @property
    def manager_file(self) -> str:
        return self.supervisor_conf_path if self.manager == "supervisord" else self.unit_path


# Supervisor.query: the shell runs the Python of supervisorctl's shebang line (-S: no site-packages,
# -E: no PYTHON* variables) on _QUERY, or supervisorctl itself when that line names no interpreter.
_QUERY_SHELL = ('py=$(sed -n "1s/^#!//p" "$2" 2>/dev/null); '
                'if [ -n "$py" ]; then exec $py -S -E -c "$@"; fi; ctl=$2 conf=$3; shift 4; exec "$ctl" -c "$conf" "$@"')
_QUERY = """\
import os, sys, _socket
ctl, conf, sock, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]


def supervisorctl():
    sys.stdout.flush()
    os.execv(ctl, [ctl, "-c", conf] + args)


plain = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.@-")
if len(args) != 2 or args[0] not in ("pid", "status") or not args[1] or not set(args[1]) <= plain:
    supervisorctl()
name = args[1]
body = ("<?xml version='1.0'?><methodCall><methodName>supervisor.getProcessInfo</methodName><params>"
        "<param><value><string>%s</string></value></param></params></methodCall>" % name).encode()
try:
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    s.settimeout(30)
    s.connect(sock)
    s.sendall(b"POST /RPC2 HTTP/1.0\\r\\nContent-Type: text/xml\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
    chunks = []
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
    s.close()
    head, _, xml = b"".join(chunks).decode("utf-8").partition("\\r\\n\\r\\n")
except (OSError, ValueError):
    supervisorctl()
if head.split(" ")[:2] not in (["HTTP/1.0", "200"], ["HTTP/1.1", "200"]) or "<methodResponse>" not in xml \\
        or "<fault>" in xml:
    supervisorctl()
info = {}
for member in xml.split("<member>")[1:]:
    key = member.partition("<name>")[2].partition("</name>")[0]
    value = member.partition("<value>")[2].partition("</value>")[0]
    for tag in ("<int>", "<i4>", "<string>"):
        if value.startswith(tag) and value.endswith("</" + tag[1:]):
            value = value[len(tag):-len(tag) - 1]
            break
    if value == "<string/>":
        value = ""
    if "<" in value:
        supervisorctl()
    info[key] = value.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&")
try:
    pid, state, group, desc = int(info["pid"]), info["statename"], info["group"], info["description"]
except (KeyError, ValueError):
    supervisorctl()
if info.get("name") != name or state not in ("STOPPED", "STARTING", "RUNNING", "BACKOFF", "STOPPING", "EXITED",
                                             "FATAL", "UNKNOWN"):
    supervisorctl()
if args[0] == "pid":
    print(pid)
    sys.exit(7 if pid == 0 else 0)
spec = name if group == name else group + ":" + name
print(spec.ljust(max(len(spec), 30) + 3) + state.ljust(10) + desc)
sys.exit(3 if state in ("STOPPED", "EXITED", "FATAL", "UNKNOWN") else 0)
"""


@dataclass(frozen=True)
class Supervisor:
    """Paths of one host's own supervisord (everything under {prefix}/supervisor/)."""

    root: str
    supervisord: str
    supervisorctl: str

    @property
    def conf(self) -> str:
        return f"{self.root}/supervisord.conf"

    @property
    def socket(self) -> str:
        return f"{self.root}/supervisor.sock"

    @property
    def pidfile(self) -> str:
        return f"{self.root}/supervisord.pid"

    def ctl(self, *args: str) -> str:
        return shlex.join([self.supervisorctl, "-c", self.conf, *args])

    @property
    def query(self) -> str:
        """A command prefix that answers as `supervisorctl -c CONF` does: `pid NAME` and `status NAME`
        with one XML-RPC call (supervisor.getProcessInfo) on the socket, run by supervisorctl's own
        interpreter without its site-packages (_QUERY); anything else, and any answer that is not a
        plain process info (supervisord down, an unknown name, a fault, auth), by supervisorctl itself.
        supervisorctl imports all of supervisor first: 0.14 s of Python per look against 0.02 s, on
        every host of a role at once, twice per service and deploy (its state, its gate)."""
        q = shlex.quote
        return (f"sh -c {q(_QUERY_SHELL)} kk-supervisor-query {q(_QUERY)} "
                f"{q(self.supervisorctl)} {q(self.conf)} {q(self.socket)}")


@dataclass
class HostPlan:
    name: str
    prefix: str
    manager: str
    data: dict[str, Any]
    services: list[Service] = field(default_factory=list)
    supervisor: Supervisor | None = None

    @property
    def ctl(self) -> str:
        """This host's supervisorctl command prefix for looks (`pid NAME`, `status NAME`; Supervisor.query),
        '' on systemd hosts."""
        return self.supervisor.query if self.supervisor else ""

    def role_services(self, role: str) -> list[Service]:
        return [s for s in self.services if s.role == role]

    @property
    def roles(self) -> list[str]:
        out: list[str] = []
        for s in self.services:
            if s.role not in out:
                out.append(s.role)
        return out


@dataclass
class Stack:
    inventory: str  # the inventory's name (its file stem), e.g. "local"
    roles: dict[str, Role]
    order: list[str]
    hosts: dict[str, HostPlan]
    commands: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    stack: str = ""  # the stack its data names ("" : none); its knobs are knobs.toml's [stack.role] tables

    def scope(self, role: str) -> str:
        """The knobs.toml table of `role` in this stack ("decode", "vllm.decode")."""
        return scope(self.stack, role)

    @property
    def services(self) -> list[Service]:
        return [s for h in self.hosts.values() for s in h.services]

    def service(self, host: str, name: str) -> Service:
        for s in self.hosts[host].services:
            if s.name == name:
                return s
        raise KeyError((host, name))

    def command(self, service: Service) -> list[str]:
        return self.commands[(service.host, service.name)]
