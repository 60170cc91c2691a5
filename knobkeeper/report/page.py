"""The report page: the facts of `sources.Sources` as one self-contained HTML document (inline
CSS, inline SVG, a few lines of inline JS for the tooltip panel; nothing is fetched)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from knobkeeper import fmt
from knobkeeper.audit.status import describe
from knobkeeper.report import svg
from knobkeeper.report.sources import Sources, arm_intervals
from knobkeeper.report.svg import Mark, Span, TimeScale, esc, to_dt, when

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


def render(src: Sources, opt: Options) -> str:
    empty = not (src.entries or src.incidents or src.evidence or src.records or src.declared)
    body = [_header(src, opt)]
    if empty:
        body.append('<section id="empty"><h2>Nothing to show yet</h2><p class="empty">This repository has no knob '
                    'changes, incidents, evidence or deploy records yet: set a knob (<code>knobkeeper set KNOB=VALUE '
                    '--role ROLE --reason ...</code>) or deploy, and the report fills in.</p></section>')
    else:
        marks, spans = _marks(src, opt)
        scale = _scale(marks, spans, src)
        body += [_now(src, opt), _timeline(src, opt, marks, spans, scale), _evidence(src, opt),
                 _knobs(src, opt, scale)]
    problems = src.problems + src.evidence_problems
    if problems:
        body.append('<section id="problems"><h2>Problems reading the changelog</h2><ul>'
                    + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul></section>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>knobkeeper report: {esc(opt.repo)}</title><style>{CSS}</style></head>'
            f'<body><div id="tip" role="status" aria-live="polite" hidden></div>{"".join(body)}'
            f'<script>{JS}</script></body></html>\n')


# --------------------------------------------------------------------------- header

def _header(src: Sources, opt: Options) -> str:
    bits = [f"generated {esc(when(opt.generated))}"]
    if opt.head:
        bits.append(f"at commit <code>{esc(opt.head[:12])}</code>")
    if opt.since:
        bits.append(f"timeline since {esc(when(opt.since))}")
    if opt.role:
        bits.append(f"role <b>{esc(opt.role)}</b> only")
    counts = (f"{len(src.entries)} entries, {len(src.incidents)} incidents, {len(src.evidence)} evidence files, "
              f"{len(src.records)} deploy records")
    nav = "".join(f'<a href="#{a}">{t}</a>' for a, t in (("now", "Now"), ("timeline", "Timeline"),
                                                        ("evidence", "Evidence"), ("knobs", "Knobs")))
    return (f'<header><h1>knobkeeper report <span class="repo">{esc(opt.repo)}</span></h1>'
            f'<p class="meta">{" · ".join(bits)} · {counts}</p><nav>{nav}</nav></header>')


# --------------------------------------------------------------------------- now

def _levels_summary(doc) -> str:
    """Every level's text (the evidence's one text per level), for a table cell or a tooltip."""
    return "; ".join(doc.level_text(lv) for lv in doc.judgement.levels) or "no levels"


def _entry_cell(entry) -> str:
    if entry is None:
        return '<td colspan="3" class="warn">no entry explains this value (run <code>knobkeeper record</code>)</td>'
    return (f'<td><a href="#entry-{esc(entry.id)}"><code>{esc(entry.id)}</code></a> {esc(entry.action)}</td>'
            f'<td>{esc(when(entry.time))}<br><span class="who">{esc(entry.author)}</span></td>'
            f'<td class="reason">{esc(entry.reason)}</td>')


def _now(src: Sources, opt: Options) -> str:
    docs = {d.id: d for d in src.evidence}
    out = ['<section id="now"><h2>Now</h2>']
    # what can be taken back first: the question the report is opened for
    out.append(_reclaim_now(src, opt))
    out.append(_incidents_now(src, opt))
    out.append(_reverts_now(src, opt))
    out.append("<h3>Declared knobs</h3>")
    if not src.declared:
        out.append('<p class="empty">No knob is declared in inventory/knobs.toml.</p>')
    else:
        out.append('<table><thead><tr><th>role</th><th>knob</th><th>value</th><th>entry</th><th>when, who</th>'
                   '<th>reason</th><th>evidence</th></tr></thead><tbody>')
        for row in src.declared:
            ev = []
            for ident in (row.entry.evidence if row.entry else []):
                doc = docs.get(ident)
                ev.append(f'<a href="#ev-{esc(ident)}"><code>{esc(ident)}</code></a> '
                          + (esc(_levels_summary(doc)) if doc else '<span class="warn">not readable</span>'))
            out.append(f'<tr><td>{esc(row.role)}</td><td><a href="#knob-{esc(row.knob)}"><code>{esc(row.knob)}</code>'
                       f'</a></td><td class="value">{esc(row.shown)}</td>{_entry_cell(row.entry)}'
                       f'<td>{"<br>".join(ev) or "—"}</td></tr>')
        out.append("</tbody></table>")
    out.append(_deploys_now(src, opt))
    out.append("</section>")
    return "".join(out)


def _deploys_now(src: Sources, opt: Options) -> str:
    last: dict[tuple[str, str], tuple[Any, dict]] = {}
    for record in src.records:
        for svc in record.services or []:
            if opt.role and svc.role != opt.role:
                continue
            key = (svc.host, svc.service)
            if svc.acted or key not in last:
                last[key] = (record, svc)
    observed = {(r.get("host"), r.get("service")): r for r in (opt.status_rows or [])}
    out = ["<h3>Last deploy per host and service</h3>"]
    if not last and not observed:
        return out[0] + '<p class="empty">No deploy record in changelog/deploys/ yet.</p>'
    out.append('<table><thead><tr><th>host</th><th>service</th><th>role</th><th>last start</th><th>gate</th>'
               '<th>deploy</th><th>state</th></tr></thead><tbody>')
    for key in sorted(set(last) | set(observed), key=lambda k: (str(k[0]), str(k[1]))):
        record, svc = last.get(key, (None, None))
        seen = observed.get(key)
        role = (svc.role if svc else None) or (seen or {}).get("role") or "?"
        gate = svc.gate.result if svc else None
        started = (svc.restart_issued_at if svc else None) or (record.started_at if record else None)
        if seen is not None:
            diffs = "; ".join(seen.get("differences") or [])
            state = f'<span class="state s-{esc(seen.get("state", "unknown").replace(" ", "-"))}">' \
                    f'{esc(seen.get("state", "unknown"))}</span> <span class="who">observed (status --json)' \
                    f'{": " + esc(diffs) if diffs else ""}</span>'
        elif record is not None:
            state = _started_state(src, record, svc, gate)
        else:
            state = "—"
        out.append(f'<tr><td>{esc(key[0])}</td><td>{esc(key[1])}</td><td>{esc(role)}</td>'
                   f'<td>{esc(when(started)) if started else "—"} {esc(svc.action if svc else "")}</td>'
                   f'<td><span class="gate g-{esc(gate or "none")}">{esc(gate or "—")}</span></td>'
                   f'<td>{"<code>" + esc(record.id) + "</code> " + esc(record.result) if record else "—"}</td>'
                   f'<td>{state}</td></tr>')
    out.append("</tbody></table>")
    return "".join(out)


def _started_state(src: Sources, record, svc, gate: str | None) -> str:
    """What the last deploy started a service with, against what a deploy would start it with now:
    `status`'s notion and words (Sources.started_drift), from the record alone."""
    if gate == "failed":
        return '<span class="state s-down">gate failed</span>'
    differ = src.started_drift.get((record.id, svc.host, svc.service))
    if isinstance(differ, str):
        return f'<span class="state s-unknown">declared state unknown</span> <span class="who">{esc(differ)}</span>'
    if differ is None:
        return (f'<span class="state s-unknown">not in {esc(record.inventory_path)} now</span> '
                f'<span class="who">the inventory no longer has this host and service</span>')
    if differ:
        return (f'<span class="state s-drifted">declared knobs changed since</span> '
                f'<span class="who">{esc("; ".join(differ))} (a deploy restarts it)</span>')
    return ('<span class="state s-in-sync">started with what is declared</span> '
            '<span class="who">from the deploy record; pass --status-json for the running state</span>')


