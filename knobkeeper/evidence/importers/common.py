"""What the readers share: `Imported` (one file's runs and what it says of the setup), `File` (a parsed
file whose helpers raise a UserError naming it and the field), JSON loading, the request counts and
their notes, the setup helpers; and what running a tool takes (`Load`, `BenchTool`, OFFLINE), and
`check_same_tool` (one arm, one tool version: the dispatch's and aiperf's directory reader's)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from knobkeeper.errors import UserError


@dataclass
class Imported:
    """Runs of one file (arm and repeat assigned by the caller) and what it says of the setup.

    `tool` names the tool and, where known, its version ("aiperf 0.13.0"); `tool_version` is the
    version the file states, or that its shape pins (sglang's 0.5.23 line), None when neither;
    `shape` the file shape the reader recognised;
    `notes` what the reader could not tell (e.g. "errors: not recorded by ...")."""

    tool: str
    runs: list[dict] = field(default_factory=list)
    setup: dict[str, Any] = field(default_factory=dict)
    arm_runs: dict[str, list[dict]] | None = None   # kernels only: runs already split by arm
    doc: dict | None = None                         # kernels only: the source evidence doc
    tool_version: str | None = None
    shape: str | None = None
    notes: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)  # the files read (a directory: each one)

    @property
    def errors_recorded(self) -> bool:
        """Whether every run's failed requests are in the file (False: some are unknown)."""
        return all(r.get("errors_recorded", True) for r in self.runs)


class File:
    """A parsed file plus helpers that raise UserError naming it and the field."""

    def __init__(self, path: Path, tool: str = ""):
        self.path = path
        self.tool = tool            # "aiperf 0.13.0": named when a shape is unknown

    def fail(self, where: str, what: str) -> UserError:
        return UserError(f"{self.path}: {where}: {what}")

    def unknown(self, where: str, what: str) -> UserError:
        """A shape this reader does not know: the tool, its version and the field looked for."""
        return UserError(f"{self.path}: {self.tool}: {where}: {what} (a shape this reader does not know)")

    def num(self, obj: Any, key: str, where: str, *, required: bool = True, positive: bool = False,
            nonnegative: bool = False) -> float | None:
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None:
            if required:
                raise self.fail(f"{where}{key}", "missing (expected a number)")
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(f"{where}{key}", f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(f"{where}{key}", f"expected a positive number, got {value!r}")
        if nonnegative and value < 0:
            raise self.fail(f"{where}{key}", f"expected a number >= 0, got {value!r}")
        return float(value)

    def count(self, obj: Any, key: str, where: str) -> int | None:
        """A request count: a non-negative integer, or None when the field is absent."""
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None:
            return None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value < 0):
            raise self.fail(f"{where}{key}", f"expected a request count (an integer >= 0), got {value!r}")
        return int(value)

    def level(self, obj: Any, key: str, where: str) -> int:
        value = obj.get(key) if isinstance(obj, dict) else None
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or value != int(value) or value < 1):
            unlimited = value is None or (isinstance(value, float) and math.isinf(value)) or value == "unlimited"
            hint = " (unlimited concurrency: a level needs a configured concurrency)" if unlimited else ""
            raise self.fail(f"{where}{key}", f"expected a positive integer concurrency, got {value!r}{hint}")
        return int(value)


