"""The report page: the facts of `sources.Sources` as one self-contained HTML document (inline
CSS, inline SVG, a few lines of inline JS for the tooltip panel; nothing is fetched).

The markup is in templates/ (jinja2, autoescaped: report.html.j2 and one file per section). This
module gathers each section's facts into a small view (one function per section) that the
templates read; it writes no HTML itself. The SVG drawings come from svg.py, which escapes what
it draws; they reach the templates as `Markup`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
from markupsafe import Markup

from knobkeeper import fmt
from knobkeeper.audit.status import describe
from knobkeeper.changelog.entries import Entry
from knobkeeper.report import svg
from knobkeeper.report.sources import Sources, arm_intervals
from knobkeeper.report.svg import Mark, Span, TimeScale, to_dt, when

# The newest entries listed under each knob; older ones are counted and left to `knobkeeper log`.
HISTORY_ROWS = 20
# Reverts listed in "now"; older ones are counted.
REVERT_ROWS = 200


@dataclass
class Options:
    repo: str
    head: str | None
    generated: str
    since: str | None
    role: str | None
    status_rows: list[dict] | None      # `knobkeeper status --json` output, when given


# --------------------------------------------------------------------------- the templates

def _finalize(value: Any) -> Any:
    """Every `{{ ... }}` of the templates: text that came from a file shows its controls, escape
    sequences and bidi controls as visible escapes (fmt.safe, as on a terminal); autoescape then
    escapes the markup. Markup (the SVG drawings, macro output) is already both."""
    return value if isinstance(value, Markup) else fmt.safe(value)


@lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("knobkeeper.report", "templates"),
        autoescape=jinja2.select_autoescape(["html", "html.j2"]),
        undefined=jinja2.StrictUndefined, finalize=_finalize,
        trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(when=when, value=fmt.value, pct=fmt.pct, p_value=fmt.p_value, describe=describe)
    return env


def _drawn(markup: str) -> Markup:
    """An SVG from svg.py: safe markup, since svg.py escapes (svg.esc) every string from a file it
    draws and writes only numbers and its own class names beside them."""
    return Markup(markup)


# --------------------------------------------------------------------------- the page

@dataclass
class Header:
    repo: str
    generated: str
    head: str | None
    since: str | None
    role: str | None
    counts: str


@dataclass
class Page:
    header: Header
    empty: bool
    now: Now | None
    timeline: Timeline | None
    evidence: list[EvidenceView] | None
    knobs: list[KnobView] | None
    problems: list[str]


def render(src: Sources, opt: Options) -> str:
    empty = not (src.entries or src.incidents or src.evidence or src.records or src.declared)
    now = timeline = evidence = knobs = None
    if not empty:
        marks, spans = _marks(src, opt)
        scale = _scale(marks, spans, src)
        now, timeline = _now(src, opt), _timeline(src, opt, marks, spans, scale)
        evidence, knobs = _evidence(src, opt), _knobs(src, opt, scale)
    page = Page(_header(src, opt), empty, now, timeline, evidence, knobs, src.problems + src.evidence_problems)
    return _env().get_template("report.html.j2").render(page=page)


def _header(src: Sources, opt: Options) -> Header:
    counts = (f"{len(src.entries)} entries, {len(src.incidents)} incidents, {len(src.evidence)} evidence files, "
              f"{len(src.records)} deploy records")
    return Header(opt.repo, when(opt.generated), opt.head[:12] if opt.head else None,
                  when(opt.since) if opt.since else None, opt.role, counts)


# --------------------------------------------------------------------------- now

@dataclass
class ReclaimRow:
    item: Any                   # audit.Reclaim
    confirmed: bool             # confirmed as the cause: restore only with --force
    gains: list[Any]            # by concurrency
    incident_state: str | None  # "open", "resolved, root cause: ..."; None without an incident
    command: str


@dataclass
class IncidentRow:
    incident: Any               # changelog.incidents.Incident
    reverts: list[Any]          # audit.RevertStatus of the reverts it names


@dataclass
class DeclaredRow:
    row: Any                                # changelog.queries.DeclaredKnob
    evidence: list[tuple[str, str | None]]  # (evidence id, every level's text; None: not readable)


@dataclass
class State:
    """A service's state cell: `<span class="state s-CSS">TEXT</span>`, then NOTE in grey."""
    css: str
    text: str
    note: str | None = None


