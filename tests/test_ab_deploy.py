"""`knobkeeper ab run` on the local stack, for real: the deploy switches arms (knob_overrides,
only=decode, every gate held), the load goes through the real sglang-router to the sim engine,
and the declared state is deployed again at the end.

The sim runs at --time-scale 0.3 (the sim's notes: below that the router's fixed per-request
cost distorts the ratio) with small run-to-run noise, 256-token outputs (per-request router and
bootstrap costs matter less), and each level is measured for 1 s after a one-request-per-stream
warm-up. Through the router the runs still vary by 2-6% (measured: CV 1.2% at 256 tokens on a
quiet machine, single outliers of -10% under load; once a CPU-bound sim made +5.7% read -0.1%),
so with the 3 repeats CI can afford this test asserts what the judgement guarantees on any
machine: a real gain (+12.8% at 64, +5.7% at 96) is never judged "worse" ("inconclusive" is
allowed), every run's engine carried its arm's value (read from started.sh, as `status` does)
and every run went through prefill (its sglang:prompt_tokens_total moved). Exact verdicts are
asserted in-process, where the noise is controlled (test_evidence_family.py), and the sequential
design on the sim directly (test_evidence_ab.py).
"""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
from click.testing import CliRunner

from knobkeeper.cli import main
from knobkeeper.deploy.local import _alive, stop_local
from tests.infra import git, make_infra_repo
from tests.procs import free_port

KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"


@pytest.fixture
def local_stack(tmp_path_factory, monkeypatch):
    project = make_infra_repo(tmp_path_factory.mktemp("ab"))
    local = project.inventory_dir / "local.py"
    text = local.read_text()
    for role in ("prefill", "decode"):
        text = text.replace(f'"{role}": ["--time-scale", "0.1"]',
                            f'"{role}": ["--time-scale", "0.3", "--run-noise", "0.005", "--stream-interval", "8"]')
    assert text.count('"0.3"') == 2, "inventory/local.py engine_args changed shape; update this test"
    local.write_text(text)
    git(project.root, "commit", "-qam", "A/B-friendly sim settings")
    ports = {"prefill": free_port(), "bootstrap": free_port(), "decode": free_port(), "router": free_port(),
             "router_metrics": free_port()}
    monkeypatch.setenv("KNOBKEEPER_LOCAL_PORTS", ",".join(f"{k}={v}" for k, v in ports.items()))
    prefix = project.state_dir / "local"
    try:
        yield project, ports
    finally:
        stopped = stop_local(prefix)
        left = subprocess.run(["pgrep", "-f", str(prefix)], capture_output=True, text=True).stdout.split()
        assert not left and not [p for p in stopped if _alive(p)], f"processes left behind: {left}"


def _decode_knobs(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=5) as resp:
        return json.loads(resp.read())["knobs"]


def test_ab_run_through_the_deploy_judges_512_and_restores_the_declared_state(local_stack):
    project, ports = local_stack
    runner = CliRunner()
    repo = ["--repo", str(project.root)]
    deployed = runner.invoke(main, ["deploy", "inventory/local.py", *repo])
    assert deployed.exit_code == 0, deployed.output
    before = git(project.root, "rev-parse", "HEAD")

    result = runner.invoke(main, [
        "ab", "run", "--inventory", "inventory/local.py", "--role", "decode", "--set", f"{KNOB}=512",
        "--concurrency", "64,96", "--repeats", "3", "--duration", "1", "--input-len", "8",
        "--output-len", "256", "--json", *repo,
    ])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output[result.output.index("{"):])
    levels = {lv["concurrency"]: lv for lv in doc["judgement"]["levels"]}
    summary = {c: (round(lv["effect"], 3), lv["verdict"]) for c, lv in levels.items()}
    runs = sorted((r["concurrency"], r["arm"], r["repeat"], round(r["output_tokens_per_s"])) for r in doc["runs"])
    assert levels[64]["verdict"] in ("better", "inconclusive") and levels[64]["effect"] > 0, (summary, runs)
    assert levels[96]["verdict"] != "worse", (summary, runs)
    assert {r["knob_seen"]["status"] for r in doc["runs"]} == {"carried"}, doc["runs"][0]["knob_seen"]
    assert all(r["prefill_prompt_tokens"] > 0 for r in doc["runs"]), [r.get("prefill_prompt_tokens") for r in doc["runs"]]
    assert all(row["valid"] for row in doc["validity"]["levels"]) and doc["setup"]["schedule"]["design"] == "fixed"
    assert doc["arms"]["A"]["knobs"] == {KNOB: None} and doc["arms"]["B"]["knobs"] == {KNOB: 512}
    assert all(run["errors"] == 0 for run in doc["runs"]) and len(doc["runs"]) == 12
    assert doc["setup"]["engine"] == "sim"

    # The evidence is one commit of its own; the declared state (knob unset) runs again.
    assert git(project.root, "rev-list", "--count", f"{before}..HEAD") == "1"
    assert f"Evidence: {doc['id']}" in git(project.root, "log", "-1", "--format=%(trailers)")
    assert _decode_knobs(ports["decode"])[KNOB] is None
    assert KNOB not in project.knobs_path.read_text()
    # ... and can be attached to the change it justifies.
    setting = runner.invoke(main, ["set", f"{KNOB}=512", "--role", "decode", "--reason", "A/B on the local stack",
                                   "--evidence", doc["id"], "--allow-undeclared", *repo])
    assert setting.exit_code == 0, setting.output
    shown = runner.invoke(main, ["log", KNOB, *repo])
    assert f"{doc['id']}: " in shown.output and "@64 (95% CI" in shown.output and "p_adj" in shown.output, shown.output
