"""Build a temporary infra repo for tests: a copy of this repo's inventory/, templates/ and
deploy.py under its own `git init`, with a local git identity (a new machine may have none).

    project = make_infra_repo(tmp_path)      # committed, clean, on branch main
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from knobkeeper.project import Project

SOURCE = Path(__file__).resolve().parent.parent
COPIED = ("inventory", "templates", "deploy.py", "config.py")
GITIGNORE = ".knobkeeper-state/\n.knobkeeper-secrets/\n__pycache__/\n"


def git(root: Path, *args: str, check: bool = True) -> str:
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout.strip()


def make_infra_repo(tmp_path: Path, name: str = "infra", identity: str = "Test Operator") -> Project:
    root = tmp_path / name
    root.mkdir(parents=True)
    for item in COPIED:
        src = SOURCE / item
        if src.is_dir():
            shutil.copytree(src, root / item, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, root / item)
    for sub in ("entries", "incidents", "evidence", "deploys"):
        (root / "changelog" / sub).mkdir(parents=True, exist_ok=True)
        (root / "changelog" / sub / ".gitkeep").touch()
    (root / ".gitignore").write_text(GITIGNORE)
    git(root, "init", "-q", "-b", "main")
    set_identity(root, identity)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "infra repo")
    return Project(root)


def set_identity(root: Path, name: str = "Test Operator") -> None:
    git(root, "config", "user.name", name)
    git(root, "config", "user.email", f"{name.lower().replace(' ', '.')}@example.com")
    git(root, "config", "commit.gpgsign", "false")


def kk(project: Project, *args: str, input: str | None = None):
    """Run `knobkeeper ARGS --repo ROOT` through click's CliRunner; returns the click Result."""
    from click.testing import CliRunner

    from knobkeeper.cli import main

    return CliRunner().invoke(main, [*args, "--repo", str(project.root)], input=input, catch_exceptions=False)
