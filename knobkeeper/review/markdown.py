"""The PR body in Markdown, from body.Review: deterministic (no clock, stable orders). Every value
and text from the changelog goes through fmt (cells escaped, values and percentages one way)."""

from __future__ import annotations

import os
import shlex
from typing import Mapping

from knobkeeper import fmt
from knobkeeper.audit.status import MEANING
from knobkeeper.changelog.entries import shown_old
from knobkeeper.project import Project
from knobkeeper.review.body import EVIDENCE_EXPECTED, Review, collect


def _name_only(author: str) -> str:
    return author.split("<", 1)[0].strip() or author


def _old(change) -> str:
    """A change's old value as the changelog shows it everywhere (entries.shown_old: an inventory
    default says so), from the value the review displays (a secret: its fingerprint)."""
    return shown_old(change.entry, lambda _value: change.display_old)


def summary_line(review: Review) -> str:
    n = len(review.changes)
    actions: dict[str, int] = {}
    for c in review.changes:
        actions[c.entry.action] = actions.get(c.entry.action, 0) + 1
    what = ", ".join(f"{k} {a}" for a, k in sorted(actions.items())) or "none"
    roles = sorted({c.entry.role for c in review.changes})
    restarts = "; ".join(f"{p['inventory']}: {p['summary'].split(':')[0]}" for p in review.plans) or "no inventories"
    return (f"{n} knob change{'s' if n != 1 else ''} ({what})"
            f"{' on ' + ', '.join(roles) if roles else ''} in {len(review.commits)} "
            f"commit{'s' if len(review.commits) != 1 else ''} ({review.base[:10]}..{review.head[:10]}); "
            f"restarts: {restarts}; {len(review.warnings)} warning{'s' if len(review.warnings) != 1 else ''}")


def title(review: Review) -> str:
    if len(review.changes) == 1:
        c = review.changes[0]
        return f"knobs: {c.entry.action} {c.entry.knob} on {c.entry.scope}: {_old(c)} -> {c.display_new}"
    return f"knobs: {len(review.changes)} changes on {', '.join(sorted({c.entry.role for c in review.changes})) or 'no role'}"


def _section_table(w, title_: str, columns: list[str], rows: list[list[str]], empty: str) -> None:
    """A `### title` section holding one table, or the sentence `empty` when there are no rows."""
    w(f"### {title_}")
    w("")
    if rows:
        w("| " + " | ".join(columns) + " |")
        w("|" + "---|" * len(columns))
        for row in rows:
            w("| " + " | ".join(row) + " |")
    else:
        w(empty)
    w("")


def _changes(review: Review, w) -> None:
    rows = [[fmt.cell(c.entry.scope), f"`{fmt.cell(c.entry.knob)}`", f"{fmt.cell(_old(c))} -> {fmt.cell(c.display_new)}",
             c.entry.action, fmt.cell(c.entry.reason), f"`{c.entry.id}`", fmt.cell(_name_only(c.entry.author))]
            for c in review.changes]
    _section_table(w, "Knob changes", ["role", "knob", "old -> new", "action", "reason", "entry", "author"], rows,
                   "No changelog entries were added in this range.")


def _evidence(review: Review, w) -> None:
    w("### Evidence")
    w("")
    if not review.changes:
        w("No knob changes, no evidence.")
        w("")
    for c in review.changes:
        e = c.entry
        w(f"#### {fmt.cell(e.role)} `{fmt.cell(e.knob)}` {fmt.cell(_old(c))} -> {fmt.cell(c.display_new)} "
          f"(entry `{e.id}`, risk {c.risk or 'unknown'})")
        w("")
        if not c.evidence:
            w("No evidence linked." if e.action in EVIDENCE_EXPECTED and e.new is not None
              else f"No evidence linked (a {e.action} takes a value back; none expected).")
            w("")
        for ev in c.evidence:
            if ev.doc is None:
                w(f"Evidence `{ev.id}`: **missing or invalid** ({fmt.cell(ev.problem)})")
                w("")
                continue
            _evidence_doc(ev.id, ev.doc, w)