@dataclass
class DeployRow:
    host: str
    service: str
    role: str
    started: str | None
    action: str
    gate: str | None
    record: Any | None          # deploy.record.DeployRecord
    state: State | None


@dataclass
class Now:
    reclaimable: list[ReclaimRow]
    confirmed: list[ReclaimRow]
    open_incidents: list[IncidentRow]
    resolved_incidents: list[IncidentRow]   # newest first
    reverts: list[Any]                      # audit.RevertStatus, newest first, at most REVERT_ROWS
    older_reverts: int
    declared: list[DeclaredRow]
    deploys: list[DeployRow]


def _levels_summary(doc) -> str:
    """Every level's text (the evidence's one text per level), for a table cell or a tooltip."""
    return "; ".join(doc.level_text(lv) for lv in doc.judgement.levels) or "no levels"


def _now(src: Sources, opt: Options) -> Now:
    docs = {d.id: d for d in src.evidence}
    declared = []
    for row in src.declared:
        evidence = []
        for ident in (row.entry.evidence if row.entry else []):
            doc = docs.get(ident)
            evidence.append((ident, _levels_summary(doc) if doc else None))
        declared.append(DeclaredRow(row, evidence))
    per = _reverts_for(src)
    incidents = [IncidentRow(inc, per.get(inc.id, [])) for inc in src.incidents]
    reverts = [s for s in src.statuses.values() if not opt.role or s.revert.role == opt.role]
    reverts.sort(key=lambda s: s.revert.time, reverse=True)
    mine = [r for r in src.reclaim.reclaimable if not opt.role or r.role == opt.role]
    confirmed = [r for r in src.reclaim.confirmed if not opt.role or r.role == opt.role]
    return Now(reclaimable=[_reclaim_row(item, confirmed=False) for item in mine],
               confirmed=[_reclaim_row(item, confirmed=True) for item in confirmed],
               open_incidents=[row for row in incidents if row.incident.resolution is None],
               resolved_incidents=[row for row in reversed(incidents) if row.incident.resolution is not None],
               reverts=reverts[:REVERT_ROWS], older_reverts=max(len(reverts) - REVERT_ROWS, 0),
               declared=declared, deploys=_deploys_now(src, opt))


def _reverts_for(src: Sources) -> dict[str, list]:
    per: dict[str, list] = {}
    for s in src.statuses.values():
        if s.revert.incident:
            per.setdefault(s.revert.incident, []).append(s)
    return per


def _reclaim_row(item, confirmed: bool) -> ReclaimRow:
    inc = item.status.incident
    state = None
    if inc is not None:
        state = f"resolved, root cause: {inc.resolution.root_cause}" if inc.resolution else "open"
    return ReclaimRow(item, confirmed, sorted(item.gains, key=lambda g: g.concurrency), state,
                      item.command + (" --force" if confirmed else ""))


def _deploys_now(src: Sources, opt: Options) -> list[DeployRow]:
    last: dict[tuple[str, str], tuple[Any, Any]] = {}
    for record in src.records:
        for svc in record.services or []:
            if opt.role and svc.role != opt.role:
                continue
            key = (svc.host, svc.service)
            if svc.acted or key not in last:
                last[key] = (record, svc)
    observed = {(r.get("host"), r.get("service")): r for r in (opt.status_rows or [])}
    rows = []
    for key in sorted(set(last) | set(observed), key=lambda k: (str(k[0]), str(k[1]))):
        record, svc = last.get(key, (None, None))
        seen = observed.get(key)
        gate = svc.gate.result if svc else None
        if seen is not None:
            diffs = "; ".join(seen.get("differences") or [])
            shown = seen.get("state", "unknown")
            state = State(str(shown).replace(" ", "-"), shown,
                          "observed (status --json)" + (f": {diffs}" if diffs else ""))
        elif record is not None:
            state = _started_state(src, record, svc, gate)
        else:
            state = None
        rows.append(DeployRow(
            host=key[0], service=key[1], role=(svc.role if svc else None) or (seen or {}).get("role") or "?",
            started=(svc.restart_issued_at if svc else None) or (record.started_at if record else None),
            action=svc.action if svc else "", gate=gate, record=record, state=state))
    return rows


