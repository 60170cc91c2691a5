"""Rendered sglang launch commands judged by the engine itself, and the PD pairing invariants.

`launch_flag_problems(project, inventory)` parses every sglang service's command of an inventory with
`prepare_server_args` of the version its host pins (see sideenv). `pd_pairing_problems` compares the
parsed arguments of prefill and decode (mismatches that break PD at run time: model, served name,
page size, KV cache dtype, transfer backend) and checks that every bootstrap port the router's
`--prefill URL PORT` names is one a prefill server listens on. Both return (problems, skipped):
where the parser cannot be had, one "skipped: <why>" line, never a silent pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError
from knobkeeper.knobs.registry import ENGINES

LAUNCH_MODULE = "sglang.launch_server"
# What must agree between prefill and decode, as the parser resolved it.
PAIRED = (("model_path", "model path"), ("served_model_name", "served model name"), ("page_size", "page size"),
          ("kv_cache_dtype", "KV cache dtype"), ("disaggregation_transfer_backend", "transfer backend"))
_FLAG = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)")


@dataclass
class Parsed:
    """One sglang service's command as its engine version parsed it."""

    key: str  # host/service
    role: str
    url: str
    version: str
    ok: bool
    args: dict[str, Any]
    message: str = ""


def engine_argv(command: list[str]) -> list[str]:
    """The arguments after `-m sglang.launch_server` of a rendered command."""
    for i, arg in enumerate(command[:-1]):
        if arg == "-m" and command[i + 1] == LAUNCH_MODULE:
            return list(command[i + 2:])
    raise UserError(f"{' '.join(command[:3])} ...: not a `python -m {LAUNCH_MODULE}` command")


def parse_stack(stack: Any, label: str, wheelhouse: Path | None = None) -> tuple[list[Parsed], list[str]]:
    """Every sglang service of a stack through its pinned version's parser; (parsed, skipped lines)."""
    from knobkeeper.engine.sideenv import parse_launch_args

    version_key = ENGINES["sglang"].version_key
    by_version: dict[str, list[Any]] = {}
    skipped: list[str] = []
    for svc in stack.services:
        if svc.engine != "sglang":
            continue
        version = stack.hosts[svc.host].data.get(version_key)
        if not version:
            skipped.append(f"skipped: {label}: {svc.key}: no {version_key} pinned, so no parser to check it with")
            continue
        by_version.setdefault(str(version), []).append(svc)
    parsed: list[Parsed] = []
    for version, services in sorted(by_version.items()):
        try:
            results = parse_launch_args("sglang", version, [engine_argv(stack.command(s)) for s in services],
                                        wheelhouse=wheelhouse)
        except UserError as exc:
            skipped.append(f"skipped: {label}: sglang {version}'s parser: {exc}")
            continue
        for svc, result in zip(services, results):
            parsed.append(Parsed(key=svc.key, role=svc.role, url=svc.url, version=version, ok=result["ok"],
                                 args=result.get("args") or {}, message=result.get("message", "")))
    return parsed, skipped


def flag_problems(inventory: str, parsed: list[Parsed]) -> list[str]:
    out = []
    for p in parsed:
        if not p.ok:
            flag = _FLAG.search(p.message)
            out.append(f"{inventory}: {p.key}: {flag.group(1) if flag else 'arguments'}: rejected by sglang "
                       f"{p.version}'s parser: {p.message}")
    return out


def router_prefills(command: list[str]) -> list[tuple[str, int | None]]:
    """(URL, bootstrap port or None) of each `--prefill URL [PORT]` of a router command."""
    out = []
    for i, arg in enumerate(command):
        if arg == "--prefill" and i + 1 < len(command):
            port = command[i + 2] if i + 2 < len(command) else ""
            out.append((command[i + 1], int(port) if port.isdigit() else None))
    return out


def pd_pairing_problems(inventory: str, parsed: list[Parsed], routers: dict[str, list[str]],
                        unparsed_prefills: frozenset[str] = frozenset()) -> list[str]:
    """One line per mismatch, with both values. `routers`: {host/service: its command};
    `unparsed_prefills`: URLs of prefill servers that were skipped or rejected (reported elsewhere)."""
    workers = [p for p in parsed if p.ok and p.role in ("prefill", "decode")]
    prefills = [p for p in workers if p.role == "prefill"]
    decodes = [p for p in workers if p.role == "decode"]
    problems = []
    if prefills and decodes:
        reference = prefills[0]
        for other in workers:
            if other is reference:
                continue
            for attr, words in PAIRED:
                a, b = reference.args.get(attr), other.args.get(attr)
                if a != b:
                    problems.append(f"{inventory}: PD pairing: {words} differs: {reference.key} has {a!r}, "
                                    f"{other.key} has {b!r}")
    for router, command in sorted(routers.items()):
        for url, port in router_prefills(command):
            target = next((p for p in prefills if p.url == url.rstrip("/")), None)
            if target is None and url.rstrip("/") in unparsed_prefills:
                continue
            if target is None:
                problems.append(f"{inventory}: PD pairing: {router} names prefill {url}, which no parsed prefill "
                                f"server of this inventory serves")
            elif port is not None and target.args.get("disaggregation_bootstrap_port") != port:
                problems.append(f"{inventory}: PD pairing: {router} names bootstrap port {port} for {url}, but "
                                f"{target.key} listens on {target.args.get('disaggregation_bootstrap_port')!r}")
    return problems


def _stack(project: Any, inventory: str):
    from knobkeeper.deploy.stack import load_stack

    return load_stack(project.root, inventory)


def _pairing(stack: Any, inventory: str, parsed: list[Parsed]) -> list[str]:
    from knobkeeper.deploy.routers import ROUTERS

    routers = {s.key: stack.command(s) for s in stack.services if s.engine in ROUTERS}
    good = {p.url for p in parsed if p.ok}
    unparsed = frozenset(s.url for s in stack.services if s.role == "prefill" and s.url not in good)
    return pd_pairing_problems(inventory, parsed, routers, unparsed)


def launch_flag_problems(project: Any, inventory: str, wheelhouse: Path | None = None) -> tuple[list[str], list[str]]:
    """(problem lines, skipped lines) for every sglang launch command of `inventory`, e.g. inventory/example_prod.py."""
    stack = _stack(project, inventory)
    parsed, skipped = parse_stack(stack, inventory, wheelhouse)
    return flag_problems(inventory, parsed), skipped


def pairing_problems(project: Any, inventory: str, wheelhouse: Path | None = None) -> tuple[list[str], list[str]]:
    """(problem lines, skipped lines) of the PD pairing invariants of `inventory`."""
    stack = _stack(project, inventory)
    parsed, skipped = parse_stack(stack, inventory, wheelhouse)
    return _pairing(stack, inventory, parsed), skipped


def contract_problems(project: Any, inventory: str, wheelhouse: Path | None = None) -> tuple[list[str], list[str]]:
    """Flags and pairing in one parse (what `check` wants)."""
    stack = _stack(project, inventory)
    parsed, skipped = parse_stack(stack, inventory, wheelhouse)
    return flag_problems(inventory, parsed) + _pairing(stack, inventory, parsed), skipped
