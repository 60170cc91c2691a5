"""The vocabulary the catalog, the engine registries and the declared state share: the value
types, what a shell accepts as a variable name, and the scope of a declared knob.

A scope is the knobs.toml table a knob is declared in: "decode" (a role of the stack the
inventories do not name, as in every one-stack repo) or "vllm.decode" (role decode of the stack
"vllm", table [vllm.decode]). Role names never hold a dot (they are pyinfra group names).
"""

from __future__ import annotations

import re
from typing import Any

from knobkeeper.errors import UserError

TYPES = ("int", "float", "bool", "enum", "string", "secret")

# What a shell accepts as a variable name: knob names (catalog, engine registries) and host data
# `environment` names reach launch scripts unquoted, so anything else is refused where it enters.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_env_name(name: Any, where: str) -> str:
    """`name` if it is a valid environment variable name, else a UserError naming `where`."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        raise UserError(f"{where}: {name!r} is not a valid variable name (letters, digits and _, not starting with a digit)")
    return name


def scope(stack: str | None, role: str) -> str:
    """The table of `role` in `stack`: "decode", or "vllm.decode"."""
    return f"{stack}.{role}" if stack else role


def split_scope(key: str) -> tuple[str, str]:
    """(stack, role) of a scope; the stack is "" for a plain role."""
    stack, _, role = key.rpartition(".")
    return stack, role


def role_of(key: str) -> str:
    return split_scope(key)[1]


def stack_hint(stacks: list[str], verb: str) -> str:
    """`; declare it for --stack vllm` (`verb` "declare it"), or `; declare it without --stack`: the
    option that names the first of `stacks` ("" : the stack the inventories do not name), for a
    command that found the knob under another stack than the one it was given; "" for no stacks."""
    if not stacks:
        return ""
    return f"; {verb} for --stack {stacks[0]}" if stacks[0] else f"; {verb} without --stack"