def _started_state(src: Sources, record, svc, gate: str | None) -> State:
    """What the last deploy started a service with, against what a deploy would start it with now:
    `status`'s notion and words (Sources.started_drift), from the record alone."""
    if gate == "failed":
        return State("down", "gate failed")
    differ = src.started_drift.get((record.id, svc.host, svc.service))
    if isinstance(differ, str):
        return State("unknown", "declared state unknown", differ)
    if differ is None:
        return State("unknown", f"not in {record.inventory_path} now",
                     "the inventory no longer has this host and service")
    if differ:
        return State("drifted", "declared knobs changed since", f"{'; '.join(differ)} (a deploy restarts it)")
    return State("in-sync", "started with what is declared",
                 "from the deploy record; pass --status-json for the running state")


# --------------------------------------------------------------------------- timeline

def _entry_mark(entry: Entry, status) -> Mark:
    lines = [f"{when(entry.time)}  {entry.role}: {entry.action} {entry.knob} "
             f"{fmt.value(entry.old)} -> {fmt.value(entry.new)}",
             f"entry {entry.id} by {entry.author}", f"reason: {fmt.short(entry.reason or '', 300)}"]
    look = entry.action
    links = []
    if entry.action == "revert":
        st = status.status if status else "suspected"
        look = f"revert revert-{st}"
        lines.append(f"status: {st.upper()}: {status.why if status else ''}")
        if entry.hypothesis:
            lines.append(f"hypothesis: {entry.hypothesis}")
    for key, ref in (("reverts", entry.reverts), ("restores", entry.restores), ("refutes", entry.refutes)):
        if ref:
            lines.append(f"{key} entry {ref}")
    if entry.incident:
        lines.append(f"incident {entry.incident}")
        links.append(f"inc-{entry.incident}")
    for ident in entry.evidence:
        lines.append(f"evidence {ident}")
        links.append(f"ev-{ident}")
    links.append(f"knob-{entry.knob}")
    label = f"{entry.action} {fmt.short(fmt.value(entry.new), 12)}"
    if entry.action == "revert":
        label = f"revert: {status.status if status else 'suspected'}"
    return Mark(to_dt(entry.time), entry.role or "?", entry.action, look, "\n".join(lines), links, entry.id, label)


def _gates(src: Sources) -> dict:
    gates = {}
    for record in src.records:
        for svc in record.services or []:
            gates[(record.id, svc.host, svc.service)] = svc.gate.result
    return gates


def _scale(marks: list[Mark], spans: list[Span], src: Sources) -> TimeScale | None:
    """One time axis for the timeline and every knob's value strip."""
    times = [m.time for m in marks] + [s.start for s in spans] + [s.end for s in spans if s.end]
    if not times:
        times = [e.moment for e in src.entries]
    return TimeScale.around(times) if times else None


