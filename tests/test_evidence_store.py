"""Evidence store (load, list, summaries for other parts), `ab show` / `ab list`, and the PNG plot."""

from __future__ import annotations

import json
import math
import random
import struct
import zlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from knobkeeper.cli.ab import ab
from knobkeeper.errors import UserError
from knobkeeper.evidence import store
from knobkeeper.evidence.plot import plot

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def _doc(seed: int = 1):
    rng = random.Random(seed)
    base = {64: 5000.0, 80: 5600.0, 96: 5300.0}
    gain = {64: 0.128, 80: 0.0, 96: 0.057}
    runs = []
    for arm in ("A", "B"):
        for conc in (64, 80, 96):
            for rep in range(1, 5):
                v = base[conc] * (1 + (gain[conc] if arm == "B" else 0)) * math.exp(rng.gauss(0, 0.01))
                runs.append({"arm": arm, "repeat": rep, "concurrency": conc, "output_tokens_per_s": v,
                             "requests_per_s": v / 256, "ttft_ms": None, "itl_ms": None, "e2e_ms": None,
                             "completed": 100, "errors": 0})
    return store.build_doc(knob=KNOB, role="decode",
                           arms={"A": {"label": "baseline", "knobs": {KNOB: None}},
                                 "B": {"label": "candidate", "knobs": {KNOB: 512}}},
                           runs=runs, setup={"engine": "test"})


def test_summary_line_and_gains():
    doc = _doc()
    line = store.summary_line(doc)
    assert line.startswith("+1") and "@64 (95% CI +" in line and "better" in line
    assert "anomaly: A 96 < 80" in line
    g = store.gains(doc)
    assert [x.concurrency for x in g] == [64, 80, 96]
    assert {"concurrency", "effect", "ci_low", "ci_high", "verdict", "p_value", "p_adjusted", "adjusted",
            "regressions"} == set(g[0].to_json())
    assert g[0].ci_low < g[0].effect < g[0].ci_high
    assert store.commit_summary(doc).startswith(f"evidence: {KNOB}=512 on decode (+1")


def test_load_by_prefix_list_and_errors(project):
    d1, d2 = _doc(1), _doc(2)
    d2.id = d1.id[:3] + ("0" if d1.id[3] != "0" else "1") + d1.id[4:]
    store.write(project, d1)
    store.write(project, d2, no_commit=True)
    assert store.load(project, d1.id).id == d1.id
    with pytest.raises(UserError, match="ambiguous"):
        store.load(project, d1.id[:3])
    with pytest.raises(UserError, match="no such evidence"):
        store.load(project, "ffffffff" if not d1.id.startswith("ff") else "00000000")
    with pytest.raises(UserError, match="hex"):
        store.load(project, "zz")
    rows = store.list_all(project)
    assert {r.id for r in rows} == {d1.id, d2.id}
    out = CliRunner().invoke(ab, ["list", "--repo", str(project.root)])
    assert out.exit_code == 0 and d1.id in out.output and "(unset) -> 512" in out.output


def test_show_table_json_and_plot(project, tmp_path):
    doc = _doc()
    store.write(project, doc)
    runner = CliRunner()
    out = runner.invoke(ab, ["show", doc.id, "--repo", str(project.root)])
    assert out.exit_code == 0, out.output
    for needle in ("mean A", "95% CI", "better", "anomaly: arm A throughput at 96", "method: Welch"):
        assert needle in out.output
    out = runner.invoke(ab, ["show", doc.id, "--repo", str(project.root), "--json"])
    assert json.loads(out.output)["id"] == doc.id
    png = tmp_path / "plot.png"
    out = runner.invoke(ab, ["show", doc.id, "--repo", str(project.root), "--plot", str(png)])
    assert out.exit_code == 0 and png.exists()
    _check_png(png)
    out = runner.invoke(ab, ["show", "nothex!", "--repo", str(project.root)])
    assert out.exit_code == 2 and "expected hex digits" in out.output