def _reverts_for(src: Sources) -> dict[str, list]:
    per: dict[str, list] = {}
    for s in src.statuses.values():
        if s.revert.incident:
            per.setdefault(s.revert.incident, []).append(s)
    return per


def _status_badge(status: str) -> str:
    return f'<span class="badge st-{esc(status)}">{esc(describe(status))}</span>'


def _incidents_now(src: Sources, opt: Options) -> str:
    per = _reverts_for(src)
    open_ones = [i for i in src.incidents if i.resolution is None]
    out = [f"<h3>Open incidents ({len(open_ones)})</h3>"]
    if not open_ones:
        out.append('<p class="empty">No incident is open.</p>')
    for inc in open_ones:
        out.append(_incident_block(inc, per.get(inc.id, [])))
    resolved = [i for i in src.incidents if i.resolution is not None]
    if resolved:
        out.append(f"<details><summary>Resolved incidents ({len(resolved)})</summary>")
        out.extend(_incident_block(inc, per.get(inc.id, [])) for inc in reversed(resolved))
        out.append("</details>")
    return "".join(out)


def _incident_block(inc, reverts: list) -> str:
    lines = [f'<div class="incident" id="inc-{esc(inc.id)}"><b>{esc(inc.title)}</b> <code>{esc(inc.id)}</code> '
             f'<span class="badge {"st-open" if inc.resolution is None else "st-resolved"}">{esc(inc.status)}</span>'
             f'<br><span class="who">symptom began {esc(when(inc.started))}, opened {esc(when(inc.opened))} by '
             f'{esc(inc.opened_by)}</span><ul>']
    for note in inc.notes:
        judged = "".join(f" <b>{k} <code>{esc(v)}</code></b>" for k, v in (("refutes", note.refutes),
                                                                            ("confirms", note.confirms)) if v)
        lines.append(f"<li>{esc(when(note.time))} note by {esc(note.author)}: {esc(note.text)}{judged}</li>")
    if inc.resolution:
        res = inc.resolution
        lines.append(f"<li>{esc(when(res.time))} resolved by {esc(res.author)}: root cause <b>{esc(res.root_cause)}</b>"
                     + (f" (implicates {esc(', '.join(res.implicates))})" if res.implicates else "") + "</li>")
    for s in reverts:
        lines.append(f'<li>revert <a href="#revert-{esc(s.revert.id)}"><code>{esc(s.revert.id)}</code></a> of '
                     f'{esc(s.revert.knob)} on {esc(s.revert.role)}: {_status_badge(s.status)}</li>')
    lines.append("</ul></div>")
    return "".join(lines)