def load_json(path: Path) -> Any:
    """One JSON document, or JSON lines (a list); a truncated or broken file is one UserError."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        return json.loads(text)   # accepts Infinity/NaN as Python's json writes them
    except json.JSONDecodeError as whole:
        error = whole
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        raise UserError(f"{path}: empty file (expected a benchmark result)")
    out = []
    for i, line in enumerate(lines, 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if i == 1 and len(lines) > 1 and not line.rstrip().endswith("}"):
                # a pretty-printed document that does not parse: truncated, or broken inside
                raise UserError(f"{path}: not JSON, truncated? ({error.msg} at line {error.lineno} "
                                f"column {error.colno})") from None
            raise UserError(f"{path}: line {i}: not JSON ({exc.msg}), truncated?" if i == len(lines)
                            else f"{path}: line {i}: not JSON ({exc.msg})") from None
    return out


def pct(obj: dict, mapping: dict[str, str], f: File, where: str) -> dict | None:
    out = {k: f.num(obj, src, where, required=False) for k, src in mapping.items()}
    return out if any(v is not None for v in out.values()) else None


def with_counts(run: dict, *, completed: int | None, errors: int | None, requested: int | None) -> dict:
    """`run` with the three request counts and `errors_recorded` (errors None: not in the file)."""
    run.update(completed=completed, errors=errors, requested=requested, errors_recorded=errors is not None)
    return run


def not_recorded(tool: str, how: str) -> str:
    return f"errors: not recorded by {tool} ({how})"


def one_value(values: Iterable[Any]) -> Any:
    """The value all items share, or None (several levels of one file may differ)."""
    found = {json.dumps(v) for v in values if v is not None}
    return json.loads(found.pop()) if len(found) == 1 else None


def requests_per_run(runs: list[dict]) -> int | None:
    return one_value(r.get("requested") if r.get("requested") is not None else r.get("completed") for r in runs)


TPOT = {"mean": "mean_tpot_ms", "p50": "median_tpot_ms", "p90": "p90_tpot_ms", "p99": "p99_tpot_ms"}
TTFT = {"mean": "mean_ttft_ms", "p50": "median_ttft_ms", "p90": "p90_ttft_ms", "p99": "p99_ttft_ms"}
ITL = {"mean": "mean_itl_ms", "p50": "median_itl_ms", "p90": "p90_itl_ms", "p99": "p99_itl_ms"}
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]+$")


def server_env(info: Any) -> dict[str, str] | None:
    """Environment variables a result file's server info reports ({NAME: value}), or None.

    Accepted: an object with an `environ`/`env`/`environment`/`knobs` object, or upper-case
    NAME keys at its top level (what a harness that dumps the engine's environment writes)."""
    if not isinstance(info, dict):
        return None
    for key in ("environ", "env", "environment", "knobs"):
        if isinstance(info.get(key), dict):
            return {k: None if v is None else str(v) for k, v in info[key].items()}
    names = {k: str(v) for k, v in info.items() if ENV_NAME.match(k) and v is not None}
    return names or None


def int_or_none(x: Any) -> int | None:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def str_or_none(x: Any) -> str | None:
    return x if isinstance(x, str) and x else None


def clean(setup: dict) -> dict:
    return {k: v for k, v in setup.items() if v is not None}


# ---------------------------------------------------------------- running a tool (`ab run --bench`)

@dataclass(frozen=True)
class Load:
    """One load of `ab run --bench`, as every tool is asked for it: the same prompt shape and seed
    for every arm, level and repeat. `out`: where the tool must write its result (a file, or
    aiperf's artifact directory)."""

    endpoint: str
    model: str
    tokenizer: str | None
    api: str
    input_len: int
    output_len: int
    requests: int
    concurrency: int
    seed: int
    out: Path


@dataclass(frozen=True)
class BenchTool:
    """How knobkeeper runs one tool (knobkeeper.evidence.bench): `python_args` after the tool's
    python (`-m sglang.bench_serving`), `script` the console script on PATH whose python is
    used, `dists` the distributions whose version is the tool's, `env` what it must run with,
    `command(load) -> argv` (after the python and python_args), `result(load)` what to read back."""

    name: str
    label: str
    python_args: tuple[str, ...]
    script: str
    dists: tuple[str, ...]
    command: Callable[[Load], list[str]]
    result: Callable[[Load], Path] = lambda load: load.out
    env: tuple[tuple[str, str], ...] = ()
    apis: tuple[str, ...] = ("chat", "completions")


def tokenizer(load: Load) -> list[str]:
    return ["--tokenizer", load.tokenizer] if load.tokenizer else []


OFFLINE = (("HF_HUB_OFFLINE", "1"),)   # a tokenizer directory, never a minute of hub retries


def check_same_tool(items: Iterable[tuple[Any, Imported]], where: str = "--baseline/--candidate") -> None:
    """One arm's files must come from one tool at one version: a UserError naming the first file of
    another version (files that state no version are not compared)."""
    seen: tuple[Any, str] | None = None
    for path, imp in items:
        if imp.tool_version is None:
            continue
        if seen is None:
            seen = (path, imp.tool_version)
        elif imp.tool_version != seen[1]:
            raise UserError(f"{path}: {imp.tool} in {where}, but {seen[0]} is version {seen[1]}: one arm's "
                            f"results must come from one version of the tool")
