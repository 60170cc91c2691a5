"""The emulated fleet's inventory: 2 prefill, 2 decode and 1 router host, each on its own loopback
address behind the test sshd (tests/sshd.py), each with its own root prefix (they share one
filesystem) and its own supervisord.

    write_inventory(path, fleet, hosts_root, host_extra)   # a pyinfra inventory .py file
    stack_data(host, root, wheels=[wheel])                  # host data of the knobkeeper stack
    build_wheel(dir) / deps_dir(dir) / seed_venv(prefix, deps)   # the engine, offline

Services of different hosts bind the same ports on different addresses (127.0.0.2:30000 and
127.0.0.4:30000 are different sockets), just as on real hosts.
"""

from __future__ import annotations

import pprint
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from tests.infra import FAST_ENGINE_ARGS
from tests.sshd import Fleet, loopback_addresses


@dataclass(frozen=True)
class FleetHost:
    name: str
    address: str
    role: str


ROLES = ("prefill", "decode", "router")


def fleet_of(count: int) -> tuple[FleetHost, ...]:
    """`count` hosts on 127.0.0.2 ...: one router, the rest split between prefill and decode (decode
    gets the odd one). fleet_of(5): prefill-1/2 on .2/.3, decode-1/2 on .4/.5, router-1 on .6."""
    if count < 3:
        raise ValueError(f"{count} hosts: a fleet needs at least a prefill, a decode and a router host")
    workers = count - 1
    sizes = {"prefill": workers // 2, "decode": workers - workers // 2, "router": 1}
    names = [(role, i) for role in ROLES for i in range(1, sizes[role] + 1)]
    return tuple(FleetHost(f"{role}-{i}", address, role) for (role, i), address in zip(names, loopback_addresses(count)))


FLEET: tuple[FleetHost, ...] = fleet_of(5)


def by_name(name: str) -> FleetHost:
    return next(h for h in FLEET if h.name == name)


def hosts_of(role: str) -> list[FleetHost]:
    return [h for h in FLEET if h.role == role]


def host_root(hosts_root: Path, host: FleetHost) -> Path:
    """The root prefix of one host: everything the deploy writes for it lives under here."""
    return hosts_root / host.name


HostExtra = Callable[[FleetHost, Path], Mapping[str, Any]]


def inventory_text(fleet: Fleet, hosts_root: Path, host_extra: HostExtra | None = None,
                   hosts: tuple[FleetHost, ...] = FLEET, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """Python source of a pyinfra inventory: one group per role, `(name, data)` tuples.

    Each host gets the SSH data of `fleet` plus `host_extra(host, root)` plus `overrides[name]`
    (e.g. an `ssh_hostname` that does not answer, for the unreachable-host test).
    """
    lines = [
        '"""Emulated fleet for tests: written by tests/fleet_inventory.py (do not edit)."""',
        "",
    ]
    for role in ROLES:
        entries = []
        for host in hosts:
            if host.role != role:
                continue
            root = host_root(hosts_root, host)
            data: dict[str, Any] = dict(fleet.host_data(host.address))
            if host_extra is not None:
                data.update(host_extra(host, root))
            data.update((overrides or {}).get(host.name, {}))
            entries.append((host.name, data))
        lines.append(f"{role} = {pprint.pformat(entries, width=110, sort_dicts=True)}")
        lines.append("")
    return "\n".join(lines)


def write_inventory(path: Path, fleet: Fleet, hosts_root: Path, host_extra: HostExtra | None = None,
                    hosts: tuple[FleetHost, ...] = FLEET,
                    overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(inventory_text(fleet, hosts_root, host_extra, hosts, overrides))
    for host in hosts:
        host_root(hosts_root, host).mkdir(parents=True, exist_ok=True)
    return path


# --- host data of the stack on the fleet ------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ENGINE_PYTHON = "{prefix}/venv/bin/python"


def stack_data(host: FleetHost, root: Path, wheels: list[str] | None = None, python: str = ENGINE_PYTHON) -> dict[str, Any]:
    """Host data for the knobkeeper stack on one emulated host (keys: knobkeeper/deploy/stack.py).

    Services bind the host's own address; the engine runs from a venv under the host's prefix (the
    wheel of this repo installed into it by the deploy); supervisord and supervisorctl come from
    the controller's environment (one filesystem), each host with its own config, socket and pid.
    """
    data: dict[str, Any] = {
        "prefix": str(root),
        "service_manager": "supervisord",
        "listen_host": host.address,
        "advertise_host": host.address,
        "python": python,
        "base_python": base_python(),
        "supervisord": str(BIN / "supervisord"),
        "supervisorctl": str(BIN / "supervisorctl"),
        "engines": {"prefill": "sim", "decode": "sim", "router": "sglang-router"},
        "engine_args": FAST_ENGINE_ARGS,
        "stop_timeout": 10,
    }
    if wheels is not None:
        # The engine is this repo's wheel, installed by the deploy. Its dependencies (aiohttp,
        # sglang-router, ...) are NOT pip-installed from an index here: seed_venv links them in (the
        # test shortcut; production lists them in engine_packages and pip installs them).
        data["engine_wheels"] = list(wheels)
        data["engine_packages"] = []
        data["pip_install_args"] = ["--no-index"]
    return data


def base_python() -> str:
    """The interpreter this venv was made from (same minor version, so deps_dir's packages fit)."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(exe if exe.exists() else Path(sys.base_prefix) / "bin" / "python3")


# --- the engine wheel and the hosts' venvs (offline) ------------------------------------------------


def build_wheel(out: Path, project: Path = REPO) -> Path:
    """A wheel of this repo (knobkeeper: the sim engine is what the hosts run), built offline in ~2 s.

    The source is copied first so that the build leaves nothing (build/, *.egg-info) in the repo.
    """
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        if (project / name).exists():
            shutil.copy2(project / name, src / name)
    shutil.copytree(project / "knobkeeper", src / "knobkeeper",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dist = out / "dist"
    dist.mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                           "--quiet", "-w", str(dist), str(src)], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip wheel {src} failed: {done.stderr[-2000:]}")
    [wheel] = sorted(dist.glob("knobkeeper-*.whl"))
    return wheel


def deps_dir(out: Path) -> Path:
    """A site dir of links to this environment's packages WITHOUT knobkeeper itself.

    The test shortcut for "the engine's dependencies are installed": production pip-installs them
    from an index; here a .pth in each host's venv points at this dir, so the venv resolves aiohttp,
    sglang_router, pip ... offline, while knobkeeper must come from the wheel the deploy installs
    (its editable install, dist-info and finder are left out, so pip does not see it as installed).
    """
    site = Path(sysconfig.get_paths()["purelib"])
    out.mkdir(parents=True, exist_ok=True)
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(("knobkeeper", "__editable__", "_distutils_hack", "distutils-precedence")) \
                or name == "__pycache__":
            continue
        link = out / name
        if not link.exists():
            link.symlink_to(entry)
    return out


def seed_venv(prefix: Path, deps: Path, python: str | None = None) -> Path:
    """Each host's engine venv, made without pip (0.1 s instead of ~8 s for ensurepip) and with a
    .pth pointing at deps_dir; a `bin/pip` that runs the deps' pip inside this venv. The deploy then
    finds the venv present and pip-installs the engine wheel into it (the real install operation).
    """
    venv = prefix / "venv"
    if not (venv / "bin" / "activate").exists():
        subprocess.run([python or base_python(), "-m", "venv", "--without-pip", str(venv)], check=True,
                       capture_output=True)
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "_knobkeeper_test_deps.pth").write_text(f"{deps}\n")
    pip = venv / "bin" / "pip"
    pip.write_text('#!/bin/sh\nexec "$(dirname "$0")/python" -m pip "$@"\n')
    pip.chmod(0o755)
    return venv


SGLANG_PIN = "0.5.23"


def sglang_wheelhouse(version: str = SGLANG_PIN) -> Path:
    """A folder holding the real sglang wheel (no dependencies: installed --no-deps), downloaded once
    from the package index into a cache outside the repo ($KNOBKEEPER_WHEEL_CACHE or
    ~/.cache/knobkeeper/wheels/sglang-VERSION)."""
    import os

    base = Path(os.environ.get("KNOBKEEPER_WHEEL_CACHE") or Path.home() / ".cache" / "knobkeeper" / "wheels")
    folder = base / f"sglang-{version}"
    if not list(folder.glob(f"sglang-{version}-*.whl")):
        folder.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(folder),
                               f"sglang=={version}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"pip download --no-deps sglang=={version} failed (a package index is needed once): "
                               f"{done.stderr.strip().splitlines()[-1:]}")
    return folder