def _reverts_now(src: Sources, opt: Options) -> str:
    rows = [s for s in src.statuses.values() if not opt.role or s.revert.role == opt.role]
    rows.sort(key=lambda s: s.revert.time, reverse=True)
    out = [f"<h3>Reverts ({len(rows)})</h3>"]
    if not rows:
        return out[0] + '<p class="empty">No knob was reverted.</p>'
    out.append('<table><thead><tr><th>when</th><th>role</th><th>knob</th><th>took back</th><th>entry</th>'
               '<th>status</th><th>why</th></tr></thead><tbody>')
    for s in rows[:REVERT_ROWS]:
        r = s.revert
        out.append(f'<tr class="revert-row revert-{esc(s.status)}" id="revert-{esc(r.id)}"><td>{esc(when(r.time))}</td>'
                   f'<td>{esc(r.role)}</td><td><code>{esc(r.knob)}</code></td>'
                   f'<td class="value">{esc(fmt.value(r.old))} &rarr; {esc(fmt.value(r.new))}</td>'
                   f'<td><code>{esc(r.id)}</code></td><td>{_status_badge(s.status)}</td>'
                   f'<td class="reason">{esc(r.reason)}<br><span class="who">{esc(s.why)}</span></td></tr>')
    out.append("</tbody></table>")
    if len(rows) > REVERT_ROWS:
        out.append(f'<p class="who">{len(rows) - REVERT_ROWS} older reverts not listed (see <code>knobkeeper log'
                   f'</code>).</p>')
    return "".join(out)


def _reclaim_now(src: Sources, opt: Options) -> str:
    items = [r for r in src.reclaim.reclaimable if not opt.role or r.role == opt.role]
    confirmed = [r for r in src.reclaim.confirmed if not opt.role or r.role == opt.role]
    out = [f'<h3 id="reclaimable">Reclaimable ({len(items)})</h3>']
    if not items:
        out.append('<p class="empty">Nothing to reclaim: no revert of a knob with positive evidence is refuted, '
                   'suspected or unexplained.</p>')
    for item in items:
        out.append(_reclaim_item(item, confirmed=False))
    if confirmed:
        out.append(f"<h4>Not reclaimable: confirmed as the cause ({len(confirmed)})</h4>")
        out.extend(_reclaim_item(item, confirmed=True) for item in confirmed)
    return "".join(out)


