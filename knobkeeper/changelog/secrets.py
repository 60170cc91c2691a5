"""The secret store (.knobkeeper-secrets/): the values of secret knobs, which never enter git.

    .knobkeeper-secrets/.gitignore                      `*`: the store ignores itself, whatever the
                                                        repo's own .gitignore says
    .knobkeeper-secrets/<role>/<KNOB>/<hex>             one 0600 file per value, named by its
                                                        fingerprint (sha256:<hex>)

knobs.toml and the changelog hold only fingerprints. Keeping every value under its fingerprint
lets revert and restore find the value that the entry they go back to names; the deploy and
`status` ask `secret_value` / `secret_mismatch` for the value of the DECLARED fingerprint and
refuse or report when the store does not hold it. Values are written only through
store.commit_change (the journal), so a change that fails leaves no value behind.
"""

from __future__ import annotations

from pathlib import Path

from knobkeeper import gitio
from knobkeeper.knobs.catalog import fingerprint, is_fingerprint
from knobkeeper.project import Project

IGNORE_RULE = "# written by knobkeeper: nothing in the secret store is ever committed\n*\n"


def secret_path(project: Project, role: str, knob: str, declared: str) -> Path:
    """Where the value whose fingerprint is `declared` is kept."""
    return project.secrets_dir / role / knob / declared.removeprefix("sha256:")


def secret_value(project: Project, role: str, knob: str, declared: str) -> bytes | None:
    """The stored value whose fingerprint is `declared`, or None when the store does not hold it
    (or holds a file whose content does not match its name)."""
    if not is_fingerprint(declared):
        return None
    for path in (secret_path(project, role, knob, declared), project.secrets_dir / role / knob):
        try:
            value = path.read_bytes()  # the second: the one-value-per-knob layout of before
        except OSError:
            continue
        if fingerprint(value) == declared:
            return value
    return None


def migrate_legacy_value(project: Project, role: str, knob: str) -> None:
    """Turn the old layout's file <role>/<KNOB> (one value) into <role>/<KNOB>/<hex>, by renames
    only, so that a crash at any point loses nothing and the next call finishes the move."""
    legacy = project.secrets_dir / role / knob
    staging = project.secrets_dir / role / f".{knob}.migrating"
    if legacy.is_file():
        staging.mkdir(mode=0o700, exist_ok=True)
        legacy.rename(staging / fingerprint(legacy.read_bytes()).removeprefix("sha256:"))
    if staging.is_dir() and not legacy.exists():
        staging.rename(legacy)


def secret_mismatch(project: Project, role: str, knob: str, declared: str) -> str | None:
    """None when the store holds the value `declared` names; else one line saying what is wrong.

    For the deploy (refuse) and `status` (report): compares the stored value's fingerprint with
    the declared one, so a value that is stale, edited or missing is never shipped as in sync."""
    if not is_fingerprint(declared):
        return f"[{role}] {knob}: plaintext value for secret knob {knob} (not shown) in knobs.toml; expected a fingerprint"
    path = secret_path(project, role, knob, declared)
    rel = project.rel(path)
    if not path.is_file():
        return (f"[{role}] {knob}: the secret value {declared} is not in {rel} "
                f"(set it again on this machine: knobkeeper set {knob} --role {role} --value-file PATH)")
    if secret_value(project, role, knob, declared) is None:
        return f"[{role}] {knob}: {rel} holds a value whose fingerprint is not {declared} (edited by hand?); set it again"
    return None


def value_files(project: Project, role: str, knob: str, value: str) -> dict[Path, str]:
    """The private files a change must write to store `value` (for store.commit_change)."""
    migrate_legacy_value(project, role, knob)
    files = {secret_path(project, role, knob, fingerprint(value)): value}
    ignore = project.secrets_dir / ".gitignore"
    try:
        current = ignore.read_text()
    except (OSError, UnicodeDecodeError):
        current = None
    if current != IGNORE_RULE:
        files[ignore] = IGNORE_RULE
    return files


def tracked_secret_files(project: Project) -> list[str]:
    """Files under the secret store that git tracks or has staged (for `check`: each is a leak)."""
    rel = project.rel(project.secrets_dir)
    done = gitio.run(project.root, "-c", "core.quotepath=off", "ls-files", "--cached", "--", rel)
    return [line for line in done.stdout.splitlines() if line.strip()]
