"""Parse a folder of changelog TOML files once: later reads come from a JSON cache.

Reading 10,000 small TOML files costs over a second; a JSON file of their parsed contents,
checked per file by (size, mtime), costs a few tens of milliseconds. The files stay the truth:
the cache lives in .git/knobkeeper/ and is rebuilt whenever it disagrees with them.

Only plain files inside the repository are changelog files (`refusal`): a symbolic link (to
/etc/passwd, to a file outside the repo, dangling in a fresh clone) is left out of every listing
here and by the evidence store and deploy records, refused with one line by every reader of one
file (`plain_file`), and named once by `check` and `report` (`refused_files`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

from knobkeeper.errors import UserError
from knobkeeper.fsio import atomic_write

T = TypeVar("T")

CACHE_VERSION = 1

# The changelog folders (Project attributes) and the suffix of their files.
FOLDERS = (("entries_dir", ".toml"), ("incidents_dir", ".toml"), ("evidence_dir", ".json"), ("deploys_dir", ".json"))
LINK_FIX = ("changelog files are plain files in the repository (a clone gets nothing behind a link): replace it "
            "with the file itself or delete it")


class RefusedLink(UserError):
    """A changelog file that is a symbolic link or resolves outside the repository."""


def refusal(path: Path, root: Path | None = None) -> str | None:
    """Why `path` is not read as a changelog file, or None for a plain file inside `root` (by
    default the folder above changelog/<kind>/, where every changelog file lives)."""
    root = root if root is not None else path.absolute().parents[2]
    if path.is_symlink():
        return f"a symbolic link (to {os.readlink(path)})"
    real = path.resolve()
    if not real.is_relative_to(root.resolve()):
        return f"resolves outside the repository (to {real})"
    return None


def plain_file(path: Path, root: Path | None = None) -> Path:
    """`path`, or RefusedLink: `PATH: a symbolic link (to X); changelog files are ...`."""
    why = refusal(path, root)
    if why:
        raise RefusedLink(f"{path}: {why}; {LINK_FIX}")
    return path


def refused_files(project) -> list[tuple[Path, str]]:
    """(path, why) for every file of the changelog folders that is not a plain file inside the repo."""
    out = []
    for attr, suffix in FOLDERS:
        folder = getattr(project, attr)
        if not folder.is_dir() and not folder.is_symlink():
            continue
        if refusal(folder, project.root):
            out.append((folder, refusal(folder, project.root)))
            continue
        with os.scandir(folder) as it:
            names = sorted(e.name for e in it if e.name.endswith(suffix) and not e.name.startswith("."))
        out += [(folder / n, why) for n in names if (why := refusal(folder / n, project.root))]
    return out


def load_folder(folder: Path, cache_path: Path, parse: Callable[[Path], dict[str, Any]]) -> list[dict[str, Any]]:
    """The parsed dict of every `*.toml` in `folder`, in file-name order (= time order)."""
    if not folder.is_dir():
        return []
    cache: dict[str, Any] = {}
    try:
        raw = json.loads(cache_path.read_text())
        if raw.get("version") == CACHE_VERSION:
            cache = raw["files"]
    except (OSError, ValueError, KeyError):
        cache = {}
    if refusal(folder, folder.absolute().parents[1]):
        return []   # the folder itself is a link out of the repository (check names it)
    with os.scandir(folder) as it:
        items = sorted((e for e in it if e.name.endswith(".toml") and not e.name.startswith(".")
                        and not refusal(Path(e.path))), key=lambda e: e.name)
    fresh: dict[str, Any] = {}
    parsed = []
    dirty = False
    for item in items:
        stat = item.stat()
        key = [stat.st_size, stat.st_mtime_ns]
        hit = cache.get(item.name)
        if hit is not None and hit[0] == key:
            data = hit[1]
        else:
            data = parse(Path(item.path))
            dirty = True
        fresh[item.name] = [key, data]
        parsed.append(data)
    if dirty or len(fresh) != len(cache):
        try:
            atomic_write(cache_path, json.dumps({"version": CACHE_VERSION, "files": fresh}))
        except OSError:
            pass  # a read-only checkout still works, only slower
    return parsed


def files_with_id_prefix(folder: Path, ident: str) -> list[Path]:
    """Files in `folder` whose id (after the last '-') starts with `ident`, literally (no globbing)."""
    if not folder.is_dir():
        return []
    with os.scandir(folder) as it:
        names = sorted(e.name for e in it if not e.name.startswith("."))
    return [folder / n for n in names if "." in n and n.rsplit(".", 1)[0].rsplit("-", 1)[-1].startswith(ident)]


def find_one(ident: str, what: str, folder: Path, see: str, parse: Callable[[Path], T],
             items: Iterable[T] | None = None, rel: str | None = None) -> T:
    """The one entry/incident whose id is `ident` or starts with it (at least 4 characters, taken
    literally), from `items` when given, else parsed from `folder`; or a one-line UserError."""
    ident = ident.strip()
    if len(ident) < 4:
        raise UserError(f"{what} id {ident!r}: give at least 4 characters of the id")
    if items is None:
        found = [parse(p) for p in files_with_id_prefix(folder, ident) if p.suffix == ".toml"]
    else:
        found = [item for item in items if item.id.startswith(ident)]
    if not found:
        raise UserError(f"{what} {ident!r}: no such {what} in {rel or folder}/ (see `{see}`)")
    if len(found) > 1:
        raise UserError(f"{what} {ident!r}: ambiguous ({', '.join(i.id for i in found[:5])}); give more characters")
    return found[0]
