"""Role topology: each role's group data says which services it runs, how their health is judged and
which roles it starts after. The deploy order is a topological sort of `after`, never a fixed list.

Group data (inventory/group_data/<role>.py) defines one dict per role, named `role_<role>`:

    role_decode = {
        "services": ["knobkeeper-decode"],   # supervisord program / systemd unit names
        "health": "/health",                 # path polled on each service's port (200 = healthy); default:
                                             # the engine family's readiness path (a router: /readiness)
        "after": ["prefill"],                # roles that must be healthy before this one starts
        "health_timeout": 600,               # seconds a gate waits (--data health_timeout=N overrides)
        "workers": None,                     # router only: path listing workers that must be healthy
        "settle": 2,                         # seconds a (re)started process must stay up, same PID,
    }                                        # still healthy, before its gate passes

A host is in a role when it is in the pyinfra group of that name (group data reaches only hosts of
the group, so `role_<name>` is present exactly on the role's hosts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from knobkeeper.errors import UserError

ROLE_PREFIX = "role_"
_ROLE_KEYS = {"services", "health", "after", "health_timeout", "workers", "settle"}


@dataclass(frozen=True)
class Role:
    name: str
    services: tuple[str, ...]
    health: str = ""  # "" : the engine family's readiness path
    after: tuple[str, ...] = ()
    health_timeout: float = 600.0
    workers: str | None = None
    settle: float = 2.0

    def to_json(self) -> dict[str, Any]:
        return {
            "services": list(self.services), "health": self.health, "after": list(self.after),
            "health_timeout": self.health_timeout, "workers": self.workers, "settle": self.settle,
        }


def role_from_data(name: str, spec: Any, where: str = "group data") -> Role:
    """A `role_<name>` dict to a Role; every problem names the key and what is accepted."""
    key = f"{ROLE_PREFIX}{name}"
    if not isinstance(spec, Mapping):
        raise UserError(f"{where}: {key}: expected a dict with services, health, after")
    unknown = sorted(set(spec) - _ROLE_KEYS)
    if unknown:
        raise UserError(f"{where}: {key}[{unknown[0]!r}]: no such key (keys: {', '.join(sorted(_ROLE_KEYS))})")
    services = spec.get("services")
    if isinstance(services, str):
        services = [services]
    if not isinstance(services, (list, tuple)) or not services or not all(
        isinstance(s, str) and s and s.replace("-", "").replace("_", "").replace(".", "").isalnum() for s in services
    ):
        raise UserError(f"{where}: {key}['services']: expected a non-empty list of service names ([A-Za-z0-9._-])")
    if len(set(services)) != len(services):
        raise UserError(f"{where}: {key}['services']: names a service twice")
    health = spec.get("health", "")
    if not isinstance(health, str) or (health and not health.startswith("/")):
        raise UserError(f"{where}: {key}['health']: expected a URL path such as '/health' (or no key: the engine's own)")
    after = spec.get("after", [])
    if isinstance(after, str):
        after = [after]
    if not isinstance(after, (list, tuple)) or not all(isinstance(a, str) and a for a in after):
        raise UserError(f"{where}: {key}['after']: expected a list of role names")
    timeout = spec.get("health_timeout", 600.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise UserError(f"{where}: {key}['health_timeout']: expected a positive number of seconds")
    workers = spec.get("workers")
    if workers is not None and (not isinstance(workers, str) or not workers.startswith("/")):
        raise UserError(f"{where}: {key}['workers']: expected a URL path such as '/workers', or None")
    settle = spec.get("settle", 2.0)
    if isinstance(settle, bool) or not isinstance(settle, (int, float)) or settle < 0:
        raise UserError(f"{where}: {key}['settle']: expected a number of seconds (0 or more)")
    return Role(name=name, services=tuple(services), health=health, after=tuple(after),
                health_timeout=float(timeout), workers=workers, settle=float(settle))


def deploy_order(roles: Mapping[str, Role]) -> list[str]:
    """Roles sorted so that every role comes after the roles it names in `after`.

    Ties are broken by name, so the order is stable. A role that names an unknown role, or a cycle,
    is a UserError; the cycle is named (`prefill -> decode -> prefill`).
    """
    for role in roles.values():
        for dep in role.after:
            if dep not in roles:
                known = ", ".join(sorted(roles)) or "none"
                raise UserError(f"role_{role.name}['after']: {dep!r} is not a role of this inventory (roles: {known})")
            if dep == role.name:
                raise UserError(f"role_{role.name}['after']: a role cannot start after itself (cycle: {dep} -> {dep})")
    cycle = find_cycle({name: list(role.after) for name, role in roles.items()})
    if cycle:
        raise UserError("role topology has a cycle: " + " -> ".join(cycle) + " (fix `after` in group data)")
    remaining = {name: set(role.after) for name, role in roles.items()}
    order: list[str] = []
    while remaining:
        ready = sorted(name for name, deps in remaining.items() if not deps)
        first = ready[0]
        order.append(first)
        del remaining[first]
        for deps in remaining.values():
            deps.discard(first)
    return order


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle in a `node -> depends on` graph as [a, b, ..., a] in dependency order, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {node: WHITE for node in edges}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = GREY
        path.append(node)
        for dep in sorted(edges.get(node, ())):
            if colour.get(dep, BLACK) == GREY:
                loop = path[path.index(dep):] + [dep]
                # Show it in start order: a dependency before its dependant.
                return list(reversed(loop))
            if colour.get(dep) == WHITE:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        colour[node] = BLACK
        return None

    for node in sorted(edges):
        if colour[node] == WHITE:
            found = visit(node)
            if found:
                return found
    return None


def downstream(order: list[str], roles: Mapping[str, Role], changed: Iterable[str]) -> set[str]:
    """Roles that (transitively) start after any of `changed`: the ones whose gates must re-check."""
    hit = set(changed)
    out: set[str] = set()
    for name in order:
        if any(dep in hit or dep in out for dep in roles[name].after):
            out.add(name)
    return out
