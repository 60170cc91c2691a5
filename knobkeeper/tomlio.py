"""Read a TOML file that people edit: any problem is one UserError naming the file (and line)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError


def read_toml(path: Path, missing: str = "not found") -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise UserError(f"{path}: {missing}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: malformed TOML: {exc}") from None
