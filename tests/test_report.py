"""`knobkeeper report`: the field story's page opened in a real headless Chromium (no errors, no
network, the numbers in the DOM, one timeline mark per event, a screenshot), hostile strings,
the empty repository, bad input, and the parts that need no browser (grouping, schema 2)."""

from __future__ import annotations

import copy
import json
import re
import struct
from datetime import datetime, timedelta, timezone

import pytest

from knobkeeper import audit
from knobkeeper.changelog import incidents, ops
from knobkeeper.report import page, svg, write_report
from tests import fieldstory
from tests.browser import Chromium
from tests.infra import git, kk, make_infra_repo

KNOB = fieldstory.KNOB
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def story(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("story")
    project = make_infra_repo(tmp)
    told = fieldstory.build(project, tmp)
    written = write_report(project, tmp / "report.html")
    return project, told, written.path


@pytest.fixture(scope="module")
def browser():
    with Chromium(1280, 800) as chromium:
        yield chromium


def open_clean(browser, path):
    """The page loaded with no console/JS error and no request but its own file:// URL."""
    tab = browser.open(path.as_uri())
    assert tab.errors == []
    assert tab.requests == [path.as_uri()]
    return tab


def png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------- the field story in a browser

def test_field_story_page_holds_the_numbers(story, browser, tmp_path):
    project, told, path = story
    tab = open_clean(browser, path)
    gains = tab.evaluate("[...document.querySelectorAll('.reclaim table.gains tbody tr')]"
                         ".map(r => [...r.cells].map(c => c.textContent))")
    assert gains == [["64", "+12.8%", "+10.3%..+15.4%"], ["96", "+5.7%", "+3.3%..+8.1%"]]
    levels = tab.evaluate(f"[...document.querySelectorAll('#ev-{told.evidence} table.levels tbody tr')]"
                          ".map(r => [...r.cells].map(c => c.textContent))")
    assert [row[:2] for row in levels] == [["64", "+12.8%"], ["80", "+2.0%"], ["96", "+5.7%"]]
    # schema 2: every level shows its family-wise adjusted p, never below its raw p
    assert all(row[4] != "unadjusted" and float(row[4]) >= float(row[3]) for row in levels), levels
    assert levels[0][5] == "better" and levels[2][5] == "better"
    assert "anomaly: arm A throughput at 96" in tab.evaluate(f"document.getElementById('ev-{told.evidence}').textContent")
    # the refuted revert: in the reverts table and as a mark of its own look
    row = tab.evaluate(f"document.getElementById('revert-{told.revert}').textContent")
    assert "refuted (the knob was innocent)" in row and fieldstory.ROOT_CAUSE in row
    assert tab.evaluate("document.querySelectorAll('.timeline .mark.revert-refuted[data-kind=revert]').length") == 1
    assert tab.evaluate("document.querySelector('svg.timeline .mark.revert-refuted').dataset.id") == told.revert
    # the exact restore command, the one `reclaimable` prints
    [item] = audit.reclaimable(project).reclaimable
    assert item.command == f"knobkeeper restore {KNOB} --role decode"
    assert tab.evaluate("[...document.querySelectorAll('.reclaim .cmd')].map(c => c.textContent)") == [item.command]
    shot = tab.screenshot(tmp_path / "report.png")
    assert png_size(shot) == (1280, 800)


def test_timeline_has_one_mark_per_event(story, browser):
    project, told, path = story
    tab = open_clean(browser, path)
    events = audit.timeline(project, EPOCH, datetime.now(timezone.utc)).events
    marks = tab.evaluate("[...document.querySelectorAll('svg.timeline .mark')].map(m => [m.dataset.kind, m.dataset.count])")
    assert len(marks) == len(events) + 1          # + the one evidence file
    assert {count for _, count in marks} == {"1"}
    kinds = [kind for kind, _ in marks]
    assert sorted(kinds) == sorted(["evidence", "set", "revert", "deploy", "deploy", "restart", "restart", "restart",
                                    "restart", "incident-started", "incident-opened", "incident-note",
                                    "incident-resolved"])
    assert tab.evaluate("document.querySelectorAll('svg.timeline .span').length") == 1
    assert tab.evaluate("[...document.querySelectorAll('svg.timeline .lane-label')].map(t => t.textContent)") == [
        "incidents", "decode", "router", "deploys"]
    # focusing a mark shows its entry, reason and links in the panel
    tab.evaluate("document.querySelector('svg.timeline .mark.revert-refuted').focus()")
    tip = tab.evaluate("(t => [t.hidden, t.textContent, [...t.querySelectorAll('a')].map(a => a.getAttribute('href'))])"
                       "(document.getElementById('tip'))")
    assert tip[0] is False
    assert told.revert in tip[1] and "last deploy delta; suspect for the harness hang" in tip[1] and "REFUTED" in tip[1]
    assert f"#inc-{told.incident}" in tip[2] and f"#knob-{KNOB}" in tip[2]


def test_refuted_and_confirmed_reverts_look_different(story, browser):
    _, _, path = story
    tab = open_clean(browser, path)
    look = tab.evaluate("['refuted', 'confirmed'].map(s => { const p = document.querySelector("
                        "'.legend .revert-' + s + ' path'); const c = getComputedStyle(p); "
                        "return [c.fill, c.stroke, c.strokeDasharray]; })")
    refuted, confirmed = look
    assert refuted != confirmed and refuted[0] != confirmed[0] and refuted[2] != confirmed[2]


def test_hostile_strings_are_text_not_markup(project, tmp_path, browser):
    evil = '<script>window.__pwned=1</script><img src="x.png" onerror="window.__pwned=2">'
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", f"debug {evil}")
    incidents.open_incident(project, f"hang {evil}")
    path = write_report(project, tmp_path / "r.html").path
    tab = open_clean(browser, path)        # the <img> would have asked for x.png
    assert tab.evaluate("typeof window.__pwned") == "undefined"
    assert tab.evaluate("document.querySelectorAll('img').length") == 0
    assert evil in tab.evaluate("document.body.textContent")


def test_a_hostile_value_and_reason_are_escaped_in_the_html(project, tmp_path):
    """The page's text itself, not the DOM: a knob value and a reason with <script>, quotes and &
    come out escaped by the templates' autoescape, in the declared table and the knob's history."""
    value, reason = '<script>alert("v")</script>', "it's <b>fast</b> & \"safe\""
    ops.set_knob(project, "NCCL_SOCKET_IFNAME", value, "prefill", reason)
    text = write_report(project, tmp_path / "r.html").path.read_text()
    assert "<script>alert" not in text and "<b>fast" not in text and "& \"" not in text
    assert text.count("&lt;script&gt;alert(&#34;v&#34;)&lt;/script&gt;") >= 2, text
    assert text.count("it&#39;s &lt;b&gt;fast&lt;/b&gt; &amp; &#34;safe&#34;") >= 2, text


def test_empty_repository_says_so(project, browser, tmp_path):
    path = write_report(project, tmp_path / "empty.html").path
    tab = open_clean(browser, path)
    assert "Nothing to show yet" in tab.evaluate("document.getElementById('empty').textContent")
    assert tab.evaluate("document.querySelectorAll('svg').length") == 0
    assert png_size(tab.screenshot(tmp_path / "empty.png")) == (1280, 800)


# --------------------------------------------------------------------------- CLI and bad input

def test_cli_writes_the_default_path_and_keeps_the_tree_clean(project):
    ops.set_knob(project, "NCCL_DEBUG", "INFO", "prefill", "debug")
    result = kk(project, "report")
    assert result.exit_code == 0, result.output
    target = project.state_dir / "knobkeeper-report.html"
    assert result.output.startswith(f"report: {target.resolve()} (") and "1 timeline events" in result.output
    assert "NCCL_DEBUG" in target.read_text()
    assert git(project.root, "status", "--porcelain") == ""


@pytest.mark.parametrize("args,message", [
    (["--since", "last tuesday"], "error: --since: 'last tuesday' is not a time"),
    (["--role", "nosuch"], "error: --role 'nosuch': no such role"),
    (["-o", "{root}/no/such/folder/r.html"], "folder {root}/no/such/folder does not exist"),
    (["-o", "{root}/inventory"], "is a directory"),
    (["-o", "{root}/inventory/knobs.toml/r.html"], "does not exist"),
    (["--status-json", "{root}/inventory/knobs.toml"], "--status-json {root}/inventory/knobs.toml: not JSON"),
])
def test_bad_input_is_one_line_exit_2_nothing_written(shared, args, message):
    root = str(shared.root)
    result = kk(shared, "report", *[a.format(root=root) for a in args])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message.format(root=root) in lines[0], result.output
    assert not shared.state_dir.exists()
    assert git(shared.root, "status", "--porcelain", "--ignored") == ""


def test_status_json_shows_the_observed_state(story, tmp_path):
    project, _, _ = story
    status = tmp_path / "status.json"
    status.write_text(json.dumps([{"host": "gpu-1", "service": "sglang-decode", "role": "decode", "state": "drifted",
                                   "differences": [f"{KNOB}: running 512, declared (unset)"]}]))
    text = write_report(project, tmp_path / "s.html", status_json=str(status)).path.read_text()
    assert 'class="state s-drifted">drifted</span>' in text and f"{KNOB}: running 512, declared (unset)" in text


def _co_restart_record(project, inventory: str) -> None:
    """The record a co-restart of `inventory` commits: every service restarted with the knobs its
    rendered launch script exports (deploy/operations.py records `knobs=rendered.knobs`)."""
    from knobkeeper.deploy.record import DeployRecord, save
    from knobkeeper.deploy.render import render_stack
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.timeutil import iso, new_id, utcnow

    stack, now = load_stack(project.root, inventory), iso(utcnow())
    rendered = render_stack(project, stack)
    services = [{"host": s.host, "service": s.name, "role": s.role, "action": "restarted", "reason": "co-restart",
                 "knobs": rendered[(s.host, s.name)].knobs, "digest": rendered[(s.host, s.name)].digest,
                 "restart_issued_at": now, "gate": {"result": "passed"}} for s in stack.services]
    save(project, DeployRecord(id=new_id(), inventory=stack.inventory, inventory_path=inventory,
                               commit=git(project.root, "rev-parse", "HEAD"), dirty=False, allow_dirty=False,
                               options={"restart": "co"}, order=list(stack.order), started_at=now, finished_at=now,
                               result="ok", services=services, stack=stack.hosts["@local"].data.get("stack", "")),
         commit=True)


def _deploy_states(text: str) -> dict[str, str]:
    """{service: the text of its state cell} of the report's "Last deploy per host and service" table."""
    table = text.split("Last deploy per host and service")[1].split("</table>")[0]
    rows = re.findall(r"<tr><td>@local</td><td>([^<]+)</td>.*?<td>(<span class=\"state .*?)</td></tr>", table)
    return {service: re.sub(r"<[^>]+>", "", cell) for service, cell in rows}


def test_the_last_deploy_is_judged_as_status_judges_it(project, tmp_path):
    """local_vllm.py starts its engines with knob_defaults, a baseline knobs.toml does not declare:
    right after a co-restart `status` says in sync, and so must the report (it said "declared knobs
    changed since"), through the same function over the same render. A knob set since is named in
    status's words; a knob the pinned engine's registry declares is that, not "not in the catalog"."""
    from knobkeeper.deploy.status import declared_knobs_now, knob_drift
    from knobkeeper.deploy.record import load_records

    inventory = "inventory/local_vllm.py"
    _co_restart_record(project, inventory)
    now = declared_knobs_now(project, inventory)
    [record] = load_records(project)
    assert all(knob_drift(now[(row.host, row.service)], row.knobs) == [] for row in record.services)
    assert record.service("@local", "knobkeeper-decode").knobs["VLLM_CPU_KVCACHE_SPACE"] == "1"
    states = _deploy_states(write_report(project, tmp_path / "r.html").path.read_text())
    assert set(states) == {"knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router"}
    assert all(state.startswith("started with what is declared") for state in states.values()), states

    ops.set_knob(project, "VLLM_CPU_KVCACHE_SPACE", "2", "vllm.decode", "a bigger KV cache")
    text = write_report(project, tmp_path / "r.html").path.read_text()
    states = _deploy_states(text)
    assert states["knobkeeper-decode"] == ("declared knobs changed since VLLM_CPU_KVCACHE_SPACE: running 1, "
                                                "declared 2 (a deploy restarts it)")
    assert states["knobkeeper-prefill"].startswith("started with what is declared")
    knob = text.split('id="knob-VLLM_CPU_KVCACHE_SPACE"')[1].split('<div class="scroll">')[0]
    assert "not in the catalog" not in knob and 'class="warn"' not in knob
    assert "risk unreviewed" in knob and "from the vllm 0.32.0 registry, not curated in inventory/catalog.toml" in knob


def test_the_throughput_axis_never_goes_below_zero():
    """The axis is padded beyond the intervals; a padded low end read -31 tok/s."""
    arms = {"A": [(8, 100.0, 90.0, 110.0, 3), (64, 1200.0, 1150.0, 1250.0, 3)]}
    chart = svg.evidence_chart(arms, {"A": "A: X=1"}, [], {}, "output_tokens_per_s")
    ticks = [float(t.replace(",", "")) for t in re.findall(r'text-anchor="end">([^<]+)</text>', chart)]
    assert len(ticks) == 5 and min(ticks) == 0 and max(ticks) > 1250, ticks


def test_role_filter_keeps_one_lane(story, tmp_path):
    project, _, _ = story
    text = write_report(project, tmp_path / "p.html", role="router").path.read_text()
    assert '>router</text>' in text and '>decode</text>' not in text and 'data-kind="set"' not in text


# --------------------------------------------------------------------------- no browser needed

def test_schema2_levels_show_p_adjusted_and_guards(story):
    project, told, _ = story
    from knobkeeper.evidence import store
    from knobkeeper.evidence.model import Adjustment, Guard, LevelValidity, Validity

    doc = copy.deepcopy(store.load(project, told.evidence))
    one = page._evidence_block(doc)
    if "p_adjusted" not in doc.judgement.levels[0].to_json():
        assert one.count(">unadjusted<") == 3 and "p-values unadjusted" in one
    doc.schema = "knobkeeper.evidence/2"
    for i, lv in enumerate(doc.judgement.levels):
        lv.p_adjusted = [0.0021, 0.1466, 0.0075][i]
    doc.judgement.family = Adjustment(method="holm", alpha=0.05, size=3)
    doc.judgement.guards = [Guard(concurrency=96, metric="ttft_p99_ms", effect=0.21, ci_low=0.1, ci_high=0.33,
                                  p_value=0.001, p_adjusted=0.004, verdict="worse", regression=True)]
    doc.validity = Validity(levels=[LevelValidity(concurrency=80, valid=False, reasons=["zero tokens in 2 runs"])],
                            reasons=[])
    two = page._evidence_block(doc)
    assert ">0.0021<" in two and ">0.147<" in two and ">unadjusted<" not in two
    assert "p adjusted for 3 comparisons (holm)" in two
    assert '<tr class="regression"><td>ttft_p99_ms</td><td>96</td><td>+21.0%</td>' in two and "<b>regression</b>" in two
    assert "invalid: zero tokens in 2 runs" in two


def test_marks_that_would_overlap_are_grouped_but_looks_never_mix():
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    marks = [svg.Mark(start + timedelta(seconds=i), "decode", "set", "set", f"set {i}") for i in range(1000)]
    marks.append(svg.Mark(start + timedelta(seconds=500), "decode", "revert", "revert revert-refuted", "the revert"))
    far = svg.Mark(start + timedelta(days=30), "decode", "set", "set", "much later")
    scale = svg.TimeScale.around([m.time for m in marks + [far]])
    groups = svg.group_marks(marks + [far], scale)
    assert sum(len(run) for _, run in groups) == 1002
    assert len(groups) == 3
    assert [run for _, run in groups if run[0].look != "set"] == [[marks[-1]]]
    drawn = svg.timeline(["decode"], marks + [far], [], scale)
    assert drawn.count('data-count="1000"') == 1 and "1000 events from" in drawn and drawn.count('class="mark ') == 3


def test_no_remote_reference_in_the_page(story):
    _, _, path = story
    text = path.read_text()
    for needle in ("http://", "https://", "src=", "@import", "url("):
        assert needle not in text.replace('xmlns="http://www.w3.org/2000/svg"', ""), needle


def test_since_draws_only_the_later_events(story, tmp_path):
    project, told, _ = story
    from knobkeeper.changelog.incidents import find_incident

    opened = find_incident(project, told.incident).opened
    text = write_report(project, tmp_path / "since.html", since=opened).path.read_text()
    timeline = text[text.index('<svg class="timeline"'):text.index("</svg>", text.index('<svg class="timeline"'))]
    assert 'data-kind="set"' not in timeline and 'data-kind="evidence"' not in timeline
    assert 'data-kind="revert"' in timeline and 'data-kind="incident-resolved"' in timeline
    assert f"timeline since {opened[:10]}" in text
