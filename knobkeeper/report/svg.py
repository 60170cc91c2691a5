"""Inline SVG for the report: a UTC time axis, the timeline lanes (marks that would overlap are
grouped), the evidence chart and a knob's value strip. Pure functions from plain data to text;
every string that came from a file goes through `esc`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from knobkeeper import fmt

# Marks of one lane and one kind closer than this many pixels become one grouped mark.
GROUP_PX = 8.0
# With at most this many marks drawn, each single mark gets its label (the story reads without hovering).
LABELLED = 40
WIDTH = 1200
LEFT = 118
RIGHT = 14
LANE_H = 40


def esc(text) -> str:
    """Untrusted text for HTML/SVG text and attribute values: controls and bidi shown, markup escaped."""
    return html.escape(fmt.safe(text), quote=True)


def esc_block(text) -> str:
    """Like `esc`, but newlines stay newlines (for multi-line tooltips)."""
    return "\n".join(esc(line) for line in str(text).split("\n"))


def when(iso_text: str | None) -> str:
    """`2026-11-29 16:52:54Z` from an iso time (the report's one way to show a time)."""
    if not iso_text:
        return "?"
    return f"{iso_text[:10]} {iso_text[11:19]}Z"


def to_dt(iso_text: str) -> datetime:
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00"))


@dataclass
class TimeScale:
    lo: datetime
    hi: datetime
    x0: float = LEFT
    x1: float = WIDTH - RIGHT

    @classmethod
    def around(cls, times: list[datetime]) -> "TimeScale":
        lo, hi = min(times), max(times)
        span = hi - lo
        pad = max(span * 0.03, timedelta(seconds=1))
        return cls(lo - pad, hi + pad)

    def x(self, moment: datetime) -> float:
        total = (self.hi - self.lo).total_seconds() or 1.0
        return self.x0 + (self.x1 - self.x0) * (moment - self.lo).total_seconds() / total

    def ticks(self, most: int = 9) -> list[tuple[float, str]]:
        total = (self.hi - self.lo).total_seconds()
        steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200,
                 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400, 91 * 86400, 365 * 86400]
        step = next((s for s in steps if total / s <= most), steps[-1])
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        first = math.ceil((self.lo - epoch).total_seconds() / step) * step
        out = []
        t = first
        while epoch + timedelta(seconds=t) <= self.hi:
            moment = epoch + timedelta(seconds=t)
            if step < 60:
                label = moment.strftime("%H:%M:%S")
            elif step < 86400:
                label = moment.strftime("%m-%d %H:%M")
            else:
                label = moment.strftime("%Y-%m-%d")
            out.append((self.x(moment), label))
            t += step
        return out


def axis(scale: TimeScale, top: float, bottom: float) -> str:
    parts = [f'<line class="axis" x1="{scale.x0:.1f}" y1="{bottom:.1f}" x2="{scale.x1:.1f}" y2="{bottom:.1f}"/>']
    for x, label in scale.ticks():
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bottom:.1f}"/>'
                     f'<text class="tick" x="{x:.1f}" y="{bottom + 14:.1f}" text-anchor="middle">{label}</text>')
    parts.append(f'<text class="tick" x="{scale.x1:.1f}" y="{bottom + 28:.1f}" text-anchor="end">UTC</text>')
    return "".join(parts)


# --------------------------------------------------------------------------- timeline

@dataclass
class Mark:
    """One event on a lane. `group` names what may merge with it (same lane, same look)."""

    time: datetime
    lane: str
    kind: str            # set | unset | record | restore | revert | restart | deploy | evidence | incident-*
    look: str            # css class: the colour/shape variant (e.g. revert-refuted, gate-failed)
    text: str            # the tooltip: entry, reason, links in words
    links: list[str] = field(default_factory=list)   # page anchors: ev-ID, inc-ID, entry-ID
    ident: str = ""
    label: str = ""      # a few words under the mark, drawn when the timeline has room for them


@dataclass
class Span:
    start: datetime
    end: datetime
    open: bool
    label: str
    anchor: str


