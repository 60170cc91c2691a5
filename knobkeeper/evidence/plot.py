"""`ab show --plot`: throughput vs concurrency for both arms, 95% intervals, anomalies marked."""

from __future__ import annotations

import math
from pathlib import Path

from scipy import stats

from knobkeeper import fmt
from knobkeeper.evidence import judge
from knobkeeper.evidence.model import Evidence, Run


def arm_levels(doc: Evidence, arm: str) -> list[tuple[int, float, float, float, int]]:
    """[(concurrency, geometric mean, ci_low, ci_high, n)] for one arm (t-interval on logs)."""
    metric = doc.metric
    invalid = {lv.concurrency for lv in doc.judgement.levels if not lv.valid}
    by: dict[int, list[Run]] = {}
    for r in doc.runs:
        if r.arm == arm and int(r.concurrency) not in invalid:
            by.setdefault(int(r.concurrency), []).append(r)
    out = []
    for conc in sorted(by):
        kept, _ = judge._drop_outliers(by[conc], metric)
        xs = [math.log(r.raw(metric)) for r in kept]
        if not xs:
            continue
        m = sum(xs) / len(xs)
        if len(xs) >= 2:
            sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
            half = float(stats.t.ppf(0.975, len(xs) - 1)) * sd / math.sqrt(len(xs))
        else:
            half = 0.0
        out.append((conc, math.exp(m), math.exp(m - half), math.exp(m + half), len(xs)))
    return out


def _label(doc: Evidence, arm: str) -> str:
    return f"{arm}: {doc.knob}={fmt.value(doc.value(arm))}"


def plot(doc: Evidence, path: str | Path) -> Path:
    """Write the PNG; returns its path."""
    # here, not at the top: matplotlib and pyplot cost ~0.8 s (-X importtime), paid only by `ab plot`
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display here

    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    colours = {"A": "#1f77b4", "B": "#d62728"}
    points: dict[tuple[str, int], float] = {}
    for arm in ("A", "B"):
        rows = arm_levels(doc, arm)
        if not rows:
            continue
        xs = [r[0] for r in rows]
        ys = [r[1] for r in rows]
        err = [[r[1] - r[2] for r in rows], [r[3] - r[1] for r in rows]]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=5, lw=2, color=colours[arm], label=_label(doc, arm))
        ax.fill_between(xs, [r[2] for r in rows], [r[3] for r in rows], color=colours[arm], alpha=0.15)
        points.update({(arm, r[0]): r[1] for r in rows})
    for lv in doc.judgement.levels:
        y = max(points.get(("A", lv.concurrency), 0), points.get(("B", lv.concurrency), 0))
        if y and lv.effect is not None:
            ax.annotate(f"{fmt.pct(lv.effect)}\n{lv.verdict}", (lv.concurrency, y),
                        textcoords="offset points", xytext=(0, 12), ha="center", fontsize=8)
    first = True
    for an in doc.anomalies:
        y0 = points.get((an.arm, an.from_concurrency))
        y1 = points.get((an.arm, an.to_concurrency))
        if y0 is None or y1 is None:
            continue
        conf = "" if an.confidence is None else f" ({an.confidence * 100:.0f}%)"
        ax.plot([an.from_concurrency, an.to_concurrency], [y0, y1], ls="--", lw=3, color="orange",
                label="anomaly: falls as concurrency rises" if first else None)
        ax.scatter([an.to_concurrency], [y1], marker="v", s=160, color="orange", zorder=5)
        ax.annotate(f"{an.arm}: {fmt.pct(an.change)}{conf}", (an.to_concurrency, y1),
                    textcoords="offset points", xytext=(0, -22), ha="center", fontsize=8, color="darkorange")
        first = False
    ax.set_xlabel("concurrency")
    ax.set_ylabel(f"{doc.metric} (geometric mean, 95% CI)")
    ax.set_title(f"{doc.knob} on {doc.role} — evidence {doc.id}")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