def _reclaim_item(item, confirmed: bool) -> str:
    gains = sorted(item.gains, key=lambda g: g.concurrency)
    cells = "".join(f'<tr><td>{esc(g.concurrency)}</td><td class="gain">{fmt.pct(g.effect)}</td>'
                    f'<td>{g.ci_text()}</td></tr>' for g in gains)
    inc = item.status.incident
    inc_text = ""
    if inc is not None:
        res = f"resolved, root cause: {inc.resolution.root_cause}" if inc.resolution else "open"
        inc_text = f'<br>incident <a href="#inc-{esc(inc.id)}"><code>{esc(inc.id)}</code></a> {esc(inc.title)} ({esc(res)})'
    ev = " ".join(f'<a href="#ev-{esc(v.id)}"><code>{esc(v.id)}</code></a>'
                  + (f' <span class="warn">stale: {esc("; ".join(v.stale_why))}</span>' if v.stale else "")
                  + (f' <span class="who">{esc(v.version_note)}</span>' if v.version_note else "")
                  for v in item.evidence)
    command = item.command + (" --force" if confirmed else "")
    return (f'<div class="reclaim{" confirmed" if confirmed else ""}"><div><b>{esc(item.role)}</b>: '
            f'<code>{esc(item.knob)}={esc(fmt.value(item.value))}</code> (now {esc(fmt.value(item.current))}) '
            f'{_status_badge(item.status.status)}<br><span class="who">reverted {esc(when(item.revert.time))} by '
            f'{esc(item.revert.author)} (entry <code>{esc(item.revert.id)}</code>): {esc(item.revert.reason)}'
            f'<br>{esc(item.status.why)}{inc_text}<br>evidence {ev}</span></div>'
            f'<table class="gains"><thead><tr><th>concurrency</th><th>gain</th><th>95% CI</th></tr></thead>'
            f'<tbody>{cells}</tbody></table>'
            f'<p>restore{" only with --force" if confirmed else ""}: <code class="cmd">{esc(command)}</code></p></div>')


# --------------------------------------------------------------------------- timeline

def _entry_mark(ev, status) -> Mark:
    e = ev.data.get("entry") or {}
    look = e.get("action", "set")
    lines = [f"{when(ev.time)}  {e.get('role')}: {e.get('action')} {e.get('knob')} "
             f"{fmt.value(e.get('old'))} -> {fmt.value(e.get('new'))}",
             f"entry {e.get('id')} by {e.get('author')}", f"reason: {fmt.short(e.get('reason', ''), 300)}"]
    links = []
    if e.get("action") == "revert":
        st = status.status if status else "suspected"
        look = f"revert revert-{st}"
        lines.append(f"status: {st.upper()}: {status.why if status else ''}")
        if e.get("hypothesis"):
            lines.append(f"hypothesis: {e['hypothesis']}")
    for key in ("reverts", "restores", "refutes"):
        if e.get(key):
            lines.append(f"{key} entry {e[key]}")
    if e.get("incident"):
        lines.append(f"incident {e['incident']}")
        links.append(f"inc-{e['incident']}")
    for ident in e.get("evidence") or []:
        lines.append(f"evidence {ident}")
        links.append(f"ev-{ident}")
    links.append(f"knob-{e.get('knob')}")
    label = f"{e.get('action')} {fmt.short(fmt.value(e.get('new')), 12)}"
    if e.get("action") == "revert":
        label = f"revert: {status.status if status else 'suspected'}"
    return Mark(to_dt(ev.time), e.get("role") or "?", e.get("action", "set"), look, "\n".join(lines), links,
                e.get("id", ""), label)


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
    marks: list[Mark] = []
    for ev in src.events:
        if ev.kind == "knob":
            entry = ev.data.get("entry") or {}
            if opt.role and entry.get("role") != opt.role:
                continue
            marks.append(_entry_mark(ev, src.statuses.get(entry.get("id"))))
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


def _legend() -> str:
    items = []
    for look, label in LEGEND:
        kind = look.split()[0].replace("gate-passed", "")
        shape = svg._shape(kind if kind in ("revert", "restore", "restart", "evidence", "set") else "incident-note",
                           9, 9, False)
        items.append(f'<span class="key"><svg viewBox="0 0 18 18" width="18" height="18"><g class="mark {look}">'
                     f'{shape}</g></svg>{label}</span>')
    items.append('<span class="key"><svg viewBox="0 0 18 18" width="28" height="18"><rect class="span-key" x="0" '
                 'y="3" width="28" height="12" rx="3"/></svg>incident, symptom to resolution</span>')
    return f'<div class="legend">{"".join(items)}</div>'


def _timeline(src: Sources, opt: Options, marks: list[Mark], spans: list[Span], scale: TimeScale | None) -> str:
    out = ['<section id="timeline"><h2>Timeline</h2>']
    if not marks or scale is None:
        since = f" since {esc(when(opt.since))}" if opt.since else ""
        out.append(f'<p class="empty">No knob change, deploy, incident or evidence{since}.</p></section>')
        return "".join(out)
    for sp in spans:
        sp.start = max(sp.start, scale.lo)
        sp.end = sp.end or scale.hi
    lanes = _lanes(src, opt, marks)
    drawn = svg.timeline(lanes, marks, spans, scale)
    grouped = len(marks) - len(svg.group_marks(marks, scale))
    note = (f"<p class=\"who\">{len(marks)} events. Marks of one lane and look closer than {svg.GROUP_PX:g} px are drawn "
            f"as one larger, outlined mark ({grouped} events grouped; its tooltip counts them); hover or focus a mark for its entry, reason and "
            f"links.</p>" if grouped else
            f"<p class=\"who\">{len(marks)} events, one mark each; hover or focus (Tab) a mark for its entry, reason and "
            f"links.</p>")
    out += [_legend(), f'<div class="scroll">{drawn}</div>', note, "</section>"]
    return "".join(out)


