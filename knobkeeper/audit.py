"""Reverts are hypotheses. This module derives each revert's status and guards restore.

(Issue 7 grows this into reclaimable and timeline.)
"""

from __future__ import annotations

from knobkeeper.changelog import ops
from knobkeeper.changelog.ops import Change, CommitOptions
from knobkeeper.project import Project


def revert(project: Project, knob: str, role: str, reason: str | None, incident: str | None = None,
           hypothesis: str | None = None, options: CommitOptions | None = None) -> Change:
    return ops.revert_knob(project, knob, role, reason, incident, hypothesis, options)


def restore(project: Project, knob: str, role: str, reason: str | None = None, evidence: list[str] | None = None,
            force: bool = False, options: CommitOptions | None = None) -> Change:
    return ops.restore_knob(project, knob, role, reason, evidence, options=options)