def _marks(src: Sources, opt: Options) -> tuple[list[Mark], list[Span]]:
    gates = _gates(src)
    entries = {e.id: e for e in src.entries}
    marks: list[Mark] = []
    for ev in src.events:
        if ev.kind == "knob":
            # the event's ref is its entry's id; its data holds the entry's fields (audit reads
            # the entries apart from the report, so one written in between is read from there)
            entry = entries.get(ev.ref) or Entry(**ev.data["entry"])
            if opt.role and entry.role != opt.role:
                continue
            marks.append(_entry_mark(entry, src.statuses.get(entry.id)))
        elif ev.kind == "restart":
            role = ev.data.get("role") or "?"
            if opt.role and role != opt.role:
                continue
            gate = gates.get((ev.ref, ev.data.get("host"), ev.data.get("service"))) or "unknown"
            text = f"{when(ev.time)}  {ev.text}\ndeploy {ev.ref}, gate {gate}"
            marks.append(Mark(to_dt(ev.time), role, "restart", f"restart gate-{gate}", text, [], ev.ref))
        elif ev.kind == "deploy":
            record = next((r for r in src.records if r.id == ev.ref), None)
            result = record.result if record else "unknown"
            marks.append(Mark(to_dt(ev.time), "deploys", "deploy", f"deploy gate-{'passed' if result == 'ok' else result}",
                              f"{when(ev.time)}  {ev.text}", [], ev.ref))
        elif ev.kind == "incident":
            what = ev.data.get("event", "note")
            look = f"incident-{what}"
            if what == "note" and (ev.data.get("refutes") or ev.data.get("confirms")):
                look += " refutes" if ev.data.get("refutes") else " confirms"
            label = {"note": "note" + (": refutes" if ev.data.get("refutes") else ": confirms" if ev.data.get("confirms")
                                       else ""), "resolved": "resolved"}.get(what, "")
            marks.append(Mark(to_dt(ev.time), "incidents", f"incident-{what}", look, f"{when(ev.time)}  {ev.text}",
                              [f"inc-{ev.ref}"], ev.ref, label))
    for doc in src.evidence:
        if opt.role and doc.role != opt.role:
            continue
        if opt.since and doc.created < opt.since:
            continue
        text = (f"{when(doc.created)}  evidence {doc.id}: {doc.knob}={fmt.value(doc.candidate)} on {doc.role}\n"
                f"{_levels_summary(doc)}")
        marks.append(Mark(to_dt(doc.created), doc.role, "evidence", "evidence", text, [f"ev-{doc.id}"], doc.id))
    spans = []
    seen = {ev.ref for ev in src.events if ev.kind == "incident"}
    for inc in src.incidents:
        if inc.id not in seen:
            continue
        end = inc.resolution.time if inc.resolution else None
        label = f"{inc.title}\n{inc.id}: symptom began {when(inc.started)}, " + (
            f"resolved {when(end)}: root cause {inc.resolution.root_cause}" if end else "still open")
        spans.append(Span(to_dt(inc.started), to_dt(end) if end else None, end is None, label, f"inc-{inc.id}"))
    return marks, spans


def _lanes(src: Sources, opt: Options, marks: list[Mark]) -> list[str]:
    if opt.role:
        roles = [opt.role]
    else:
        order = list(src.records[-1].order) if src.records and src.records[-1].order else []
        for role in [*src.catalog.roles(), *sorted({m.lane for m in marks})]:
            if role not in order and role not in ("incidents", "deploys"):
                order.append(role)
        used = {m.lane for m in marks}
        roles = [r for r in order if r in used]
    lanes = ["incidents"] if any(m.lane == "incidents" for m in marks) else []
    lanes += roles
    if any(m.lane == "deploys" for m in marks):
        lanes.append("deploys")
    return lanes


LEGEND = [("set", "set"), ("restore", "restore"), ("revert revert-refuted", "revert, refuted"),
          ("revert revert-confirmed", "revert, confirmed"), ("revert revert-suspected", "revert, suspected"),
          ("revert revert-unexplained", "revert, unexplained"), ("restart gate-passed", "restart, gate passed"),
          ("restart gate-failed", "restart, gate failed"), ("evidence", "evidence"),
          ("incident-note refutes", "note that refutes")]


@dataclass
class Timeline:
    since: str | None               # --since, as shown
    drawn: Markup | None            # the timeline's SVG; None: nothing to draw
    events: int = 0
    grouped: int = 0                # events drawn inside a grouped mark
    group_px: str = f"{svg.GROUP_PX:g}"
    legend: list[tuple[str, Markup, str]] = field(default_factory=list)   # (look, shape, label)