def _shape(kind: str, x: float, y: float, big: bool) -> str:
    r = 7.0 if big else 5.0
    if kind in ("set", "unset"):
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}"/>'
    if kind == "revert":
        return f'<path d="M{x:.1f} {y - r - 1:.1f}L{x + r + 1:.1f} {y:.1f}L{x:.1f} {y + r + 1:.1f}L{x - r - 1:.1f} {y:.1f}Z"/>'
    if kind == "restore":
        return f'<path d="M{x:.1f} {y - r - 1:.1f}L{x + r + 1:.1f} {y + r:.1f}L{x - r - 1:.1f} {y + r:.1f}Z"/>'
    if kind in ("restart", "deploy"):
        return f'<rect x="{x - 2:.1f}" y="{y - r - 4:.1f}" width="4" height="{2 * r + 8:.1f}"/>'
    if kind == "evidence":
        return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}" rx="2"/>'
    if kind == "incident-note":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r - 1}"/>'
    if kind == "incident-started":
        return f'<rect x="{x - 1.5:.1f}" y="{y - r - 4:.1f}" width="3" height="{2 * r + 8:.1f}"/>'
    return f'<rect x="{x - r:.1f}" y="{y - r:.1f}" width="{2 * r:.1f}" height="{2 * r:.1f}"/>'


def group_marks(marks: list[Mark], scale: TimeScale) -> list[tuple[float, list[Mark]]]:
    """Marks of the same lane and look within GROUP_PX of the first of their run, as one."""
    by_key: dict[tuple[str, str], list[Mark]] = {}
    for m in sorted(marks, key=lambda m: m.time):
        by_key.setdefault((m.lane, m.look), []).append(m)
    out: list[tuple[float, list[Mark]]] = []
    for group in by_key.values():
        run: list[Mark] = []
        start = 0.0
        for m in group:
            x = scale.x(m.time)
            if run and x - start > GROUP_PX:
                out.append((start, run))
                run = []
            if not run:
                start = x
            run.append(m)
        if run:
            out.append((start, run))
    return out


def _group_text(run: list[Mark]) -> str:
    if len(run) == 1:
        return run[0].text
    first, last = run[0], run[-1]
    lines = [f"{len(run)} events from {when(_iso(first.time))} to {when(_iso(last.time))} (grouped: closer than "
             f"{GROUP_PX:g} px on this axis; narrow the window with --since to see each one)"]
    lines += [m.text.split("\n", 1)[0] for m in run[:3]]
    if len(run) > 4:
        lines.append(f"... {len(run) - 4} more ...")
    if len(run) > 3:
        lines.append(last.text.split("\n", 1)[0])
    return "\n".join(lines)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def timeline(lanes: list[str], marks: list[Mark], spans: list[Span], scale: TimeScale) -> str:
    """The timeline SVG: lane 'incidents' holds the spans, every lane its grouped marks."""
    top = 10
    ys = {lane: top + LANE_H * i + LANE_H / 2 for i, lane in enumerate(lanes)}
    bottom = top + LANE_H * len(lanes)
    height = bottom + 36
    out = [f'<svg class="timeline" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="timeline: '
           f'{len(marks)} events in {len(lanes)} lanes">']
    for i, lane in enumerate(lanes):
        y = top + LANE_H * i
        out.append(f'<rect class="lane{" alt" if i % 2 else ""}" x="0" y="{y}" width="{WIDTH}" height="{LANE_H}"/>'
                   f'<text class="lane-label" x="8" y="{ys[lane] + 4:.1f}">{esc(lane)}</text>')
    out.append(axis(scale, top, bottom))
    if "incidents" in ys:
        y = ys["incidents"]
        for sp in spans:
            x0, x1 = scale.x(sp.start), scale.x(sp.end)
            width = max(x1 - x0, 2.0)
            cls = "span open" if sp.open else "span"
            out.append(f'<g class="{cls}"><title>{esc_block(sp.label)}</title>'
                       f'<rect x="{x0:.1f}" y="{y - 13:.1f}" width="{width:.1f}" height="26" rx="3"/>')
            if width > 70:
                room = int(width / 6.5)
                out.append(f'<text class="span-label" x="{x0 + 4:.1f}" y="{y - 15:.1f}">'
                           f'{esc(fmt.short(sp.label.split(chr(10))[0], room))}</text>')
            out.append("</g>")
    groups = group_marks(marks, scale)
    labelled = len(groups) <= LABELLED
    for x, run in groups:
        m = run[0]
        y = ys.get(m.lane, ys[lanes[-1]])
        links = " ".join(dict.fromkeys(link for r in run[:20] for link in r.links))
        ident = f' data-id="{esc(m.ident)}"' if len(run) == 1 and m.ident else ""
        grouped = " grouped" if len(run) > 1 else ""
        out.append(f'<g class="mark {m.look}{grouped}" tabindex="0" data-kind="{m.kind}" data-count="{len(run)}"{ident} '
                   f'data-links="{esc(links)}"><title>{esc_block(_group_text(run))}</title>'
                   f'{_shape(m.kind, x, y, len(run) > 1)}')
        if labelled and m.label and len(run) == 1:
            out.append(f'<text class="mark-label" x="{x:.1f}" y="{y + 17:.1f}" text-anchor="middle">{esc(m.label)}</text>')
        out.append("</g>")
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------- evidence chart

