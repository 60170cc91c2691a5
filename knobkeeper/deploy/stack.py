"""The stack an inventory describes: hosts, roles in deploy order, and every (host, service) with its
ports, paths and engine command. Built from a pyinfra Inventory, so deploy.py (inside pyinfra),
`status`, `review` and `check` (outside it) see the same services.

Data keys (host data > group data > group_data/all.py; `--data` wins over all):

    prefix            root of everything the stack puts on the host (launch scripts, secrets,
                      supervisord, venv); each host its own. Local: <repo>/.knobkeeper-state/local
    service_manager   "supervisord" (local stack) | "systemd" (production) | "slurm" | "kubernetes" (the
                      stack's own deploy target: deploy/slurm/job.py, deploy/kube/settings.py say its data)
    stack             the stack this inventory belongs to ("" / absent: the unnamed one); its knobs are
                      knobs.toml's [STACK.ROLE] tables (knobkeeper/knobs/__init__.py)
    engines           {role: "ENGINE" or "ENGINE==VERSION"}, ENGINE one of knobkeeper.engine's families
                      (sim, sglang, vllm, smg, sglang-router, vllm-router); read by role_engine
    engine_args       {role: [extra command-line arguments]} appended to the engine command
    python            interpreter for sim / router ("{prefix}" is expanded); production: the venv's
    listen_host       address services bind (default 0.0.0.0)
    advertise_host    address other hosts use to reach this one (default: ssh_hostname or host name)
    <role>_port       port of the role's first service (the n-th service of a role on a host: +n)
    <role>_workers    how many services of the role this host runs (default: the role's `services`);
                      more than the role names get the first name with -2, -3, ... appended
                      (decode_workers = 2: knobkeeper-decode, knobkeeper-decode-2 on ports base, base+1)
    prefill_bootstrap_port, router_metrics_port
    <role>_<port>_port   a family's per-instance ports (vLLM: <role>_side_channel_port, its NIXL
                      side channel), +n for the n-th service of the role on a host like <role>_port
    served_model_name, model, transfer_backend, tp_size, router_policy, kv_connector, kv_buffer_device
    sglang_version, vllm_version, sglang_router_version, smg_version, vllm_router_version
                      the engine's version where engines[role] does not say ==VERSION (the pin goes
                      into the venv: engine_packages overrides; engine_wheelhouse / engine_index:
                      where pip gets it; see operations.engine)
    knob_defaults     {role: {KNOB: value}}: the knobs' values on this inventory's hosts where
                      knobs.toml declares none (a declared value and a run's override win; deploy/render.py)
    engine_root       where the engine's cached environments live (vLLM's CPU build: engine/vllm_install.py;
                      "{prefix}" expanded); with it the deploy's engine step builds them, not a venv
    tiny_model_seed   build the tiny model (a stand-in for your model) into `model` when absent (local host)
    vllm_cache_root   each vLLM instance's VLLM_CACHE_ROOT ("{prefix}", "{service}" expanded)
    environment       {NAME: value} fixed, non-knob environment of every service (NAME: a plain
                      variable name, knobs.catalog.check_env_name)
    service_user      systemd User= (optional); systemd_unit_dir (default /etc/systemd/system)
    stop_timeout      seconds a stop may take before SIGKILL (default 60)
    health_timeout    overrides every role's health_timeout (seconds) for this run
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from knobkeeper.deploy.engines import engine_command, workers_of
from knobkeeper.deploy.model import HostPlan, Service, Stack, Supervisor
from knobkeeper.deploy.target import TARGETS, target_of
from knobkeeper.deploy.topology import ROLE_PREFIX, Role, deploy_order, role_from_data
from knobkeeper.engine import SIM, role_engine
from knobkeeper.engine.pins import stack_of
from knobkeeper.errors import UserError, code_error
from knobkeeper.knobs.values import check_env_name

# supervisord and systemd: a service per process on each host; the others are deploy targets of their
# own (deploy/target.py TARGETS: slurm, kubernetes).
MANAGERS = ("supervisord", "systemd", *TARGETS)
WORKER_MODES = ("prefill", "decode")

__all__ = ["HostPlan", "Service", "Stack", "Supervisor", "host_plan", "load_inventory", "load_stack",
           "stack_from_inventory"]


def _get(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = data.get(key, default)
    return default if value is None else value


def _port(host: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise UserError(f"host {host}: data {key} = {value!r}: expected a port number (1-65535)")
    return value


def host_plan(name: str, data: Mapping[str, Any], groups: list[str], roles: Mapping[str, Role],
              inventory: str = "") -> HostPlan:
    where = f"inventory {inventory}, host {name}" if inventory else f"host {name}"
    prefix = data.get("prefix")
    if not isinstance(prefix, str) or not prefix.startswith("/") or any(c.isspace() for c in prefix):
        raise UserError(f"host {name}: data prefix = {prefix!r}: expected an absolute path without spaces")
    prefix = prefix.rstrip("/") or "/"
    manager = _get(data, "service_manager", "systemd")
    if manager not in MANAGERS:
        raise UserError(f"host {name}: data service_manager = {manager!r}: expected one of {', '.join(MANAGERS)}")
    engines = _get(data, "engines", {})
    engine_args = _get(data, "engine_args", {})
    stack_of(data, where)
    if not isinstance(engines, Mapping) or not isinstance(engine_args, Mapping):
        raise UserError(f"host {name}: data engines / engine_args: expected dicts keyed by role")
    environment = _get(data, "environment", {})
    if not isinstance(environment, Mapping):
        raise UserError(f"{where}: data environment: expected a dict of NAME: value")
    for env_name in environment:
        # A name reaches the launch script as `export NAME=...`: only a plain variable name may.
        check_env_name(env_name, f"{where}: data environment")
    listen = str(_get(data, "listen_host", "0.0.0.0"))
    address = str(_get(data, "advertise_host", data.get("ssh_hostname") or name))
    if address == "@local":
        address = "127.0.0.1"
    timeout_override = data.get("health_timeout")
    plan = HostPlan(name=name, prefix=prefix, manager=manager, data=dict(data))
    if manager == "supervisord":
        bindir = str(Path(SIM.interpreter(data, prefix)).parent)
        plan.supervisor = Supervisor(
            root=f"{prefix}/supervisor",
            supervisord=str(_get(data, "supervisord", f"{bindir}/supervisord")),
            supervisorctl=str(_get(data, "supervisorctl", f"{bindir}/supervisorctl")),
        )
        if len(plan.supervisor.socket) > 100:
            raise UserError(f"host {name}: {plan.supervisor.socket}: a unix socket path must be under 100 "
                            "characters; use a shorter prefix")
    for role_name in [g for g in groups if g in roles]:
        role = roles[role_name]
        pin = role_engine(data, role_name, f"host {name}")
        if pin is None:
            raise UserError(f"host {name}: data engines[{role_name!r}]: missing; expected the engine the role runs "
                            f"(e.g. 'vllm==0.32.0'; engines: sim, sglang, vllm, smg, sglang-router, vllm-router)")
        fam = pin.family
        if fam.kind == "worker" and role_name not in WORKER_MODES:
            raise UserError(f"host {name}: role {role_name!r} runs engine {fam.name!r}, which needs the role to be "
                            f"prefill or decode (its disaggregation mode)")
        base = _port(name, f"{role_name}_port", data.get(f"{role_name}_port"))
        for index, svc in enumerate(service_names(role, data, where)):
            bootstrap = metrics = None
            if role_name == "prefill" and fam.uses_bootstrap:
                bootstrap = _port(name, "prefill_bootstrap_port", data.get("prefill_bootstrap_port")) + index
            if fam.kind == "router":
                metrics = _port(name, f"{role_name}_metrics_port", data.get(f"{role_name}_metrics_port")) + index
            ports = tuple((p, _port(name, f"{role_name}_{p}_port", data.get(f"{role_name}_{p}_port")) + index)
                          for p in fam.instance_ports)
            timeout = float(timeout_override) if timeout_override else role.health_timeout
            plan.services.append(Service(
                host=name, role=role_name, name=svc, index=index, prefix=prefix, manager=manager,
                engine=fam.name, listen_host=listen, address=address, port=base + index,
                bootstrap_port=bootstrap, metrics_port=metrics, health_path=role.health or fam.endpoints.readiness,
                workers_path=role.workers, health_timeout=timeout, settle=role.settle,
                user=data.get("service_user"),
                stop_timeout=int(_get(data, "stop_timeout", 60)),
                unit_dir=str(_get(data, "systemd_unit_dir", "/etc/systemd/system")),
                engine_version=pin.version, ports=ports,
            ))
    return plan


def service_names(role: Role, data: Mapping[str, Any], where: str) -> tuple[str, ...]:
    """The role's services on one host: the role's own list, extended to `<role>_workers` of them
    (the first name with -2, -3, ... appended), so a worker count never restates a service name."""
    key = f"{role.name}_workers"
    count = data.get(key)
    if count is None:
        return role.services
    if isinstance(count, str) and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or count < len(role.services):
        raise UserError(f"{where}: data {key} = {count!r}: expected a whole number of at least "
                        f"{len(role.services)} (role_{role.name} names {', '.join(role.services)})")
    first = role.services[0]
    return role.services + tuple(f"{first}-{n}" for n in range(len(role.services) + 1, count + 1))


def stack_from_inventory(inventory: Any, name: str) -> Stack:
    """A Stack from a pyinfra Inventory (inside deploy.py or from load_inventory)."""
    roles: dict[str, Role] = {}
    members: dict[str, list[str]] = {}
    hosts = list(inventory)
    for host in hosts:
        data = _host_data(host)
        for group in dict.fromkeys(host.groups):
            spec = data.get(f"{ROLE_PREFIX}{group}")
            if spec is None:
                continue
            role = role_from_data(group, spec, where=f"host {host.name}")
            if group in roles and roles[group] != role:
                raise UserError(f"role {group}: hosts disagree on role_{group} (set it in group_data/{group}.py only)")
            roles[group] = role
            members.setdefault(host.name, []).append(group)
    order = deploy_order(roles)
    plans: dict[str, HostPlan] = {}
    for host in hosts:
        data = _host_data(host)
        groups = sorted(members.get(host.name, []), key=order.index)
        plans[host.name] = host_plan(host.name, data, groups, roles, name)
    named = {stack_of(plan.data, f"inventory {name}, host {plan.name}") for plan in plans.values() if plan.services}
    if len(named) > 1:
        raise UserError(f"inventory {name}: hosts name different stacks ({', '.join(sorted(s or '(none)' for s in named))}); "
                        f"set data stack once, in the inventory or group_data")
    stack = Stack(inventory=name, roles=roles, order=order, hosts=plans, stack=next(iter(named), ""))
    target_of(stack).check()  # the target's own data (ports shared on a host, a Slurm job's settings) with the rest
    workers = workers_of(stack.services)
    for svc in stack.services:
        stack.commands[(svc.host, svc.name)] = engine_command(svc, stack.hosts[svc.host].data, workers)
    return stack


def _host_data(host: Any) -> dict[str, Any]:
    """Every datum of a pyinfra host with its precedence applied (override > host > groups > all)."""
    merged: dict[str, Any] = {}
    datas = list(host.data.datas)
    for layer in reversed(datas):
        if callable(layer):
            layer = layer()
        merged.update(layer)
    return merged


@contextmanager
def _pyinfra_context() -> Iterator[None]:
    # pyinfra (~140 ms) when an inventory is read (_make_inventory too), not by every importer of the
    # stack's model (the CLI's modules, review, the evidence's harness)
    from pyinfra.context import ctx_state
    from pyinfra.api import State

    if ctx_state.isset():
        yield
        return
    with ctx_state.use(State()):
        yield


def _make_inventory():
    """pyinfra_cli's make_inventory, imported here (~250 ms, only when an inventory is read) and
    WITHOUT its package's gevent monkey.patch_all(): that would patch sockets and threads of whatever
    process merely reads an inventory (tests, status)."""
    if "pyinfra_cli" not in sys.modules:
        import gevent.monkey

        patch_all = gevent.monkey.patch_all
        gevent.monkey.patch_all = lambda *args, **kwargs: None
        try:
            import pyinfra_cli.inventory  # noqa: F401
        finally:
            gevent.monkey.patch_all = patch_all
    from pyinfra_cli.inventory import make_inventory

    return make_inventory


def load_inventory(project_root: Path, inventory_path: str | os.PathLike, data: Mapping[str, Any] | None = None):
    """pyinfra's own inventory loader (group_data included), outside a pyinfra run."""
    make_inventory = _make_inventory()
    path = Path(inventory_path)
    if not path.is_absolute():
        path = project_root / path
    if not path.is_file():
        raise UserError(f"inventory {inventory_path}: no such file (e.g. inventory/local.py)")
    # pyinfra caches the compiled code of every inventory/group_data file by path, for the life of the
    # process: without this, a long-lived caller (tests, the A/B harness) would keep reading an
    # inventory as it was the first time, whatever was committed since.
    from pyinfra_cli import util as pyinfra_cli_util

    pyinfra_cli_util.PYTHON_CODES.clear()
    with _pyinfra_context():
        try:
            return make_inventory(str(path), override_data=dict(data or {}), cwd=str(project_root))
        except UserError:
            raise
        except Exception as exc:  # pyinfra wraps errors raised by the inventory's own code
            inner = getattr(exc, "exception", None) or exc
            if isinstance(inner, UserError):
                raise inner from None
            raise UserError(code_error(str(inventory_path), inner, path)) from None


def load_stack(project_root: Path, inventory_path: str | os.PathLike, data: Mapping[str, Any] | None = None) -> Stack:
    inventory = load_inventory(project_root, inventory_path, data)
    return stack_from_inventory(inventory, Path(inventory_path).stem)


def running_stack(project_root: Path, inventory_path: str | os.PathLike, data: Mapping[str, Any] | None = None) -> Stack:
    """The stack with every service where it runs now: as the inventory says over SSH / locally; for a
    Slurm stack, at the address and ports its running job published (ab run's endpoint and probes,
    incident snapshots). A service of a Slurm stack that is not placed keeps the inventory's values."""
    inventory = load_inventory(project_root, inventory_path, data)
    stack = stack_from_inventory(inventory, Path(inventory_path).stem)
    return target_of(stack).placed(inventory)