def _legend() -> list[tuple[str, Markup, str]]:
    items = []
    for look, label in LEGEND:
        kind = look.split()[0].replace("gate-passed", "")
        shape = svg._shape(kind if kind in ("revert", "restore", "restart", "evidence", "set") else "incident-note",
                           9, 9, False)
        items.append((look, _drawn(shape), label))
    return items


def _timeline(src: Sources, opt: Options, marks: list[Mark], spans: list[Span], scale: TimeScale | None) -> Timeline:
    since = when(opt.since) if opt.since else None
    if not marks or scale is None:
        return Timeline(since, None)
    for sp in spans:
        sp.start = max(sp.start, scale.lo)
        sp.end = sp.end or scale.hi
    drawn = svg.timeline(_lanes(src, opt, marks), marks, spans, scale)
    return Timeline(since, _drawn(drawn), len(marks), len(marks) - len(svg.group_marks(marks, scale)),
                    legend=_legend())


# --------------------------------------------------------------------------- evidence

@dataclass
class LevelRow:
    level: Any                  # evidence.model.Level
    verdict_class: str          # v-better, v-worse, v-no, v-inconclusive, v-invalid
    invalid: str | None         # the validity gates it failed, when it failed one
    p_adjusted: str | None      # None: schema 1, unadjusted


@dataclass
class SweepCell:
    verdict_class: str
    effect: str
    interval: str | None        # the simultaneous 95% interval
    verdict: str


@dataclass
class SweepRow:
    arm: str
    cells: list[SweepCell]      # [] when the arm has none: one empty cell per level
    fate: str


@dataclass
class SweepView:
    candidates: int
    status: str                 # " (interrupted)" or ""
    pick: str
    levels: list[int]
    rows: list[SweepRow]
    plan: str                   # the plan's line under the table
    timeline: list[str]


@dataclass
class EvidenceView:
    id: str
    title: str                  # `B: KNOB=512 vs A: KNOB=(unset) on decode`
    facts: str                  # created, engine, model, source, metric, the adjustment
    chart: Markup | None
    levels: list[LevelRow]
    anomalies: list[str]
    warnings: list[str]
    guards: list[Any]           # evidence.model.Guard
    sweep: SweepView | None


def _evidence(src: Sources, opt: Options) -> list[EvidenceView]:
    docs = [d for d in src.evidence if not opt.role or d.role == opt.role]
    return [_evidence_view(doc) for doc in reversed(docs)]


def _evidence_view(doc) -> EvidenceView:
    labels = {arm: f"{arm}: {doc.knob}={fmt.value(doc.value(arm))}" for arm in ("A", "B")}
    arms = {arm: arm_intervals(doc, arm) for arm in ("A", "B")}
    arms = {a: rows for a, rows in arms.items() if rows}
    levels = doc.judgement.levels
    verdicts = {lv.concurrency: f"{fmt.pct(lv.effect)} {lv.verdict}" for lv in levels}
    family = doc.judgement.family
    adjusted = (f"p adjusted for {family.size} comparisons ({family.method})" if doc.is_adjusted and family
                else "p adjusted for multiple comparisons" if doc.is_adjusted
                else "schema 1: p-values unadjusted for multiple comparisons")
    facts = " · ".join([f"created {when(doc.created)}", doc.engine_text(), doc.setup.measured_text() or "model ?",
                        f"source {doc.source.tool}", f"metric {doc.metric}", adjusted])
    chart = _drawn(svg.evidence_chart(arms, labels, doc.anomalies, verdicts, doc.metric)) if arms else None
    invalid = doc.validity.invalid
    rows = [LevelRow(lv, f"v-{lv.verdict.split()[0]}",
                     "; ".join(invalid[lv.concurrency]) if lv.concurrency in invalid else None,
                     doc.p_cell(lv) if doc.is_adjusted else None) for lv in levels]
    warnings = [f"invalid: {reason}" for reason in doc.validity.reasons]
    warnings += doc.unrecorded_notes()
    warnings += [f"@{row.concurrency}: {note}" for row in doc.validity.levels for note in row.not_applied]
    return EvidenceView(doc.id, f"{labels['B']} vs {labels['A']} on {doc.role}", facts, chart, rows,
                        [an.text() for an in doc.anomalies], warnings, list(doc.judgement.guards), _sweep_view(doc))


