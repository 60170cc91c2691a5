"""Issue 25 finding 7: changelog files that are symbolic links, or resolve outside the repository,
are refused by every reader and named once each by `check` and by `report` (under its problems,
instead of aborting). No process is started but git and the CLI."""

from __future__ import annotations

import json

from knobkeeper.changelog import ops
from knobkeeper.deploy.record import load_records
from knobkeeper.evidence import store
from knobkeeper.report import write_report
from knobkeeper.review.check import check
from tests.infra import cli, git, one_line_exit_2
from tests.review_fixtures import ctas_runs

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


def test_links_are_refused_by_readers_and_named_once_by_check_and_report(project, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    ops.set_knob(project, KNOB, "512", "decode", "a plain entry", allow_undeclared=True)

    # An outside entry that parses (its reason must never be read), and one to /etc/passwd.
    stolen = outside / "entry.toml"
    stolen.write_text('id = "0badc0de"\ntime = "2026-11-30T10:00:00.000000Z"\nauthor = "x <x@x>"\n'
                      'action = "set"\nknob = "NCCL_DEBUG"\nrole = "decode"\nreason = "OUTSIDE-MARKER"\nnew = "INFO"\n')
    entry_link = project.entries_dir / "20261130T100000.000000Z-0badc0de.toml"
    passwd_link = project.entries_dir / "20261130T100001.000000Z-0badf00d.toml"
    entry_link.symlink_to(stolen)
    passwd_link.symlink_to("/etc/passwd")
    # Evidence that would load, kept outside; an incident; a deploy record; and a dangling link.
    doc = store.build_doc(knob=KNOB, role="decode", runs=ctas_runs(),
                          arms={"A": {"label": "a", "knobs": {KNOB: None}}, "B": {"label": "b", "knobs": {KNOB: 512}}})
    (outside / "ev.json").write_text(json.dumps(doc.to_json()))
    evidence_link = project.evidence_dir / f"20261130T100000.000000Z-{doc.id}.json"
    evidence_link.symlink_to(outside / "ev.json")
    incident_link = project.incidents_dir / "20261130T100000.000000Z-1dead1de.toml"
    incident_link.symlink_to(outside / "missing.toml")            # dangling, as in a fresh clone
    record_link = project.deploys_dir / "20261130T100000.000000Z-2dead2de.json"
    record_link.symlink_to(outside / "ev.json")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-qm", "links")
    links = [entry_link, passwd_link, evidence_link, incident_link, record_link]

    lines = [p.line() for p in check(project).problems]
    for link in links:
        rel = project.rel(link)
        hits = [line for line in lines if rel in line]
        assert len(hits) == 1 and "a symbolic link (to " in hits[0] and "plain files in the repository" in hits[0], \
            (rel, lines)
    assert len(lines) == len(links), lines                         # nothing else: no "fails to render"
    assert not any("render" in line for line in lines), lines

    # The readers: the log leaves the outside entry out, `show` of it is refused in one line, the
    # store and the deploy records do not read the links.
    log = cli(project, "log")
    assert log.returncode == 0 and b"OUTSIDE-MARKER" not in log.stdout and b"0badc0de" not in log.stdout
    one_line_exit_2(cli(project, "show", "0badc0de"), "a symbolic link")
    assert store.paths(project) == [] and load_records(project) == []
    shown = cli(project, "ab", "show", doc.id)
    assert shown.returncode == 2 and b"Traceback" not in shown.stderr

    # The report is written, with one problem line per link.
    html = write_report(project, tmp_path / "report.html").path.read_text()
    problems = html.split('id="problems"', 1)[1].split("</section>", 1)[0]
    for link in links:
        assert problems.count(project.rel(link)) == 1, (link, problems)
    assert "OUTSIDE-MARKER" not in html


def test_a_folder_linked_out_of_the_repo_is_one_problem(project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "20261130T100000.000000Z-3dead3de.toml").write_text("id = 1\n")
    for child in project.incidents_dir.iterdir():
        child.unlink()
    project.incidents_dir.rmdir()
    project.incidents_dir.symlink_to(elsewhere)
    lines = [p.line() for p in check(project).problems]
    assert lines == [f"{project.rel(project.incidents_dir)}: a symbolic link (to {elsewhere}); "
                     f"changelog files are plain files in the repository (a clone gets nothing behind a link): "
                     f"replace it with the file itself or delete it"], lines