def _check_png(path: Path) -> None:
    """A valid PNG, reasonably sized, with non-trivial pixel variance (not a blank canvas)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 2_000_000
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600 and height >= 400
    # every chunk's CRC holds and the file ends with IEND: the PNG was written whole
    at, kinds = 8, []
    while at < len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        assert zlib.crc32(kind + body) == crc, (kind, at)
        kinds.append(kind)
        at += 12 + length
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and at == len(data), kinds
    import matplotlib.image as mpimg

    pixels = mpimg.imread(path)
    assert pixels.shape[0] == height and pixels.shape[1] == width
    assert float(pixels[..., :3].std()) > 0.05
    # both arm colours and the anomaly colour are drawn
    rgb = (pixels[..., :3] * 255).round().astype(int).reshape(-1, 3)
    colours = {tuple(c) for c in rgb[:: max(1, len(rgb) // 200000)]}
    assert any(abs(r - 31) < 20 and abs(g - 119) < 20 and abs(b - 180) < 20 for r, g, b in colours)   # A blue
    assert any(abs(r - 214) < 20 and abs(g - 39) < 20 and abs(b - 40) < 20 for r, g, b in colours)    # B red
    assert any(r > 230 and 140 < g < 190 and b < 40 for r, g, b in colours)                            # anomaly


def test_plot_library_call(tmp_path):
    path = plot(_doc(), tmp_path / "sub" / "x.png")
    _check_png(path)


def test_judge_options_are_kept_and_verify_uses_them():
    """A doc judged with unit noise and a stricter alpha: both recorded, verify recomputes with them
    (and flags a doc whose options were edited), validate refuses a malformed option."""
    from knobkeeper.evidence.schema import validate

    rng = random.Random(3)
    runs = [{"arm": arm, "repeat": i + 1, "concurrency": 8, "output_tokens_per_s": 1000 * scale * math.exp(rng.gauss(0, 0.01)), "errors": 0}
            for arm, scale in (("A", 1.0), ("B", 1.04)) for i in range(10)]
    arms = {"A": {"label": "a", "knobs": {"K": None}}, "B": {"label": "b", "knobs": {"K": 1}}}
    plain = store.build_doc(knob="K", role="decode", arms=arms, runs=runs)
    doc = store.build_doc(knob="K", role="decode", arms=arms, runs=runs, judge_options={"unit_noise": 0.03, "alpha": 0.01})
    assert plain.judgement.levels[0].verdict == "better"
    assert doc.judgement.levels[0].verdict == "inconclusive" and doc.judgement.unit_noise == 0.03
    assert doc.judgement.alpha == 0.01 and store.verify(doc) == []
    edited = doc.to_json()
    del edited["judge_options"]
    assert store.verify(edited), "a judgement made with options must not verify without them"
    assert validate({**doc.to_json(), "judge_options": {"unit_noise": -1}})[0].startswith("judge_options:")
    assert validate({**doc.to_json(), "judge_options": {"alpha": 0}})[0].startswith("judge_options:")


def test_evidence_files_are_append_only_and_a_rejudgement_is_a_new_file(project):
    """`store.write` never replaces an evidence file (the store's own path to a forgery, issue 38);
    `ab rejudge ID` writes the runs of ID judged by today's method as a NEW file naming ID, commits
    it alone, and leaves ID byte for byte as it was, cited by the entries that cite it."""
    from knobkeeper.changelog import ops
    from knobkeeper.evidence import judge
    from knobkeeper.evidence.model import SCHEMA_1
    from knobkeeper.review.check import check
    from tests.infra import git, snapshot

    doc = _doc()
    path = store.write(project, doc)
    before = snapshot(project)
    with pytest.raises(UserError, match=f"already exists; evidence files are append-only .* `knobkeeper ab rejudge "
                                        f"{doc.id}`, which writes a new file; nothing written"):
        store.write(project, {**store.rejudge(doc).to_json(), "id": doc.id})
    refused = CliRunner().invoke(ab, ["rejudge", doc.id, "--repo", str(project.root)])  # today's method already
    assert refused.exit_code == 2 and "judges its runs as the file does" in refused.output, refused.output
    assert snapshot(project) == before

    # A schema-1 file (per level, unadjusted), committed by hand and cited by an entry.
    old = {k: v for k, v in doc.to_json().items() if k != "validity"}
    old.update(schema=SCHEMA_1, id="0a0a0a0a", judgement=judge.judge(doc.runs, doc.metric, adjust=False).to_json())
    old_path = path.with_name(path.name.replace(doc.id, "0a0a0a0a"))
    old_path.write_text(json.dumps(old, indent=2) + "\n")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-qm", "an old evidence file")
    entry = ops.set_knob(project, KNOB, "512", "decode", "A/B", evidence=["0a0a0a0a"], allow_undeclared=True).entry
    old_bytes = old_path.read_bytes()

    out = CliRunner().invoke(ab, ["rejudge", "0a0a", "--repo", str(project.root)])
    assert out.exit_code == 0, out.output
    new_id = out.output.split()[1]
    assert out.output.startswith(f"evidence {new_id}\nre-judges evidence 0a0a0a0a") and new_id != "0a0a0a0a"
    again = store.load(project, new_id)
    assert again.rejudges == "0a0a0a0a" and again.schema == "knobkeeper.evidence/2" and again.judgement.family
    assert again.departures_from(store.load(project, "0a0a0a0a")) == [] and again.created == doc.created
    assert old_path.read_bytes() == old_bytes
    message = git(project.root, "log", "-1", "--format=%B")
    assert message.startswith(f"evidence: {KNOB}=512 on decode (") and f"Rejudges: 0a0a0a0a" in message
    assert git(project.root, "show", "--name-only", "--format=", "HEAD").split() == [
        store.find(project, new_id).relative_to(project.root).as_posix()]
    assert [e.evidence for e in ops.load_entries(project) if e.id == entry.id] == [["0a0a0a0a"]]
    result = check(project)
    assert result.ok, [p.line() for p in result.problems]
