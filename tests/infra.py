"""Build a temporary infra repo for tests: a copy of this repo's inventory/, templates/ and
deploy.py under its own `git init`, with a local git identity (a new machine may have none).

    project = make_infra_repo(tmp_path)      # committed, clean, on branch main (a test takes it from
                                             # conftest: `project`, `shared`, `infra_repo(name=, identity=)`)
    kk(project, "log") / cli(project, "log")  # the CLI in this process / in its own (bytes, exit codes)
    snapshot(project)                        # HEAD, status, knobs.toml: what "nothing written" keeps
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from knobkeeper.project import Project

SOURCE = Path(__file__).resolve().parent.parent
COPIED = ("inventory", "templates", "deploy.py", "config.py", "manifests")
GITIGNORE = ".knobkeeper-state/\n.knobkeeper-secrets/\n__pycache__/\n"


# Fast engines for the sim stacks the tests start: the sims at a twentieth of GPU time, a router that
# registers workers quickly and lets go of them fast.
FAST_ENGINE_ARGS = {
    "prefill": ["--time-scale", "0.05"],
    "decode": ["--time-scale", "0.05"],
    "router": ["--worker-startup-timeout-secs", "60", "--worker-startup-check-interval", "1",
               "--health-check-interval-secs", "2", "--shutdown-grace-period-secs", "2", "--log-level", "warn"],
}


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


def head(project: Project) -> str:
    return git(project.root, "rev-parse", "HEAD")


def snapshot(project: Project) -> tuple[str, str, str]:
    """HEAD, porcelain status (ignored files too) and knobs.toml: 'nothing written' keeps all three."""
    status = git(project.root, "status", "--porcelain", "--untracked-files=all", "--ignored")
    return head(project), status, project.knobs_path.read_text()


def cli(project: Project, *args: str, input: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real CLI in its own process (argv bytes, stdin bytes, crashes and exit codes as users see them)."""
    return subprocess.run([sys.executable, "-m", "knobkeeper.cli", *args, "--repo", str(project.root)], input=input,
                          capture_output=True, env={**os.environ, **(env or {})})


def one_line_exit_2(done, needle: str) -> None:
    """A refused command: exit 2, one line on stderr naming `needle`, no traceback."""
    err = done.stderr.decode() if isinstance(done.stderr, bytes) else done.stderr
    assert done.returncode == 2, (done.returncode, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and needle in err, err


def refused(result, *needles: str) -> str:
    """A refused command run through `kk` (CliRunner): exit 2, one line naming every needle; the line."""
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, result.output
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
