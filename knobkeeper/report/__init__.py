"""`knobkeeper report`: one self-contained HTML page of the changelog (now, timeline, evidence,
knobs). `write_report` is the one entry point: check the options, read the facts
(report.sources), render (report.page), write the file whole or not at all.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from knobkeeper import gitio
from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write
from knobkeeper.project import Project
from knobkeeper.report.page import Options, render
from knobkeeper.report.sources import read_sources
from knobkeeper.timeutil import iso, parse_time, utcnow

DEFAULT_NAME = "knobkeeper-report.html"


@dataclass
class Written:
    path: Path
    size: int
    events: int


def default_output(project: Project) -> Path:
    """Under the git-ignored state folder, so writing the report never dirties the repository."""
    return project.state_dir / DEFAULT_NAME


def _check_output(path: Path, default: bool) -> Path:
    path = path.expanduser()
    if path.is_dir():
        raise UserError(f"-o {path}: is a directory (give a file name, e.g. {path / DEFAULT_NAME})")
    folder = path.parent if str(path.parent) else Path(".")
    if default and not folder.exists():
        return path   # the git-ignored state folder, made when the report is written
    if not folder.is_dir():
        raise UserError(f"-o {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"-o {path}: not writable")
    return path


def read_status_json(path: str) -> list[dict]:
    """The output of `knobkeeper status --json` (a list of {host, service, role, state, differences})."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"--status-json {path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"--status-json {path}: not JSON ({exc})") from None
    if not isinstance(data, list) or not all(isinstance(r, dict) and "host" in r and "service" in r and "state" in r
                                             for r in data):
        raise UserError(f"--status-json {path}: expected the output of `knobkeeper status --json` "
                        f"(a list of objects with host, service and state)")
    return data


def write_report(project: Project, output: str | os.PathLike | None = None, since: str | None = None,
                 role: str | None = None, status_json: str | None = None) -> Written:
    """Write the report; every bad option is a UserError before anything is written."""
    target = _check_output(Path(output) if output is not None else default_output(project), output is None)
    lo = datetime(1970, 1, 1, tzinfo=timezone.utc)
    if since is not None:
        try:
            lo = parse_time(since)
        except ValueError as exc:
            raise UserError(f"--since: {exc}") from None
    status_rows = read_status_json(status_json) if status_json else None
    now = utcnow()
    src = read_sources(project, lo, max(now, lo), role)
    opt = Options(repo=project.root.name, head=gitio.head_sha(project.root), generated=iso(now),
                  since=iso(lo) if since is not None else None, role=role, status_rows=status_rows)
    text = render(src, opt)
    data = text.encode()
    try:
        atomic_write(target, data, mode=0o644)   # creates only the default's state folder (the only one missing)
    except OSError as exc:
        raise UserError(f"-o {target}: cannot write ({exc.strerror or exc})") from None
    return Written(target.resolve(), len(data), len(src.events))