# --------------------------------------------------------------------------- evidence

def _evidence(src: Sources, opt: Options) -> str:
    docs = [d for d in src.evidence if not opt.role or d.role == opt.role]
    out = [f'<section id="evidence"><h2>Evidence ({len(docs)})</h2>']
    if not docs:
        out.append('<p class="empty">No evidence file in changelog/evidence/ (see <code>knobkeeper ab run</code> and '
                   '<code>knobkeeper ab import</code>).</p>')
    for doc in reversed(docs):
        out.append(_evidence_block(doc))
    out.append("</section>")
    return "".join(out)


def _evidence_block(doc) -> str:
    labels = {arm: f"{arm}: {doc.knob}={fmt.value(doc.value(arm))}" for arm in ("A", "B")}
    arms = {arm: arm_intervals(doc, arm) for arm in ("A", "B")}
    arms = {a: rows for a, rows in arms.items() if rows}
    levels = doc.judgement.levels
    verdicts = {lv.concurrency: f"{fmt.pct(lv.effect)} {lv.verdict}" for lv in levels}
    family = doc.judgement.family
    adjusted = (f"p adjusted for {family.size} comparisons ({family.method})" if doc.is_adjusted and family
                else "p adjusted for multiple comparisons" if doc.is_adjusted
                else "schema 1: p-values unadjusted for multiple comparisons")
    head = (f'<div class="evidence" id="ev-{esc(doc.id)}"><h3><code>{esc(doc.id)}</code> {esc(labels["B"])} '
            f'vs {esc(labels["A"])} on {esc(doc.role)}</h3><p class="who">created {esc(when(doc.created))} · '
            f'{esc(doc.engine_text())} · {esc(doc.setup.measured_text() or "model ?")} · source {esc(doc.source.tool)}'
            f' · metric {esc(doc.metric)} · {esc(adjusted)}</p><div class="ev-body">')
    chart = svg.evidence_chart(arms, labels, doc.anomalies, verdicts, doc.metric) if arms else \
        '<p class="empty">No runs to plot.</p>'
    invalid = doc.validity.invalid
    rows = []
    for lv in levels:
        why = f' <span class="warn">invalid: {esc("; ".join(invalid[lv.concurrency]))}</span>' \
            if lv.concurrency in invalid else ""
        p_adj = esc(doc.p_cell(lv)) if doc.is_adjusted else '<span class="who">unadjusted</span>'
        rows.append(f'<tr class="level v-{esc(lv.verdict.split()[0])}"><td>{esc(lv.concurrency)}</td>'
                    f'<td class="gain">{fmt.pct(lv.effect)}</td><td>{lv.ci_text()}</td><td>{fmt.p_value(lv.p_value)}'
                    f'</td><td>{p_adj}</td><td>{esc(lv.verdict)}{why}</td></tr>')
    table = ('<table class="levels"><thead><tr><th>concurrency</th><th>effect</th><th>95% CI</th><th>p</th>'
             f'<th>p adjusted</th><th>verdict</th></tr></thead><tbody>{"".join(rows)}</tbody></table>')
    extra = [f'<li class="warn">&#9888; anomaly: {esc(an.text())}</li>' for an in doc.anomalies]
    extra += [f'<li class="warn">invalid: {esc(reason)}</li>' for reason in doc.validity.reasons]
    extra += [f'<li class="warn">{esc(note)}</li>' for note in doc.unrecorded_notes()]
    extra += [f'<li class="warn">@{esc(row.concurrency)}: {esc(note)}</li>'
              for row in doc.validity.levels for note in row.not_applied]
    guards = doc.judgement.guards
    if guards:
        grows = "".join(
            f'<tr class="{"regression" if g.regression else ""}"><td>{esc(g.metric)}</td>'
            f'<td>{esc(g.concurrency)}</td><td>{fmt.pct(g.effect)}</td>'
            f'<td>{g.ci_text()}</td><td>{fmt.p_value(g.p_adjusted)}</td>'
            f'<td>{esc(g.verdict)}{" <b>regression</b>" if g.regression else ""}</td></tr>' for g in guards)
        extra.append('<li>guard metrics:<table class="guards"><thead><tr><th>metric</th><th>concurrency</th>'
                     '<th>effect</th><th>95% CI</th><th>p adjusted</th><th>verdict</th></tr></thead>'
                     f'<tbody>{grows}</tbody></table></li>')
    return head + chart + f'<div>{table}<ul class="notes">{"".join(extra)}</ul></div></div>{_sweep_block(doc)}</div>'


