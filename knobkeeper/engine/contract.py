"""Rendered launch commands judged by the engines themselves, and the PD pairing invariants.

`contract_problems(stack, label)` parses every service of a deploy Stack whose family has a flag
parser (sglang, vllm) with the parser of the version its role pins (see sideenv), then asks each
family for its PD pairing problems between its parsed prefill and decode servers and the routers
in front of them. Every function returns (problems, skipped, warnings): where a parser cannot be had,
one "skipped: <why>" line, never a silent pass; a rejected flag is one line naming host, service,
flag and the parser's own message.

The caller (review/check.py) loads the stack; this module imports nothing of the deploy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from knobkeeper.engine.family import Parsed
from knobkeeper.engine.sideenv import parse_launch_args
from knobkeeper.errors import UserError

_FLAG = re.compile(r"(--[A-Za-z0-9][A-Za-z0-9_-]*)")


def exported(stack: Any, svc: Any) -> dict[str, str]:
    """The non-knob variables a service's launch script exports: its family's per-instance ones,
    then host data `environment` (which wins, as in the script)."""
    data = stack.hosts[svc.host].data
    return {**svc.family.instance_environment(svc, data), **{str(k): str(v) for k, v in
                                                             (data.get("environment") or {}).items()}}


def parse_stack(stack: Any, label: str, wheelhouse: Path | None = None,
                notes: list[str] | None = None) -> tuple[list[Parsed], list[str]]:
    """Every service with a parser through its pinned version's parser; (parsed, skipped lines).
    `notes`: one line per repair of a side environment (sideenv.parse_launch_args)."""
    by_version: dict[tuple[str, str], list[Any]] = {}
    skipped: list[str] = []
    for svc in stack.services:
        fam = svc.family
        if fam.parser is None:
            continue
        if not svc.engine_version:
            skipped.append(f"skipped: {label}: {svc.key}: no {fam.name} version pinned ({fam.version_key} or "
                           f"engines[{svc.role!r}] = '{fam.name}==V'), so no parser to check it with")
            continue
        by_version.setdefault((fam.name, svc.engine_version), []).append(svc)
    parsed: list[Parsed] = []
    for (engine, version), services in sorted(by_version.items()):
        fam = services[0].family
        try:
            results = parse_launch_args(engine, version, [fam.parser_argv(stack.command(s)) for s in services],
                                        wheelhouse=wheelhouse, notes=notes)
        except UserError as exc:
            skipped.append(f"skipped: {label}: {engine} {version}'s parser: {exc}")
            continue
        for svc, result in zip(services, results):
            host = "127.0.0.1" if svc.address in ("@local", "localhost") else svc.address
            parsed.append(Parsed(key=svc.key, role=svc.role, url=svc.url, host=host, version=version, ok=result["ok"],
                                 args=dict(result.get("args") or {}), message=result.get("message", ""),
                                 environment=exported(stack, svc)))
    return parsed, skipped


def flag_problems(label: str, stack: Any, parsed: list[Parsed]) -> list[str]:
    engines = {s.key: s.engine for s in stack.services}
    out = []
    for p in parsed:
        if not p.ok:
            flag = _FLAG.search(p.message)
            out.append(f"{label}: {p.key}: {flag.group(1) if flag else 'arguments'}: rejected by "
                       f"{engines.get(p.key, '?')} {p.version}'s parser: {p.message}")
    return out


def pairing(label: str, stack: Any, parsed: list[Parsed]) -> tuple[list[str], list[str]]:
    """(problems, warnings) of every worker family's PD invariants in this stack."""
    routers = {s.key: (s.family, stack.command(s)) for s in stack.services if s.family.kind == "router"}
    problems: list[str] = []
    warnings: list[str] = []
    by_family: dict[str, list[Parsed]] = {}
    families = {s.key: s.family for s in stack.services}
    for p in parsed:
        by_family.setdefault(families[p.key].name, []).append(p._replace(args=dict(p.args)))
    for name, group in sorted(by_family.items()):
        fam = families[group[0].key]
        good = {p.url for p in group if p.ok}
        unparsed = frozenset(s.url for s in stack.services if s.family.name == name and s.url not in good)
        mine = {k: v for k, v in routers.items() if fam.reads_knobs_of in v[0].fronts}
        found, warned = fam.pairing_problems(label, group, mine, unparsed)
        problems += found
        warnings += warned
    return problems, warnings


def contract_problems(stack: Any, label: str, wheelhouse: Path | None = None) -> tuple[list[str], list[str], list[str]]:
    """(problems, skipped, warnings): flags and pairing in one parse (what `check` wants)."""
    notes: list[str] = []
    parsed, skipped = parse_stack(stack, label, wheelhouse, notes)
    problems, warnings = pairing(label, stack, parsed)
    return flag_problems(label, stack, parsed) + problems, skipped, notes + warnings + environment_warnings(stack, label)


def environment_warnings(stack: Any, label: str) -> list[str]:
    """What each cached engine environment of a local host says of itself on this machine (the
    family's managed_env: vLLM's CPU build without its AMX hook on a CPU with AMX)."""
    out: dict[str, None] = {}
    for plan in stack.hosts.values():
        for svc in plan.services:
            env = svc.family.managed_env(plan.name, [s.name for s in plan.services if s.family is svc.family],
                                         plan.data, plan.prefix)
            for line in env.local_warnings() if env is not None else ():
                out.setdefault(f"{label}: {line}")
    return list(out)