def evidence_chart(arms: dict[str, list[tuple[int, float, float, float, int]]], labels: dict[str, str],
                   anomalies: list, verdicts: dict[int, str], metric: str) -> str:
    """Throughput against concurrency for A and B, 95% intervals as bars, anomalies flagged."""
    w, h, left, right, top, bottom = 560, 320, 64, 16, 46, 46
    inset = 44   # room for the verdict labels under the first and last level
    points = [p for rows in arms.values() for p in rows]
    concs = sorted({p[0] for p in points})
    lo = min(p[2] for p in points)
    hi = max(p[3] for p in points)
    pad = (hi - lo) * 0.12 or hi * 0.05 or 1.0
    # Throughput, TTFT, TPOT: never below 0, so neither is the axis (a padded one read -31 tok/s).
    lo, hi = max(0.0, lo - pad), hi + pad

    def x(c: int) -> float:
        if len(concs) == 1:
            return (left + w - right) / 2
        return left + inset + (w - left - right - 2 * inset) * concs.index(c) / (len(concs) - 1)

    def y(v: float) -> float:
        return top + (h - top - bottom) * (hi - v) / (hi - lo)

    out = [f'<svg class="chart" viewBox="0 0 {w} {h}" role="img" aria-label="{esc(metric)} against concurrency">']
    for i in range(5):
        v = lo + (hi - lo) * i / 4
        out.append(f'<line class="grid" x1="{left}" y1="{y(v):.1f}" x2="{w - right}" y2="{y(v):.1f}"/>'
                   f'<text class="tick" x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    for c in concs:
        out.append(f'<text class="tick" x="{x(c):.1f}" y="{h - bottom + 16}" text-anchor="middle">{c}</text>')
        if c in verdicts:
            out.append(f'<text class="verdict-label v-{esc(verdicts[c].split()[0])}" x="{x(c):.1f}" '
                       f'y="{h - bottom + 30}" text-anchor="middle">{esc(verdicts[c])}</text>')
    out.append(f'<text class="tick" x="{(left + w) / 2:.0f}" y="{h - 2}" text-anchor="middle">concurrency</text>')
    out.append(f'<line class="axis" x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}"/>')
    where: dict[tuple[str, int], tuple[float, float]] = {}
    for arm, rows in arms.items():
        shift = -4 if arm == "A" else 4
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(c) + shift:.1f} {y(m):.1f}" for i, (c, m, *_r) in enumerate(rows))
        out.append(f'<g class="arm arm-{arm}"><path class="line" d="{path}"/>')
        for c, m, l, u, n in rows:
            cx = x(c) + shift
            where[(arm, c)] = (cx, y(m))
            out.append(f'<g class="point" tabindex="0"><title>{esc(labels[arm])} at concurrency {c}: {m:,.1f} '
                       f'(95% interval {l:,.1f}..{u:,.1f}, n={n})</title>'
                       f'<line class="ci" x1="{cx:.1f}" y1="{y(l):.1f}" x2="{cx:.1f}" y2="{y(u):.1f}"/>'
                       f'<line class="ci" x1="{cx - 4:.1f}" y1="{y(l):.1f}" x2="{cx + 4:.1f}" y2="{y(l):.1f}"/>'
                       f'<line class="ci" x1="{cx - 4:.1f}" y1="{y(u):.1f}" x2="{cx + 4:.1f}" y2="{y(u):.1f}"/>'
                       f'<circle cx="{cx:.1f}" cy="{y(m):.1f}" r="4"/></g>')
        out.append("</g>")
    for an in anomalies:
        a, b = where.get((an.arm, an.from_concurrency)), where.get((an.arm, an.to_concurrency))
        if a is None or b is None:
            continue
        out.append(f'<g class="anomaly" tabindex="0"><title>anomaly: {esc(an.text())}'
                   f'</title><line x1="{a[0]:.1f}" y1="{a[1]:.1f}" x2="{b[0]:.1f}" y2="{b[1]:.1f}"/>'
                   f'<text x="{b[0]:.1f}" y="{b[1] + 20:.1f}" text-anchor="middle">&#9888; {esc(an.arm)} '
                   f'{fmt.pct(an.change)}</text></g>')
    lx = left + 8
    for i, arm in enumerate(arms):
        out.append(f'<g class="arm arm-{arm}"><circle cx="{lx}" cy="{8 + 16 * i}" r="4"/>'
                   f'<text class="legend" x="{lx + 10}" y="{12 + 16 * i}">{esc(labels[arm])}</text></g>')
    out.append("</svg>")
    return "".join(out)