def _sweep_block(doc) -> str:
    """A sweep's table (every arm's effect against the control per level, with the family's
    simultaneous intervals, and its fate) and its elimination timeline; "" for an A/B."""
    block = doc.sweep
    if block is None:
        return ""
    plan = block.plan
    rows = []
    for arm in plan.arms:
        cells = "".join(f'<td class="v-{esc(v.split()[0])}">{fmt.pct(e)}'
                        + (f' <span class="who">[{fmt.pct(i[0])}..{fmt.pct(i[1])}]</span>' if i else "")
                        + f' {esc(v)}</td>' for _, e, i, v in block.cells(arm))
        cells = cells or "".join("<td></td>" for _ in plan.levels)
        rows.append(f'<tr><td><code>{esc(plan.arm_text(arm))}</code></td>{cells}<td>{esc(block.fate(arm))}</td></tr>')
    head = "".join(f"<th>@{esc(c)} effect [simultaneous 95%] verdict</th>" for c in plan.levels)
    timeline = "".join(f"<li>{esc(line)}</li>" for line in block.timeline())
    status = " (interrupted)" if block.status == "interrupted" else ""
    return (f'<div class="sweep"><h4>sweep of {len(plan.candidates)} candidates{esc(status)}: '
            f'{esc(block.pick_text())}</h4><table class="levels"><thead><tr><th>arm</th>{head}<th>fate</th></tr>'
            f'</thead><tbody>{"".join(rows)}</tbody></table><p class="who">plan {esc(plan.id)} (committed '
            f'{esc((block.plan_commit or "not committed")[:10])}): delta {plan.delta:.1%}, alpha {plan.alpha:g}, up to '
            f'{plan.max_repeats} blocks, seed {plan.seed}; the table above this one is '
            f'{"the confirming A/B" if block.confirm else "the search runs of the control and " + esc(doc.arms["B"].label or "B")}'
            f'</p><ol class="notes">{timeline}</ol></div>')


# --------------------------------------------------------------------------- knobs

def _knobs(src: Sources, opt: Options, scale: TimeScale | None) -> str:
    by_knob: dict[str, list] = {}
    for e in src.entries:
        if not opt.role or e.role == opt.role:
            by_knob.setdefault(e.knob, []).append(e)
    for row in src.declared:
        by_knob.setdefault(row.knob, [])
    out = [f'<section id="knobs"><h2>Knobs ({len(by_knob)})</h2>']
    if not by_knob:
        out.append('<p class="empty">No knob has been changed.</p>')
    for name in sorted(by_knob):
        out.append(_knob_block(src, name, by_knob[name], scale))
    out.append("</section>")
    return "".join(out)


def _knob_block(src: Sources, name: str, entries: list, scale: TimeScale | None) -> str:
    knob = src.catalog.knobs.get(name)
    registry = src.registries.get(name)
    if knob is None and registry is not None:   # what `knobkeeper catalog NAME` describes too
        knob = src.catalog.get(name)
    if knob is not None:
        origin = (f"from the {registry} registry, not curated in inventory/catalog.toml" if registry
                  else f"from {knob.source}")
        doc = (f'<p class="doc">{esc(knob.doc)}</p><p class="who">{esc(knob.type)}, {esc(knob.accepted())} · risk '
               f'{esc(knob.risk)} · roles {esc(", ".join(knob.roles))} · {esc(origin)}</p>')
    else:
        doc = ('<p class="warn">not in the catalog (inventory/catalog.toml), nor in an imported engine registry '
               '(inventory/engines/)</p>')
    strip = ""
    if entries and scale is not None:
        per_role: dict[str, list[tuple[datetime, str]]] = {}
        for e in entries:
            shown = knob.display(e.new) if knob is not None else fmt.value(e.new)
            per_role.setdefault(e.role, []).append((e.moment, shown))
        strip = svg.value_strip(sorted(per_role.items()), scale)
    rows = []
    for e in reversed(entries[-HISTORY_ROWS:]):
        rows.append(f'<tr id="entry-{esc(e.id)}" class="a-{esc(e.action)}"><td>{esc(when(e.time))}</td><td>{esc(e.scope)}</td>'
                    f'<td>{esc(e.action)}</td><td class="value">{esc(fmt.value(e.old))} &rarr; {esc(fmt.value(e.new))}'
                    f'</td><td><code>{esc(e.id)}</code></td><td>{esc(e.author)}</td><td class="reason">{esc(e.reason)}'
                    + "".join(f' <a href="#ev-{esc(i)}">evidence <code>{esc(i)}</code></a>' for i in e.evidence)
                    + "</td></tr>")
    more = (f'<p class="who">{len(entries) - HISTORY_ROWS} older entries not listed: '
            f'<code>knobkeeper log {esc(name)}</code></p>' if len(entries) > HISTORY_ROWS else "")
    table = ('<table><thead><tr><th>when</th><th>role</th><th>action</th><th>value</th><th>entry</th><th>by</th>'
             f'<th>reason</th></tr></thead><tbody>{"".join(rows)}</tbody></table>' if rows else
             '<p class="empty">Declared, but no entry changed it.</p>')
    return (f'<div class="knob" id="knob-{esc(name)}"><h3><code>{esc(name)}</code></h3>{doc}'
            f'<div class="scroll">{strip}</div>{table}{more}</div>')