def _evidence_doc(ident: str, doc, w) -> None:
    w(f"Evidence `{ident}` ({doc.created[:10]}, {fmt.cell(doc.source.tool)}, "
      f"{fmt.cell(doc.engine_text())}, metric `{fmt.cell(doc.metric)}`): "
      f"A = {fmt.cell(fmt.value(doc.baseline))}, B = {fmt.cell(fmt.value(doc.candidate))}")
    w("")
    measured = doc.setup.measured_text()
    if measured:
        w(f"Measured: {fmt.cell(measured)}")
        w("")
    for note in doc.unrecorded_notes():
        w(f"- **{fmt.cell(note)}**: the errors gate was not applied to those runs")
    if doc.unrecorded_notes():
        w("")
    w("| concurrency | n (A/B) | mean A | mean B | effect | 95% CI | p | p adjusted | verdict |")
    w("|---|---|---|---|---|---|---|---|---|")
    reasons = doc.validity.invalid
    for lv in doc.judgement.levels:
        verdict = lv.verdict
        if lv.concurrency in reasons:
            verdict = f"{verdict}: {'; '.join(reasons[lv.concurrency])}"
        w(f"| {lv.concurrency} | {lv.n_a}/{lv.n_b} | {fmt.num(lv.mean_a)} | {fmt.num(lv.mean_b)} | "
          f"{fmt.pct(lv.effect)} | {lv.ci_text()} | {fmt.p_value(lv.p_value)} | {doc.p_cell(lv)} | {fmt.cell(verdict)} |")
    w("")
    regressions = doc.judgement.regressions
    for g in regressions:
        w(f"- **Guard regression** at concurrency {g.concurrency}: {fmt.cell(g.label)} "
          f"{fmt.pct(g.effect)} (p adjusted {fmt.p_value(g.p_adjusted)})")
    if regressions:
        w("")
    if doc.anomalies:
        w("Anomalies:")
        for an in doc.anomalies:
            w(f"- {an.text()}")
    else:
        w("Anomalies: none.")
    w("")
    if doc.sweep is not None:
        _sweep(doc, w)


def _sweep(doc, w) -> None:
    """A sweep's arms against the control per level (simultaneous intervals), their fate, the timeline."""
    block, plan = doc.sweep, doc.sweep.plan
    w(f"Sweep of {len(plan.candidates)} candidates{' (interrupted)' if block.status == 'interrupted' else ''}: "
      f"**{fmt.cell(block.pick_text())}** (the table above is "
      f"{'its confirming A/B' if block.confirm else 'the search runs of the control and arm B'}; plan `{plan.id}`, "
      f"delta {plan.delta:.1%})")
    w("")
    w("| arm | " + " | ".join(f"@{c}: effect [simultaneous 95%] verdict" for c in plan.levels) + " | fate |")
    w("|---|" + "---|" * len(plan.levels) + "---|")
    for arm in plan.arms:
        cells = [f"{fmt.pct(e)}" + (f" [{fmt.pct(i[0])}..{fmt.pct(i[1])}]" if i else "") + f" {v}"
                 for _, e, i, v in block.cells(arm)] or [""] * len(plan.levels)
        w(f"| {fmt.cell(plan.arm_text(arm))} | " + " | ".join(fmt.cell(c) for c in cells) + f" | {fmt.cell(block.fate(arm))} |")
    w("")
    for line in block.timeline():
        w(f"- {fmt.cell(line)}")
    w("")


def _reverts(review: Review, w) -> None:
    rows = []
    for r in review.reverts:
        e = r["entry"]
        inc = "none" if not r["incident"] else (
            f"`{r['incident']}` {fmt.cell(r['incident_title'])} ({r['incident_state']})" if r["incident_title"]
            else f"`{r['incident']}` (missing)")
        rows.append([f"{e.action} `{e.id}`", f"{fmt.cell(e.role)} `{fmt.cell(e.knob)}`", f"`{r['revert_id']}`", inc,
                     _status_cell(r["status"]), fmt.cell(r["why"])])
    _section_table(w, "Reverts", ["change", "knob", "revert", "incident", "status", "why"], rows,
                   "No reverts or restores in this range.")


def _status_cell(status: str) -> str:
    """`**refuted** (the knob was innocent)`: the word in bold, and what it means."""
    return f"**{status}** ({MEANING[status]})" if status in MEANING else f"**{status}**"


