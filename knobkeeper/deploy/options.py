"""The options of one deploy, parsed and validated once: the deploy (operations.DeployRun, from pyinfra's
--data), `plan`, the API's preflight and the CLI's choices all use DeployOptions.

    restart         changed (files changed or not running) | co (everything, in order) | none (upload only)
    only            one role to upload and restart; the others must already be up
    batch           hosts of a role restarted (and gated) at a time; None: the whole role
    rollback        a failed gate puts the service's previous files back and restarts it
    knob_overrides  {"ROLE": {"KNOB": value}}, {"HOST/SERVICE": {"KNOB": value}} (that service only:
                    a canary worker) or {"KNOB": value}, for this run only (render.normalize_overrides)
    record          commit the deploy record (False: it goes to .knobkeeper-state/deploys/)
    allow_dirty     deploy uncommitted changes to inventory/ or templates/ (recorded)
    deploy_id       the record's id (the API picks one so it can find the record)
    inventory_path  the inventory file, as the record names it
    canary          {"knob", "value", "hosts", "phase": candidate | rollback | promote}: a canary's deploy
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from knobkeeper.errors import UserError

RESTART_MODES = ("changed", "co", "none")
DEFAULT_INVENTORY = "inventory/local.py"


@dataclass(frozen=True)
class DeployOptions:
    restart: str = "changed"
    only: str | None = None
    batch: int | None = None
    rollback: bool = False
    knob_overrides: Mapping[str, Any] | None = None
    record: bool = True
    allow_dirty: bool = False
    deploy_id: str | None = None
    inventory_path: str | None = None
    canary: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.restart not in RESTART_MODES:
            raise UserError(f"--data restart={self.restart}: expected one of {', '.join(RESTART_MODES)}")
        if self.knob_overrides is not None and not isinstance(self.knob_overrides, Mapping):
            raise UserError(f"--data knob_overrides={self.knob_overrides!r}: expected a JSON object")

    @classmethod
    def from_data(cls, data: Mapping[str, Any] | None) -> "DeployOptions":
        """From pyinfra --data (or `plan --data`): values may be JSON-decoded already or plain strings.
        Keys that are not options (inventory data such as engine_args) are left to the inventory."""
        data = dict(data or {})
        return cls(
            restart=str(data.get("restart", "changed")),
            only=str(data["only"]) if data.get("only") else None,
            batch=parse_batch(data.get("batch")),
            rollback=_bool(data.get("rollback", False), "rollback"),
            knob_overrides=_overrides(data.get("knob_overrides")),
            record=_bool(data.get("record", True), "record"),
            allow_dirty=_bool(data.get("allow_dirty", False), "allow_dirty"),
            deploy_id=str(data["deploy_id"]) if data.get("deploy_id") else None,
            inventory_path=str(data["inventory_path"]) if data.get("inventory_path") else None,
            canary=_json_object(data.get("canary"), "canary"),
        )

    def check_roles(self, roles: list[str], where: str = "this inventory") -> None:
        """`only` must name a role of the inventory."""
        if self.only is not None and self.only not in roles:
            raise UserError(f"--only {self.only!r}: not a role of {where} (roles: {', '.join(roles)})")

    def to_data(self) -> dict[str, Any]:
        """The --data pairs a pyinfra run gets (defaults left out, except what the record names)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None and (value != f.default or f.name in ("restart", "record", "allow_dirty")):
                out[f.name] = dict(value) if f.name in ("knob_overrides", "canary") else value
        return out

    def to_record(self) -> dict[str, Any]:
        """What a deploy record keeps of its options."""
        out = asdict(self)
        for key in ("deploy_id", "inventory_path", "allow_dirty"):
            out.pop(key)
        out["knob_overrides"] = dict(self.knob_overrides) if self.knob_overrides else None
        out["canary"] = dict(self.canary) if self.canary else None
        return out

    def scope(self, order: list[str]) -> list[str]:
        """The roles this run uploads and restarts."""
        return [self.only] if self.only else list(order)


def parse_batch(value: Any) -> int | None:
    """--data batch=N: hosts per batch (None: the whole role at once)."""
    if value is None or value == "" or value == "all":
        return None
    if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
        raise UserError(f"--data batch={value!r}: expected a number of hosts (1 or more) per batch")
    return int(value)


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    if isinstance(value, int):
        return bool(value)
    raise UserError(f"--data {key}={value!r}: expected true or false")


def _overrides(value: Any) -> Mapping[str, Any] | None:
    return _json_object(value, "knob_overrides")


def _json_object(value: Any, key: str) -> Mapping[str, Any] | None:
    if not value:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise UserError(f"--data {key}={value!r}: expected a JSON object") from None
    if not isinstance(value, Mapping):
        raise UserError(f"--data {key}={value!r}: expected a JSON object")
    return value