# --------------------------------------------------------------------------- style and script

CSS = """
:root{--fg:#1d2330;--muted:#5d6776;--line:#d8dde5;--bg:#fff;--alt:#f5f7fa;--blue:#2463c9;--green:#1f8a4c;
--red:#c62f2f;--orange:#d9822b;--purple:#7a4cc2;--teal:#138a8a}
*{box-sizing:border-box}body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);
margin:0;padding:0 24px 40px;background:var(--bg)}
header{position:sticky;top:0;background:var(--bg);border-bottom:1px solid var(--line);padding:10px 0 6px;z-index:2}
h1{font-size:20px;margin:0}h1 .repo{font-weight:400;color:var(--muted);font-size:15px}
h2{font-size:17px;margin:22px 0 8px;border-bottom:2px solid var(--line);padding-bottom:3px}
h3{font-size:15px;margin:16px 0 6px}h4{margin:12px 0 4px}
nav a{margin-right:14px;color:var(--blue);text-decoration:none}.meta{margin:2px 0;color:var(--muted)}
table{border-collapse:collapse;margin:4px 0 10px;font-size:13px}th,td{border-bottom:1px solid var(--line);
padding:3px 8px;text-align:left;vertical-align:top}th{background:var(--alt);font-weight:600}
code{font:12.5px ui-monospace,SFMono-Regular,Menlo,monospace}.cmd{background:#10243f;color:#e8f0ff;padding:3px 7px;
border-radius:4px;user-select:all}.who{color:var(--muted);font-size:12.5px}.reason{max-width:420px}
.value{font-family:ui-monospace,monospace}.warn{color:var(--red)}.empty{color:var(--muted);font-style:italic}
.badge{display:inline-block;padding:0 6px;border-radius:9px;font-size:12px;border:1px solid}
.st-refuted{color:var(--teal);border-color:var(--teal)}.st-confirmed{color:#fff;background:var(--red);border-color:var(--red)}
.st-suspected{color:var(--orange);border-color:var(--orange)}.st-unexplained{color:var(--muted);border-color:var(--muted)}
.st-open{color:#fff;background:var(--red);border-color:var(--red)}.st-resolved{color:var(--green);border-color:var(--green)}
.state{font-weight:600}.s-in-sync{color:var(--green)}.s-drifted{color:var(--orange)}.s-down,.s-unknown{color:var(--red)}
.gate{font-weight:600}.g-passed{color:var(--green)}.g-failed{color:var(--red)}
.incident{border-left:3px solid var(--red);padding:2px 10px;margin:6px 0}.incident ul{margin:4px 0;padding-left:18px}
.reclaim{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start;border:1px solid var(--line);border-left:4px solid
var(--green);border-radius:4px;padding:8px 12px;margin:8px 0}.reclaim.confirmed{border-left-color:var(--red)}
.reclaim p{flex-basis:100%;margin:2px 0}.gain{font-weight:600}.v-better .gain{color:var(--green)}.v-worse .gain{color:var(--red)}
.scroll{overflow-x:auto}svg{display:block;max-width:100%;height:auto;font-size:11px}
svg.timeline{min-width:900px}.lane{fill:#fff}.lane.alt{fill:var(--alt)}.lane-label{font-weight:600;fill:var(--fg);font-size:12px}
.axis{stroke:#8a94a3}.grid{stroke:#e4e8ee}.tick{fill:var(--muted);font-size:11px}
.mark{cursor:pointer;outline:none}.mark:focus>*,.mark:hover>*{stroke:#000;stroke-width:2}
.mark.set circle{fill:var(--blue)}.mark.unset circle{fill:#fff;stroke:var(--blue);stroke-width:2}
.mark.record rect{fill:#8a94a3}.mark.restore path{fill:var(--green)}
.revert-refuted path{fill:#fff;stroke:var(--teal);stroke-width:2.5;stroke-dasharray:3 2}
.revert-confirmed path{fill:var(--red);stroke:#7a1212;stroke-width:1.5}.revert-suspected path{fill:var(--orange)}
.revert-unexplained path{fill:#9aa3af}.gate-passed rect{fill:var(--green)}.gate-failed rect{fill:var(--red)}
.mark.restart rect,.mark.deploy rect{fill:#9aa3af}.mark.restart.gate-passed rect,.mark.deploy.gate-passed rect{fill:var(--green)}
.mark.restart.gate-failed rect,.mark.deploy.gate-failed rect{fill:var(--red)}.mark.evidence rect{fill:var(--purple)}
.incident-note circle{fill:#f2c94c;stroke:#a07d10}.incident-note.refutes circle{fill:var(--teal);stroke:#0b5c5c}
.incident-note.confirms circle{fill:var(--red)}.incident-opened rect,.incident-started rect{fill:var(--red)}
.incident-resolved rect{fill:var(--green)}.mark.grouped>*{stroke:#1d2330;stroke-width:1}
.span rect,.span-key{fill:rgba(198,47,47,.13);stroke:rgba(198,47,47,.55)}.span.open rect{stroke-dasharray:4 3}
.span-label{fill:#8f1f1f;font-size:11px}.mark-label{font-size:10px;fill:var(--muted);stroke:none}
.mark:focus .mark-label,.mark:hover .mark-label{stroke:none;fill:var(--fg)}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;margin:4px 0 6px;font-size:12px}.key{display:inline-flex;align-items:center;gap:4px}
.key svg{display:inline}
#tip{position:fixed;right:16px;bottom:16px;max-width:520px;background:#10243f;color:#e8f0ff;padding:8px 11px;
border-radius:6px;white-space:pre-wrap;font:12.5px/1.4 ui-monospace,monospace;z-index:3;box-shadow:0 3px 14px rgba(0,0,0,.3)}
#tip a{color:#9cc3ff;margin-right:10px}
.evidence{border-top:1px solid var(--line);padding-top:4px}.ev-body{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}
svg.chart{width:560px}.arm-A{stroke:var(--blue);fill:var(--blue)}.arm-B{stroke:var(--red);fill:var(--red)}
.arm .line{fill:none;stroke-width:2}.arm text{stroke:none}.ci{stroke-width:1.6}.point{outline:none}
.point:focus circle,.point:hover circle{r:6}.legend{fill:var(--fg)}
.anomaly line{stroke:var(--orange);stroke-width:3;stroke-dasharray:5 3}.anomaly text{fill:#a35a0c;font-weight:600}
.verdict-label{font-size:10.5px;fill:var(--muted)}.verdict-label.v-better{fill:var(--green)}.verdict-label.v-worse{fill:var(--red)}
.notes{padding-left:18px;margin:4px 0}tr.regression td{color:var(--red)}
.knob{border-top:1px solid var(--line);padding-top:2px}.doc{margin:2px 0}
.seg{stroke:#fff;stroke-width:.5}.seg.c0{fill:#9cc3ff}.seg.c1{fill:#ffd08a}.seg.c2{fill:#a7e0b8}.seg.c3{fill:#e3b6f2}
.seg.c4{fill:#f7a8a8}.seg.c5{fill:#b7d7d8}.seg.c6{fill:#e6e1a1}.seg.c7{fill:#cfd5de}.seg.unset{fill:#eef0f3}
.seg.many{fill:#c3c9d2}.seg-label{font:11px ui-monospace,monospace;fill:var(--fg)}
"""

# Shows a mark's details (its <title>) in a panel on hover and on keyboard focus, with its links.
JS = r"""
(function(){var tip=document.getElementById('tip');
function show(g){var t=g.querySelector('title');if(!t)return;tip.textContent=t.textContent;
var links=(g.getAttribute('data-links')||'').split(' ').filter(Boolean);
if(links.length){var p=document.createElement('div');links.forEach(function(id){if(!document.getElementById(id))return;
var a=document.createElement('a');a.href='#'+id;a.textContent=id.replace(/^ev-/,'evidence ').replace(/^inc-/,'incident ')
.replace(/^knob-/,'knob ');p.appendChild(a);});tip.appendChild(p);}tip.hidden=false;}
function target(e){return e.target.closest?e.target.closest('.mark,.span,.point,.anomaly'):null;}
document.addEventListener('mouseover',function(e){var g=target(e);if(g)show(g);});
document.addEventListener('focusin',function(e){var g=target(e);if(g)show(g);});
document.addEventListener('keydown',function(e){if(e.key==='Escape')tip.hidden=true;});})();
"""