# --------------------------------------------------------------------------- value strip

def value_strip(rows: list[tuple[str, list[tuple[datetime, str]]]], scale: TimeScale) -> str:
    """Per role, the knob's value as coloured segments over time (segments under 2 px merge)."""
    row_h = 26
    height = 10 + row_h * len(rows) + 34
    out = [f'<svg class="strip" viewBox="0 0 {WIDTH} {height}" role="img" aria-label="value over time">']
    palette: dict[str, int] = {}
    for i, (role, changes) in enumerate(rows):
        y = 10 + row_h * i
        out.append(f'<text class="lane-label" x="8" y="{y + 17}">{esc(role)}</text>')
        segments = []
        for j, (start, value) in enumerate(changes):
            end = changes[j + 1][0] if j + 1 < len(changes) else scale.hi
            if end < scale.lo:
                continue   # before the window (--since): only the value it had at the start shows
            segments.append((max(scale.x(start), scale.x0), scale.x(end), value))
        merged: list[tuple[float, float, str]] = []
        for x0, x1, value in segments:
            if merged and (x1 - x0 < 2 or merged[-1][1] - merged[-1][0] < 2) and merged[-1][2] != value:
                # too narrow to tell apart: shown as one hatched "changing" stretch
                merged[-1] = (merged[-1][0], x1, "\x00many")
            else:
                merged.append((x0, x1, value))
        for x0, x1, value in merged:
            if value == "\x00many":
                out.append(f'<rect class="seg many" x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1):.1f}" height="20">'
                           f'<title>many changes (see the entries below)</title></rect>')
                continue
            colour = palette.setdefault(value, len(palette) % 8)
            unset = " unset" if value == fmt.UNSET else ""
            out.append(f'<g><title>{esc(value)}</title><rect class="seg c{colour}{unset}" x="{x0:.1f}" y="{y + 3}" '
                       f'width="{max(x1 - x0, 1):.1f}" height="20"/>')
            if x1 - x0 > 8 * len(value) + 8:
                out.append(f'<text class="seg-label" x="{x0 + 4:.1f}" y="{y + 17}">{esc(value)}</text>')
            out.append("</g>")
    out.append(axis(scale, 10, 10 + row_h * len(rows)))
    out.append("</svg>")
    return "".join(out)
