"""An emulated fleet: one real sshd (Debian openssh-server) listening on 127.0.0.2 ... 127.0.0.6
(or on N addresses from 127.0.0.2: `start_sshd(root, loopback_addresses(N))`).

Every address is a "host" that pyinfra and Ansible reach over real SSH (key-only root login, keys
generated per run). The hosts share this machine's filesystem, so each host's files live under its
own prefix (see tests/fleet_inventory.py).

    fleet = start_sshd(tmp_dir)          # plain function; fleet.stop() stops sshd by PID
    fleet.ssh("127.0.0.4", "true")       # run a command on one host over SSH
    fleet.host_data("127.0.0.4")         # pyinfra host data that connects to it

    sshd = sshd_fixture(scope="module")  # in a test module: a fixture that yields a Fleet

If sshd is missing or does not start, the fixture FAILS (pytest.fail) with the reason: the fleet
tests are part of `make test`, and CI installs openssh-server (`make system-deps`), so a missing
sshd is a broken CI, never a reason to skip.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from tests.procs import free_port, stop

SSHD = "/usr/sbin/sshd"
SSH_KEYGEN = "ssh-keygen"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"
PRIVSEP_DIR = Path("/run/sshd")


def loopback_addresses(count: int) -> tuple[str, ...]:
    """`count` emulated hosts: 127.0.0.2, 127.0.0.3, ... (the tests use 5; bench/bench_fleet.py more)."""
    if not 1 <= count <= 250:
        raise ValueError(f"{count} hosts: expected 1 to 250 (127.0.0.2 .. 127.0.0.251)")
    return tuple(f"127.0.0.{2 + i}" for i in range(count))


ADDRESSES = loopback_addresses(5)
MAX_LISTEN = 16  # sshd's MAX_LISTEN_SOCKS
USER = "root"


class SshdError(RuntimeError):
    """sshd could not be set up or started; the message says why and what to do."""


@dataclass
class Fleet:
    """A running sshd and the files a client needs to reach it."""

    root: Path
    port: int
    addresses: tuple[str, ...]
    client_key: Path
    known_hosts: Path
    config: Path
    log: Path
    proc: subprocess.Popen | None = field(default=None, repr=False)
    # sshd listens on at most 16 sockets (MAX_LISTEN_SOCKS): addresses past the 16th get another sshd.
    more: list[subprocess.Popen] = field(default_factory=list, repr=False)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def ssh_argv(self, address: str) -> list[str]:
        """argv prefix for OpenSSH's client, strict host key checking against our known_hosts."""
        return [
            "ssh", "-F", "/dev/null", "-p", str(self.port), "-i", str(self.client_key),
            "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}", "-o", "ConnectTimeout=5",
            "-o", "LogLevel=ERROR", f"{USER}@{address}",
        ]

    def ssh(self, address: str, command: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run `command` on `address` over SSH; returns the CompletedProcess (never raises on rc)."""
        return subprocess.run([*self.ssh_argv(address), command], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def host_data(self, address: str) -> dict:
        """pyinfra host data (pyinfra 3.10 `ssh_*` keys) that connects to `address` over this sshd."""
        return {
            "ssh_hostname": address,
            "ssh_port": self.port,
            "ssh_user": USER,
            "ssh_key": str(self.client_key),
            "ssh_known_hosts_file": str(self.known_hosts),
            # The host keys are written into known_hosts up front: anything else is an error.
            "ssh_strict_host_key_checking": "yes",
            # Do not try ~/.ssh/id_* or an agent (CI may have neither, a dev box may have both).
            "ssh_allow_agent": False,
            "ssh_look_for_keys": False,
        }

    def stop(self) -> None:
        """Stop sshd by PID (SIGTERM, then SIGKILL). Sessions already open end with their clients."""
        for proc in [self.proc, *self.more]:
            if proc is not None:
                stop(proc)


def free_port_on_all(addresses: tuple[str, ...] = ADDRESSES) -> int:
    """A TCP port that is free on every address (so one ListenAddress port serves them all)."""
    try:
        return free_port(*addresses)
    except OSError as exc:
        raise SshdError(str(exc)) from None


def _keygen(path: Path, comment: str) -> None:
    done = subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SshdError(f"ssh-keygen -f {path} failed: {done.stderr.strip()}")


def write_config(root: Path, port: int, addresses: tuple[str, ...], host_key: Path,
                 authorized_keys: Path, pidfile: Path, name: str = "sshd_config") -> Path:
    """sshd_config with absolute paths only (a relative -f path makes every connection fail)."""
    listen = "\n".join(f"ListenAddress {address}:{port}" for address in addresses)
    config = root / name
    (root / "home").mkdir(exist_ok=True)
    config.write_text(f"""\
# knobkeeper test fleet: loopback only, key-only root login, keys generated for this run.
{listen}
HostKey {host_key}
PidFile {pidfile}
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# The key files sit under a temp dir whose parents (/tmp) are world-writable.
StrictModes no
AllowUsers {USER}
PermitUserEnvironment no
X11Forwarding no
AllowAgentForwarding no
AllowTcpForwarding yes
PrintMotd no
UseDNS no
# The emulated hosts' root gets a home of its own: the login shell must not read this machine's
# ~/.bashrc (a dev box's pyenv/cargo set-up costs ~0.15 s per command, and it is not the host's).
SetEnv HOME={root}/home
# pyinfra and Ansible open several sessions per host at once, on up to tens of hosts.
MaxStartups 400:30:800
MaxSessions 50
LoginGraceTime 30
LogLevel INFO
Subsystem sftp {SFTP_SERVER}
""")
    return config


def _wait_ready(fleet: Fleet, timeout: float) -> None:
    """Every address accepts TCP and a real `ssh ... true` succeeds with strict host key checking."""
    deadline = time.monotonic() + timeout
    pending = list(fleet.addresses)
    last = ""
    while pending and time.monotonic() < deadline:
        for proc in [fleet.proc, *fleet.more]:
            if proc is not None and proc.poll() is not None:
                raise SshdError(f"sshd exited with {proc.returncode} during start-up:\n{_tail(fleet.log)}")
        address = pending[0]
        try:
            with socket.create_connection((address, fleet.port), timeout=1):
                pass
        except OSError as exc:
            last = f"{address}:{fleet.port}: {exc}"
            time.sleep(0.05)
            continue
        done = fleet.ssh(address, "true", timeout=15)
        if done.returncode == 0:
            pending.pop(0)
        else:
            last = f"ssh {USER}@{address} -p {fleet.port} true: exit {done.returncode}: {done.stderr.strip()}"
            time.sleep(0.1)
    if pending:
        raise SshdError(f"sshd did not accept logins on {', '.join(pending)} within {timeout}s ({last})\n"
                        f"{_tail(fleet.log)}")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "sshd log:\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no sshd log)"


def start_sshd(root: Path, addresses: tuple[str, ...] = ADDRESSES, timeout: float = 20.0) -> Fleet:
    """Generate keys, write sshd_config and known_hosts under `root`, start sshd, wait for logins.

    Raises SshdError (with the reason and the sshd log) if anything is missing or fails.
    """
    if not os.path.isfile(SSHD) or not os.access(SSHD, os.X_OK):
        raise SshdError(f"{SSHD} not found: install Debian's openssh-server (`make system-deps`, as root)")
    for tool in (SSH_KEYGEN, "ssh"):
        if shutil.which(tool) is None:
            raise SshdError(f"{tool} not found on PATH: install openssh-client (`make system-deps`)")
    if os.geteuid() != 0:
        raise SshdError("the SSH fleet tests log in as root over loopback: run them as root (CI does)")
    if not PRIVSEP_DIR.is_dir():
        # sshd refuses to start without its privilege separation directory (made by the service unit).
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "ssh_host_ed25519_key"
    client_key = root / "client_ed25519"
    _keygen(host_key, "knobkeeper-test-host")
    _keygen(client_key, "knobkeeper-test-client")
    authorized_keys = root / "authorized_keys"
    authorized_keys.write_text((root / "client_ed25519.pub").read_text())
    authorized_keys.chmod(0o600)
    host_pub = (root / "ssh_host_ed25519_key.pub").read_text().split()
    port = free_port_on_all(addresses)
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(f"[{a}]:{port} {host_pub[0]} {host_pub[1]}\n" for a in addresses))
    configs = []
    for k in range(0, len(addresses), MAX_LISTEN):
        n = k // MAX_LISTEN
        config = write_config(root, port, tuple(addresses[k:k + MAX_LISTEN]), host_key, authorized_keys,
                              root / ("sshd.pid" if n == 0 else f"sshd{n}.pid"),
                              "sshd_config" if n == 0 else f"sshd_config{n}")
        test = subprocess.run([SSHD, "-t", "-f", str(config)], capture_output=True, text=True)
        if test.returncode != 0:
            raise SshdError(f"sshd -t -f {config} rejected the config: {test.stderr.strip()}")
        configs.append(config)
    log = root / "sshd.log"
    fleet = Fleet(root=root, port=port, addresses=tuple(addresses), client_key=client_key,
                  known_hosts=known_hosts, config=configs[0], log=log)
    # -D: stay in the foreground (our child, stopped by PID); -e: log to stderr (the log file).
    with open(log, "ab") as out:
        procs = [subprocess.Popen([SSHD, "-D", "-e", "-f", str(c)], stdout=out, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True) for c in configs]
    fleet.proc, fleet.more = procs[0], procs[1:]
    try:
        _wait_ready(fleet, timeout)
    except BaseException:
        fleet.stop()
        raise
    return fleet


def sshd_fixture(scope: str = "module", addresses: tuple[str, ...] = ADDRESSES) -> Callable[..., Iterator[Fleet]]:
    """A pytest fixture (at `scope`) yielding a running Fleet; sshd is stopped by PID at teardown.

        sshd = sshd_fixture("module")   # at module level in a test file
    """

    @pytest.fixture(scope=scope)
    def _sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
        root = tmp_path_factory.mktemp("sshd")
        try:
            fleet = start_sshd(root, addresses)
        except SshdError as exc:
            pytest.fail(f"emulated SSH fleet unavailable (not skipped: CI must provide it): {exc}", pytrace=False)
        try:
            yield fleet
        finally:
            fleet.stop()

    return _sshd