def _diffs(review: Review, w) -> None:
    w("### Rendered files")
    w("")
    if not review.diffs:
        w("No rendered file changes (rendered at base and head by knobkeeper.deploy.render).")
        w("")
        return
    w("Rendered at base and head by knobkeeper.deploy.render; files whose only change is their header "
      "(source commit, digest, knob provenance) are not shown. Paths in this repository are shown "
      "relative to it, other paths in the home folder from ~.")
    w("")
    current = None
    for d in review.diffs:
        if (d.inventory, d.role) != current:
            current = (d.inventory, d.role)
            w(f"#### {d.inventory}: {d.role}")
            w("")
        same = f" (shown for {d.hosts[0]}; the same change on every host listed)" if len(d.hosts) > 1 else ""
        w(f"`{d.path}` on {', '.join(d.hosts)}{same}:")
        w("")
        w("```diff")
        w(d.diff.rstrip("\n"))
        w("```")
        w("")


def _plans(review: Review, w) -> None:
    w("### Restart plan")
    w("")
    for p in review.plans:
        w(f"#### {p['inventory']}: {fmt.cell(p['summary'])}")
        w("")
        for i, role in enumerate(p["roles"], 1):
            rows = [row for batch in role["batches"] for row in batch]
            acting = [row for row in rows if row["action"] != "unchanged"]
            name = role["role"]
            if acting:
                verbs = " and ".join(sorted({row["action"] for row in acting}))
                services = sorted({row["service"] for row in acting})
                hosts = sorted({row["host"] for row in acting})
                w(f"{i}. **{name}**: {verbs} {', '.join(services)} on {', '.join(hosts)}, then wait for {role['health']}")
                for reason, where in _grouped_reasons(acting):
                    w(f"   - {where}: {fmt.cell(reason)}")
            elif name in p["regated"]:
                deps = [d for d in role["after"] if d in p["restarted"] or d in p["regated"]]
                w(f"{i}. {name}: keeps running; its gate ({role['health']}) is checked again after {' and '.join(deps)}")
            else:
                w(f"{i}. {name}: keeps running (no rendered file changed)")
        if len(p["restarted"]) == 1 and len(p["order"]) > 1:
            w("")
            w(f"A {p['restarted'][0]}-only restart suffices.")
        w("")
    if not review.plans:
        w("No inventories to deploy.")
        w("")


def _grouped_reasons(rows: list[dict]) -> list[tuple[str, str]]:
    """(reason, "service on host, host") with the hosts that share a reason named once."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        by_reason.setdefault((row["service"], row["reason"]), []).append(row["host"])
    return [(reason, f"{service} on {', '.join(sorted(hosts))}") for (service, reason), hosts in by_reason.items()]


def to_markdown(review: Review) -> str:
    out: list[str] = []
    w = out.append
    w("## Knob change review")
    w("")
    w(f"**Summary:** {fmt.cell(summary_line(review))}")
    w("")
    if review.range_note:
        w(f"**Range:** {fmt.cell(review.range_note)}")
        w("")
    _changes(review, w)
    _evidence(review, w)
    _reverts(review, w)
    _diffs(review, w)
    _plans(review, w)
    w("### Warnings")
    w("")
    if review.warnings:
        for text in review.warnings:
            w(f"- {fmt.cell(text)}")
    else:
        w("None.")
    w("")
    w(f"<sub>Generated by `knobkeeper review --base {review.base[:10]} --head {review.head[:10]}`. "
      f"{report_pointer()}</sub>")
    return "\n".join(out) + "\n"


def report_pointer(env: Mapping[str, str] = os.environ) -> str:
    """Where the one-page report of this change is: the CI run's artifact (the example workflow
    publishes it as `knobkeeper-report`), or the command that writes it locally."""
    local = "The report (timeline, knobs now, evidence plots): `knobkeeper report --open`"
    if env.get("GITHUB_RUN_ID") and env.get("GITHUB_REPOSITORY"):
        server = env.get("GITHUB_SERVER_URL", "https://github.com")
        url = f"{server}/{env['GITHUB_REPOSITORY']}/actions/runs/{env['GITHUB_RUN_ID']}"
        return f"{local}, or the `knobkeeper-report` artifact of {url}."
    return f"{local} (CI: the `knobkeeper-report` artifact)."


def review_body(project: Project, base: str | None = None, head: str | None = None) -> str:
    return to_markdown(collect(project, base, head))


def gh_command(body_file: str, review: Review, base_branch: str = "main") -> str:
    return shlex.join(["gh", "pr", "create", "--base", base_branch, "--title", title(review), "--body-file", body_file])
