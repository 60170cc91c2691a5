"""Lint rendered files: `bash -n` and shellcheck on launch scripts, `systemd-analyze verify` on units,
configparser on supervisord sections. Each linter returns a list of problem texts (empty = clean), or
None when its tool is not installed (the caller says it was skipped).

systemd-analyze verify (systemd 252) exits 0 on bad directives but prints them on stderr, and exits 1
when ExecStart names a file that does not exist here; so units are verified with the stack's prefix
pointing into a temporary directory where the rendered launch script really exists (executable), and
any output at all counts as a problem (docs/platform-notes.md, "Linting rendered files").
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

TIMEOUT_S = 60


def available(tool: str) -> bool:
    return shutil.which(tool) is not None


def _lines(text: str, limit: int = 5) -> list[str]:
    out = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if len(out) > limit:
        out = out[:limit] + [f"... ({len(out) - limit} more lines)"]
    return out


def _run(argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd)


def bash_syntax(text: str) -> list[str] | None:
    """`bash -n` on the script text; problems are bash's own messages."""
    if not available("bash"):
        return None
    with tempfile.TemporaryDirectory(prefix="kk-lint-") as tmp:
        path = Path(tmp) / "launch.sh"
        path.write_text(text)
        done = _run(["bash", "-n", str(path)])
    if done.returncode == 0 and not done.stderr.strip():
        return []
    return _lines(done.stderr.replace(str(path), "launch.sh")) or [f"bash -n exited {done.returncode}"]


def shellcheck(text: str) -> list[str] | None:
    """shellcheck (gcc format, one line per finding: `line:col: level: message [SCxxxx]`)."""
    if not available("shellcheck"):
        return None
    with tempfile.TemporaryDirectory(prefix="kk-lint-") as tmp:
        path = Path(tmp) / "launch.sh"
        path.write_text(text)
        done = _run(["shellcheck", "--format=gcc", "--shell=bash", str(path)])
    if done.returncode == 0:
        return []
    found = [line.replace(f"{path}:", "line ", 1) for line in done.stdout.splitlines() if line.strip()]
    return _lines("\n".join(found) or done.stderr, limit=10) or [f"shellcheck exited {done.returncode}"]


def systemd_verify(unit_name: str, unit_text: str, launch_path: str, launch_text: str) -> list[str] | None:
    """`systemd-analyze verify` on a unit whose launch script exists at `launch_path` for the run.

    The caller renders the unit with a prefix inside a temporary directory, so `launch_path` is a
    path this process may create; it is written (0755) before the verify.
    """
    if not available("systemd-analyze"):
        return None
    launch = Path(launch_path)
    launch.parent.mkdir(parents=True, exist_ok=True)
    launch.write_text(launch_text)
    launch.chmod(0o755)
    with tempfile.TemporaryDirectory(prefix="kk-unit-") as tmp:
        path = Path(tmp) / unit_name
        path.write_text(unit_text)
        env = {**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""}
        done = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env)
    output = (done.stderr + done.stdout).replace(f"{path}:", "").replace(str(path), unit_name)
    if done.returncode == 0 and not output.strip():
        return []
    return _lines(output) or [f"systemd-analyze verify exited {done.returncode}"]


def ini_parse(text: str) -> list[str]:
    """A supervisord config (or one program section) must at least parse as INI."""
    parser = configparser.RawConfigParser(strict=True, inline_comment_prefixes=(";",))
    try:
        parser.read_string(text)
    except configparser.Error as exc:
        return _lines(str(exc), limit=3)
    if not parser.sections():
        return ["no [section] in the file"]
    return []
