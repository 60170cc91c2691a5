"""Run bench/ansible/deploy.yml against the emulated SSH fleet (tests/sshd.py): write its inventory,
ansible.cfg and environment under a work dir, run playbooks, stop what it started.

    side = AnsibleSide(work, fleet, hosts_root, wheel)   # inventory + ansible.cfg under work/
    side.setup()                                   # untimed: each host's own supervisord
    side.deploy(knobs={"decode": {...}})           # one timed `ansible-playbook deploy.yml`
    side.stop()                                    # supervisords by PID, SSH control masters

The Ansible side binds its own ports (31000...) so that it can run next to knobkeeper's stack
(30000...) on the same five hosts. Each host's venv under its prefix is seeded as the tests seed
knobkeeper's (tests/fleet_inventory.seed_venv: dependencies linked in, offline); the playbook installs
the engine wheel into it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fleet_inventory import FLEET, ROLES, FleetHost  # noqa: E402
from tests.procs import stop_pid  # noqa: E402
from tests.sshd import Fleet  # noqa: E402

BIN = Path(sys.executable).parent
PORTS = {"prefill_port": 31000, "prefill_bootstrap_port": 9998, "decode_port": 31001,
         "router_port": 31080, "router_metrics_port": 30180}
TARGET_PYTHON = "/usr/bin/python3"  # the hosts' own Python for Ansible's modules (Debian's)


class AnsibleSide:
    def __init__(self, work: Path, fleet: Fleet, hosts_root: Path, wheel: Path,
                 engine_args: Mapping[str, list[str]] | None = None, hosts: tuple[FleetHost, ...] = FLEET) -> None:
        self.work = work
        self.fleet = fleet
        self.hosts_root = hosts_root
        self.hosts = hosts
        self.wheel = wheel
        self.engine_args = dict(engine_args or {})
        work.mkdir(parents=True, exist_ok=True)
        self.inventory = work / "inventory.json"
        self.cfg = work / "ansible.cfg"
        self._write()

    def prefix(self, host: FleetHost) -> Path:
        return self.hosts_root / host.name

    def _write(self) -> None:
        groups: dict[str, Any] = {}
        for role in ROLES:
            members = {}
            for host in self.hosts:
                if host.role == role:
                    members[host.name] = {"ansible_host": host.address, "listen_host": host.address,
                                          "prefix": str(self.prefix(host)),
                                          "python": str(self.prefix(host) / "venv" / "bin" / "python")}
            groups[role] = {"hosts": members}
        inventory = {"all": {
            "vars": {
                "ansible_user": "root", "ansible_port": self.fleet.port,
                "ansible_ssh_private_key_file": str(self.fleet.client_key),
                "ansible_python_interpreter": TARGET_PYTHON,
                "engine_wheel": str(self.wheel), "supervisord": str(BIN / "supervisord"),
                "supervisorctl": str(BIN / "supervisorctl"), "stop_timeout": 10,
                "engine_args": {r: self.engine_args.get(r, []) for r in ROLES},
                "knobs": {r: {} for r in ROLES}, **PORTS,
            },
            "children": groups,
        }}
        self.inventory.write_text(json.dumps(inventory, indent=2))
        (self.work / "cp").mkdir(exist_ok=True)
        (self.work / "tmp").mkdir(exist_ok=True)
        # Ansible's defaults (ControlPersist=60s, no pipelining) plus pipelining, which Ansible's own
        # docs recommend for speed, and forks = the number of hosts (every host at once, as pyinfra); host keys checked against the fleet's known_hosts, as pyinfra does.
        ssh_args = (f"-F /dev/null -o ControlMaster=auto -o ControlPersist=60s -o IdentitiesOnly=yes "
                    f"-o UserKnownHostsFile={self.fleet.known_hosts} -o StrictHostKeyChecking=yes")
        self.cfg.write_text(f"""\
[defaults]
inventory = {self.inventory}
forks = {len(self.hosts)}
host_key_checking = True
interpreter_python = {TARGET_PYTHON}
local_tmp = {self.work}/tmp
remote_tmp = /tmp/.ansible-kk-bench
retry_files_enabled = False
deprecation_warnings = False
gathering = explicit

[ssh_connection]
pipelining = True
ssh_args = {ssh_args}
control_path_dir = {self.work}/cp
control_path = %(directory)s/%%h-%%p-%%r
""")

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(ANSIBLE_CONFIG=str(self.cfg), ANSIBLE_HOME=str(self.work / "home"),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
        env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
        return env

    def playbook(self, name: str, extra: Mapping[str, Any] | None = None, check: bool = True,
                 args: list[str] | None = None) -> subprocess.CompletedProcess:
        cmd = [str(BIN / "ansible-playbook"), str(HERE / name)]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        cmd += list(args or [])
        done = subprocess.run(cmd, cwd=self.work, env=self.env(), capture_output=True, text=True)
        if check and done.returncode != 0:
            raise RuntimeError(f"ansible-playbook {name} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
        return done

    def setup(self) -> None:
        self.playbook("setup.yml")

    def deploy(self, knobs: Mapping[str, Mapping[str, Any]] | None = None, batch: int | None = None) -> float:
        """One `ansible-playbook deploy.yml` run; returns its wall seconds."""
        extra: dict[str, Any] = {"knobs": {r: dict((knobs or {}).get(r, {})) for r in ROLES}}
        if batch:
            extra["batch"] = batch
        start = time.perf_counter()
        self.playbook("deploy.yml", extra)
        return time.perf_counter() - start

    def stop(self) -> None:
        """Stop each host's supervisord by PID (its programs stop with it) and the SSH masters."""
        for host in self.hosts:
            pidfile = self.prefix(host) / "supervisor" / "supervisord.pid"
            if pidfile.is_file():
                try:
                    stop_pid(int(pidfile.read_text().strip()), timeout=30)
                except ValueError:
                    pass
            subprocess.run(["ssh", "-F", "/dev/null", "-o", f"ControlPath={self.work}/cp/%h-%p-%r",
                            "-p", str(self.fleet.port), "-O", "exit", f"root@{host.address}"],
                           capture_output=True, timeout=10)
