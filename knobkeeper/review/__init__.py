"""Change review: the body of a change-review PR (`review`) and the CI / pre-commit gate (`check`).

Owns: which commits a review covers (gitrange: on knobkeeper.gitio; the merge-base when --base is
not an ancestor), the render glue that shows what deploy would upload (renders), the restart plan
of a range with what changed in words (restarts), the review's data (body.collect) and its
Markdown (markdown), and `check` (one function per kind of problem).

May import: knobkeeper.audit (revert status), knobkeeper.evidence.store (the one evidence reader),
knobkeeper.deploy (render, observe's restart rule, plan's verbs, topology, stack), knobkeeper.changelog,
knobkeeper.knobs, and the shared gitio/fmt/project/errors/timeutil/lint modules. Never the CLI.
"""

from knobkeeper.review.body import ChangeView, EvidenceView, FileDiff, Review, collect
from knobkeeper.review.check import CHECKS, CheckResult, Problem, check
from knobkeeper.review.gitrange import Range, changed_paths, commits_between, default_base, resolve_range, resolve_ref, snapshot
from knobkeeper.review.markdown import gh_command, review_body, summary_line, title, to_markdown
from knobkeeper.review.renders import InventoryRender, RenderedFile, inventories, render_errors_per_host, render_inventory

__all__ = [
    "CHECKS", "ChangeView", "CheckResult", "EvidenceView", "FileDiff", "InventoryRender", "Problem", "Range",
    "RenderedFile", "Review", "changed_paths", "check", "collect", "commits_between", "default_base", "gh_command",
    "inventories", "render_errors_per_host", "render_inventory", "resolve_range", "resolve_ref", "review_body",
    "snapshot", "summary_line", "title", "to_markdown",
]