def _sweep_view(doc) -> SweepView | None:
    """A sweep's table (every arm's effect against the control per level, with the family's
    simultaneous intervals, and its fate) and its elimination timeline; None for an A/B."""
    block = doc.sweep
    if block is None:
        return None
    plan = block.plan
    rows = []
    for arm in plan.arms:
        cells = [SweepCell(f"v-{v.split()[0]}", fmt.pct(e), f"[{fmt.pct(i[0])}..{fmt.pct(i[1])}]" if i else None, v)
                 for _, e, i, v in block.cells(arm)]
        rows.append(SweepRow(plan.arm_text(arm), cells, block.fate(arm)))
    above = ("the confirming A/B" if block.confirm
             else f"the search runs of the control and {doc.arms['B'].label or 'B'}")
    line = (f"plan {plan.id} (committed {(block.plan_commit or 'not committed')[:10]}): delta {plan.delta:.1%}, "
            f"alpha {plan.alpha:g}, up to {plan.max_repeats} blocks, seed {plan.seed}; "
            f"the table above this one is {above}")
    return SweepView(len(plan.candidates), " (interrupted)" if block.status == "interrupted" else "", block.pick_text(),
                     list(plan.levels), rows, line, list(block.timeline()))


def _evidence_block(doc) -> str:
    """One evidence file's block of the page (its chart, levels, notes and sweep), as HTML."""
    return str(_env().get_template("evidence.html.j2").module.evidence_block(_evidence_view(doc)))


def _sweep_block(doc) -> str:
    """A sweep's part of an evidence block, as HTML; "" for an A/B."""
    view = _sweep_view(doc)
    return str(_env().get_template("evidence.html.j2").module.sweep_block(view)) if view else ""


# --------------------------------------------------------------------------- knobs

@dataclass
class KnobView:
    name: str
    knob: Any | None            # knobs.catalog.Knob; None: neither the catalog nor an engine registry has it
    facts: str                  # type, accepted values, risk, roles, where its description is from
    strip: Markup | None        # its value over time per role
    entries: list[Entry]        # newest first, at most HISTORY_ROWS
    older: int                  # entries not listed


def _knobs(src: Sources, opt: Options, scale: TimeScale | None) -> list[KnobView]:
    by_knob: dict[str, list] = {}
    for e in src.entries:
        if not opt.role or e.role == opt.role:
            by_knob.setdefault(e.knob, []).append(e)
    for row in src.declared:
        by_knob.setdefault(row.knob, [])
    return [_knob_view(src, name, by_knob[name], scale) for name in sorted(by_knob)]


def _knob_view(src: Sources, name: str, entries: list[Entry], scale: TimeScale | None) -> KnobView:
    knob = src.catalog.knobs.get(name)
    registry = src.registries.get(name)
    if knob is None and registry is not None:   # what `knobkeeper catalog NAME` describes too
        knob = src.catalog.get(name)
    facts = ""
    if knob is not None:
        origin = (f"from the {registry} registry, not curated in inventory/catalog.toml" if registry
                  else f"from {knob.source}")
        facts = f"{knob.type}, {knob.accepted()} · risk {knob.risk} · roles {', '.join(knob.roles)} · {origin}"
    strip = None
    if entries and scale is not None:
        per_role: dict[str, list[tuple[datetime, str]]] = {}
        for e in entries:
            shown = knob.display(e.new) if knob is not None else fmt.value(e.new)
            per_role.setdefault(e.role, []).append((e.moment, shown))
        strip = _drawn(svg.value_strip(sorted(per_role.items()), scale))
    return KnobView(name, knob, facts, strip, list(reversed(entries[-HISTORY_ROWS:])),
                    max(len(entries) - HISTORY_ROWS, 0))
