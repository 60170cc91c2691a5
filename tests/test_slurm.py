"""Slurm as a deploy target, on a REAL local cluster (tests/slurm.py: munged, slurmctld, slurmd n1..n3):
inventory/local_slurm.py deployed through pyinfra as one heterogeneous job (sim prefill, sim decode,
the real smg router), a knob change becoming a new job that gates before the old one is cancelled, a
failed gate that cancels only the new job, the bad-input lines, `ab run` switching arms by jobs, and
`status` once the serving job has ended.

One cluster and one infra repo per module; the tests run in file order and each leaves one healthy
job serving (the last one cancels it at its end). Nothing here fakes a Slurm client: every
sbatch/squeue/scancel is the real one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from knobkeeper.changelog.ops import set_knob
from knobkeeper.cli.core import MAX_VALUE_BYTES
from knobkeeper.deploy.api import run_deploy
from knobkeeper.deploy.plan import plan_text, restart_plan
from knobkeeper.deploy.slurm.client import Client
from knobkeeper.deploy.slurm.job import DELIMITER, settings_of
from knobkeeper.deploy.slurm.ops import ended_words
from knobkeeper.deploy.stack import load_stack, running_stack
from knobkeeper.deploy.status import stack_status
from knobkeeper.errors import UserError
from knobkeeper.timeutil import parse_time
from tests.infra import FAST_ENGINE_ARGS, git, kk, make_infra_repo
from tests.procs import free_port
from tests.slurm import slurm_cluster_fixture

INV = "inventory/local_slurm.py"
KNOB = "SGLANG_SM120_MMA_TARGET_CTAS"
ORDER = ["knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router"]
# A value with an empty line inside: sbatch drops the blank lines of a heterogeneous job's script
# (22.05); the job carries each launch script line by line behind a `|` so the value survives.
BLANK = "first line\n\nafter an empty line; it's $HOME `x` \\ end"
FAST = {
    "engine_args": FAST_ENGINE_ARGS,
    "stop_timeout": 10,
    "slurm_timeout": 10,
}

cluster = slurm_cluster_fixture("module")


class Site:
    def __init__(self, project, cluster):
        self.project, self.cluster = project, cluster

    def deploy(self, **kwargs):
        extra = {**FAST, **kwargs.pop("extra_data", {})}
        kwargs.setdefault("timeout", 180)
        return run_deploy(self.project, INV, extra_data=extra, **kwargs)

    def jobs(self) -> dict[str, str]:
        """{job id: state} of this stack's jobs (components folded), from squeue."""
        out = self.cluster.client("squeue", "-h", "-t", "all", "-o", "%i %T", check=True).stdout.split("\n")
        states: dict[str, str] = {}
        for line in filter(None, out):
            ident, state = line.split()
            states.setdefault(ident.split("+")[0], state)
        return states

    def scontrol_state(self, job_id: str, settle: float = 60.0) -> str:
        """The job's final state as scontrol shows it. A cancelled job passes through COMPLETING while
        slurmd stops its steps (seconds on a loaded machine): that is the cancel in progress, so wait
        it out (bounded) instead of asserting on the moment of the look."""
        deadline = time.monotonic() + settle
        while True:
            line = self.cluster.client("scontrol", "show", "job", "-o", job_id, check=True).stdout.splitlines()[0]
            state = dict(f.split("=", 1) for f in line.split() if "=" in f)["JobState"]
            if state != "COMPLETING" or time.monotonic() > deadline:
                return state
            time.sleep(0.5)

    def placed(self):
        return {s.name: s for s in running_stack(self.project.root, INV, FAST).services}


@pytest.fixture(scope="module")
def site(cluster, tmp_path_factory):
    project = make_infra_repo(tmp_path_factory.mktemp("slurm"))
    ports = {"prefill": free_port(), "bootstrap": free_port(), "decode": free_port(), "router": free_port(),
             "router_metrics": free_port()}
    saved = {k: os.environ.get(k) for k in ("KNOBKEEPER_SLURM_ROOT", "KNOBKEEPER_LOCAL_PORTS")}
    os.environ["KNOBKEEPER_SLURM_ROOT"] = cluster.root
    os.environ["KNOBKEEPER_LOCAL_PORTS"] = ",".join(f"{k}={v}" for k, v in ports.items())
    try:
        yield Site(project, cluster)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _ok(result):
    assert result.ok, f"deploy failed: {result.error}\n{result.output[-4000:]}"
    return result.record


def _t(text):
    return parse_time(text)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def _chat(url: str) -> dict:
    body = json.dumps({"model": "knobkeeper-sim", "max_tokens": 8,
                       "messages": [{"role": "user", "content": "hello from the Slurm job"}]}).encode()
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _one_line(result, *needles):
    """A refusal: exit 2, one knobkeeper error line naming what to fix, no record."""
    assert result.returncode == 2 and result.record is None, result.output[-3000:]
    error = result.error
    assert error.startswith("knobkeeper: error: slurm") and "\n" not in error, error
    for needle in needles:
        assert needle in error, (needle, error)
    return error


# --- without a cluster: the job script, the data, the srtctl import ----------------------------------


def test_the_job_script_is_rendered_by_render_stack_and_carries_every_component(shared):
    from knobkeeper.deploy.render import Source, render_stack
    from knobkeeper.deploy.slurm.job import component_scripts, job_meta
    from knobkeeper.deploy.stack import load_stack

    stack = load_stack(shared.root, "inventory/example_slurm.py")
    rendered = render_stack(shared, stack)
    job = rendered[("login-1", "knobkeeper-example_slurm")]
    [(path, text)] = job.files.items()
    assert path == "/lustre/serving/knobkeeper/deepseek-v3/slurm/knobkeeper-example_slurm.sh"
    assert text.count("#SBATCH hetjob") == 4  # 2 prefill + 2 decode + 1 router components
    assert "#SBATCH --gres=gpu:8" in text and "#SBATCH --partition=cpu" in text and "#SBATCH --requeue" in text
    for group, name in enumerate(["knobkeeper-prefill", "knobkeeper-prefill-2", "knobkeeper-decode",
                                  "knobkeeper-decode-2", "knobkeeper-router"]):
        assert f"srun --het-group={group} --export=ALL --nodes=1 --ntasks=1 bash \"$jobdir/component.sh\" {name} " in text
    meta = job_meta(text)
    assert meta["digest"] == job.digest and [c["service"] for c in meta["components"]][:2] == [
        "knobkeeper-prefill", "knobkeeper-prefill-2"]
    # Each component's launch script is embedded as rendered (the one render function), placement tokens
    # where the job decides: the ports and the router's workers.
    embedded = component_scripts(text)
    decode = rendered[("login-1", "knobkeeper-decode")].launch
    assert embedded["knobkeeper-decode"] == decode
    assert "--port @kk:knobkeeper-decode:port@" in decode and "--disaggregation-mode decode" in decode
    router = rendered[("login-1", "knobkeeper-router")].launch
    assert ("--prefill http://@kk:knobkeeper-prefill:host@:@kk:knobkeeper-prefill:port@ "
            "@kk:knobkeeper-prefill:bootstrap_port@") in router
    # The header names the commit and the digest, and a new commit alone makes no new job.
    assert text.startswith("#!/bin/bash\n# job knobkeeper-example_slurm of stack example_slurm (5 components)")
    other = render_stack(shared, stack, source=Source("0" * 40))[("login-1", "knobkeeper-example_slurm")]
    other_text = next(iter(other.files.values()))
    differ = [a for a, b in zip(text.splitlines(), other_text.splitlines()) if a != b]
    assert other.digest == job.digest and differ and all(line.startswith(("# ", "|# ")) for line in differ), differ


def test_check_lints_the_job_script_and_its_component_wrapper(shared):
    import re
    import shutil

    result = kk(shared, "check")
    assert result.exit_code == 0, result.output
    assert "in 8 inventories" in result.output and "shellcheck" in result.output
    if shutil.which("shellcheck"):  # the wrapper lives inside a here-document: lint it on its own too
        from knobkeeper import lint
        from knobkeeper.deploy.render import render_stack
        from knobkeeper.deploy.stack import load_stack

        text = next(iter(render_stack(shared, load_stack(shared.root, INV))[("@local", "knobkeeper-local_slurm")]
                         .files.values()))
        wrapper = re.search(r"<<'KNOBKEEPER_EOF'\n(#!/bin/bash\n.*?)^KNOBKEEPER_EOF$", text, re.M | re.S).group(1)
        assert lint.shellcheck(wrapper) == [] and lint.bash_syntax(wrapper) == []


def test_the_steps_layout_is_one_allocation_with_one_step_per_component(shared):
    """For clusters that cannot run heterogeneous jobs: one job, one `srun --exact` step per service."""
    from knobkeeper import lint
    from knobkeeper.deploy.render import render_stack
    from knobkeeper.deploy.stack import load_stack

    stack = load_stack(shared.root, INV, {"slurm_layout": "steps", "decode_slurm": {"cpus": 2, "mem": "1G"}})
    text = next(iter(render_stack(shared, stack)[("@local", "knobkeeper-local_slurm")].files.values()))
    assert "hetjob" not in text.split("set -euo pipefail")[0] and "--het-group" not in text
    assert "#SBATCH --nodes=1-3\n#SBATCH --ntasks=3\n" in text and "#SBATCH --cpus-per-task=2\n#SBATCH --mem=1G" in text
    assert ("srun --export=ALL --nodes=1 --ntasks=1 --cpus-per-task=2 --exact --overlap --mem=1G bash "
            "\"$jobdir/component.sh\" knobkeeper-decode 127.0.0.1 port=") in text
    assert lint.bash_syntax(text) == [] and lint.shellcheck(text) in ([], None)


def test_a_value_with_an_empty_line_survives_the_embedding(shared):
    from knobkeeper.deploy.slurm.job import component_scripts, embedded

    script = f"#!/usr/bin/env bash\nexport X='{BLANK}'\n\nexec true\n"
    wrapped = embedded(script)
    assert "\n\n" not in wrapped  # sbatch drops empty lines of heterogeneous job scripts
    text = f"x\nsed 's/^|//' > \"$jobdir/svc.sh\" <<'KNOBKEEPER_EOF'\n{wrapped}KNOBKEEPER_EOF\n"
    assert component_scripts(text) == {"svc": script}


@pytest.mark.parametrize("data, words", [
    ({"slurm_layout": "array"}, "data slurm_layout = 'array': expected one of hetjob, steps"),
    ({"decode_slurm": {"cpus": 0}}, "data decode_slurm['cpus'] = 0: expected a whole number of at least 1"),
    ({"decode_slurm": {"nodes": 2}}, "data decode_slurm['nodes'] = 2: each service runs on 1 node"),
    ({"router_slurm": {"mem": "lots"}}, "data router_slurm['mem'] = 'lots': expected an amount such as"),
    ({"slurm_partition": "a b"}, "data slurm_partition = 'a b': expected a partition name"),
    ({"slurm_sbatch": "--exclusive"}, "data slurm_sbatch = '--exclusive': expected a list of sbatch options"),
    ({"slurm_timeout": 0}, "data slurm_timeout = 0: expected a number of seconds above 0"),
    ({"slurm_max_script_size": "4M"}, "data slurm_max_script_size = '4M': expected a number of bytes (at least 1024"),
])
def test_bad_slurm_data_is_one_line_naming_the_key(shared, data, words):
    result = kk(shared, "plan", INV, *[x for k, v in data.items() for x in ("--data", f"{k}={json.dumps(v)}")])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and words in line and "inventory local_slurm, host @local" in line, line


def test_a_job_script_over_the_size_slurm_takes_is_refused_where_it_renders(project):
    """sbatch refuses a job script over the cluster's max_script_size (Slurm's default 4 MiB) only at
    submit time; the render refuses it first, so `check` and `plan` (and the deploy, before anything
    is uploaded) say so in one line naming the knob value that weighs most."""
    inv = project.root / INV
    inv.write_text(inv.read_text().replace('"slurm_pending_timeout": 120,',
                                           '"slurm_pending_timeout": 120, "slurm_max_script_size": 150000,'))
    git(project.root, "commit", "-q", "-am", "a cluster that takes job scripts up to 150000 bytes")
    set_knob(project, "NCCL_SOCKET_IFNAME", "x" * 40000, "decode", "a large value")
    fits = kk(project, "plan", INV, "--data", "slurm_timeout=1")  # ~136 KB: it fits (no cluster: the plan says so)
    assert fits.exit_code == 0 and "slurm job knobkeeper-local_slurm: unknown\n   why: slurm: squeue" in fits.output
    set_knob(project, "NCCL_SOCKET_IFNAME", "x" * 60000, "decode", "a larger one")
    plan = kk(project, "plan", INV)
    assert plan.exit_code == 2, plan.output
    [line] = plan.output.strip().splitlines()
    script = f"{project.state_dir}/slurm-stack/slurm/knobkeeper-local_slurm.sh"
    assert re.fullmatch(rf"error: inventory local_slurm, host @local: job script {re.escape(script)} would be "
                        r"1\d\d\d\d\d bytes, over the 150000 bytes Slurm takes \(data slurm_max_script_size; the "
                        r"cluster's SchedulerParameters=max_script_size\); its largest knob value: \[decode\] "
                        r"NCCL_SOCKET_IFNAME, 60000 bytes", line), line
    check = kk(project, "check")
    assert check.exit_code == 1, check.output
    assert line.removeprefix("error: ").replace(f"{project.root}/", "") in check.output, check.output


def test_srtctl_recipe_imports_as_an_inventory_and_knobs_in_one_commit(project):
    data = Path(__file__).parent / "data" / "srtctl"
    head = git(project.root, "rev-parse", "HEAD")
    result = kk(project, "import", "srtctl", str(data / "1p1d-sglang.yaml"), "--srtslurm", str(data / "srtslurm.yaml"),
                "--sglang-version", "0.5.23")
    assert result.exit_code == 0, result.output
    assert git(project.root, "rev-list", "--count", f"{head}..HEAD") == "1"
    changed = git(project.root, "show", "--name-only", "--format=", "HEAD").split()
    assert "inventory/dsr1_1p1d_test.py" in changed and "inventory/knobs.toml" in changed
    assert sum(p.startswith("changelog/entries/") for p in changed) == 4
    knobs = project.knobs_path.read_text()
    assert "SGLANG_SM120_MMA_TARGET_CTAS = 512" in knobs and "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = 600" in knobs
    assert "not imported: benchmark (sa-bench)" in result.output and "--concurrency 64,96" in result.output
    from knobkeeper.deploy.render import render_stack
    from knobkeeper.deploy.stack import load_stack

    stack = load_stack(project.root, "inventory/dsr1_1p1d_test.py")
    rendered = render_stack(project, stack)
    host = stack.hosts["@local"]
    assert host.data["slurm_partition"] == "h200" and host.data["slurm_account"] == "llm-serving"
    # engine and version per role in one place, the form every inventory uses (no sglang_version beside it)
    assert host.data["engines"] == {"prefill": "sglang==0.5.23", "decode": "sglang==0.5.23",
                                    "router": "sglang-router==0.3.2"}
    assert not {"sglang_version", "sglang_router_version"} & set(host.data)
    assert host.data["decode_slurm"]["gpus"] == 8 and host.data["environment"] == {
        "PYTHONUNBUFFERED": "1", "TORCH_DISTRIBUTED_DEFAULT_TIMEOUT": "1800"}
    decode = rendered[("@local", "knobkeeper-decode")].launch
    assert "export SGLANG_SM120_MMA_TARGET_CTAS=512" in decode and "--tp-size 8" in decode
    assert "--model-path /model/" in decode and "--disaggregation-transfer-backend nixl" in decode
    job = next(iter(rendered[("@local", "dsr1-1p1d-test")].files.values()))
    assert "--container-image=/lustre/containers/sglang-v0.5.23-cu13.sqsh" in job
    assert "/lustre/models/DeepSeek-R1-FP8:/model" in job and "#SBATCH --time=04:00:00" in job
    # `check` reads it like any inventory: sglang 0.5.23's own parser on the imported flags.
    check = kk(project, "check")
    assert "inventory/dsr1_1p1d_test.py: @local/knobkeeper-decode: --cuda-graph-max-bs: rejected" in check.output


@pytest.mark.parametrize("edit, words", [
    (lambda r: r["frontend"].update(type="dynamo"), "frontend.type = 'dynamo': knobkeeper fronts the workers with "
                                                    "a router of its own; pass --router sglang-router or --router smg"),
    (lambda r: r["resources"].update(agg_nodes=2), "resources.agg_nodes: aggregated mode cannot be mapped"),
    (lambda r: r["backend"]["sglang_config"]["decode"].update({"tensor-parallel-size": 16}),
     "a worker spanning nodes (16 GPUs, 8 per node)"),
    (lambda r: r.update(setup_script="x.sh"), "setup_script: cannot be mapped onto an inventory and knobs.toml"),
    (lambda r: r["backend"]["decode_environment"].update(NCCL_CUMEM_ENABLE="1"),
     "NCCL_CUMEM_ENABLE (decode '1'): not a catalog knob, and not the same in every worker role"),
    (lambda r: r["model"].update(container="unknown-alias"), "model.container = 'unknown-alias': an alias of "
                                                             "srtslurm.yaml's containers: map"),
])
def test_srtctl_what_does_not_map_is_one_line_and_writes_nothing(project, tmp_path, edit, words):
    import yaml

    data = Path(__file__).parent / "data" / "srtctl"
    recipe = yaml.safe_load((data / "1p1d-sglang.yaml").read_text())
    edit(recipe)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    head = git(project.root, "rev-parse", "HEAD")
    result = kk(project, "import", "srtctl", str(path), "--srtslurm", str(data / "srtslurm.yaml"))
    assert result.exit_code == 2 and words in result.output and result.output.count("\n") == 1, result.output
    assert git(project.root, "rev-parse", "HEAD") == head and git(project.root, "status", "--porcelain") == ""


# --- on the real cluster ------------------------------------------------------------------------------


def test_a_knob_change_is_a_new_job_gated_before_the_old_one_is_cancelled(site):
    # 1. The first deploy: one heterogeneous job, its components started in order, each gated where
    #    Slurm placed it.
    first = _ok(site.deploy())
    job = first.slurm.job
    assert first.slurm.decision == "new job" and job.state == "RUNNING"
    rows = [first.service("@local", n) for n in ORDER]
    assert [r.action for r in rows] == ["started"] * 3 and all(r.gate.result == "passed" for r in rows)
    assert {r.job for r in rows} == {job.id} and sorted(job.nodes.values()) == ["n1", "n2", "n3"]
    assert [r.node for r in rows] == [job.nodes[n] for n in ORDER]
    for before, after in zip(rows, rows[1:]):
        assert _t(before.restart_issued_at) <= _t(before.healthy_at) <= _t(after.healthy_at)
    assert _t(job.submitted_at) <= _t(rows[0].healthy_at) and job.started_at
    assert rows[2].gate.status.endswith("2 workers healthy")
    assert f"Slurm-Job: {job.id}" in git(site.project.root, "log", "-1", "--format=%(trailers)")
    placed = site.placed()
    answer = _chat(placed["knobkeeper-router"].url)
    assert answer["choices"][0]["message"]["content"], answer
    # The engines are the processes the placements name (each on this machine, one per node).
    for name in ORDER[:2]:
        env = _environ(first.service("@local", name).pid)
        assert KNOB not in env and "SLURM_JOB_ID" in env and "PYENV_ROOT" not in env, name

    # 2. status: every component in sync, with its job, node and URL (squeue + the job's own script).
    states = stack_status(site.project, INV, FAST)
    assert [(s.service, s.state, s.job) for s in states] == [(n, "in sync", job.id) for n in ORDER]
    assert {s.node for s in states} == {"n1", "n2", "n3"} and all(s.url for s in states)

    # 3. A no-op deploy submits nothing.
    jobs_before = site.jobs()
    again = _ok(site.deploy())
    assert again.slurm.decision == "kept" and again.slurm.job.id == job.id
    assert [again.service("@local", n).action for n in ORDER] == ["unchanged"] * 3
    assert site.jobs() == jobs_before

    # 4. A knob change on decode (and a string knob with an empty line in it): plan says "new job" and
    #    why; the deploy submits one, gates it, then cancels the old one.
    change = set_knob(site.project, KNOB, "512", "decode", "A/B +12.8% at 64")
    set_knob(site.project, "KNOBKEEPER_SIM_EXTRA_ARGS", BLANK, "decode", "quoting through sbatch")
    drifted = {s.service: s for s in stack_status(site.project, INV, FAST)}
    assert drifted["knobkeeper-decode"].state == "drifted"
    assert f"{KNOB}: running (unset), declared 512" in drifted["knobkeeper-decode"].differences
    assert drifted["knobkeeper-prefill"].state == "in sync"
    plan = restart_plan(site.project, INV, FAST)
    assert plan["slurm"]["action"] == "new job" and plan["slurm"]["replaces"] == [job.id]
    text = plan_text(plan)
    assert f"slurm job knobkeeper-local_slurm: NEW JOB (cancels job {job.id} after every gate passed)" in text
    assert f"knob {KNOB}: set to 512 (was unset)" in text and "its files are unchanged; the job is new" in text
    second = _ok(site.deploy())
    new = second.slurm.job
    assert second.slurm.decision == "new job" and new.id != job.id
    [old] = second.slurm.replaced
    assert old.id == job.id and old.cancelled_at
    rows = [second.service("@local", n) for n in ORDER]
    assert [r.action for r in rows] == ["restarted"] * 3
    assert f"knob {KNOB}: set to 512 (was unset)" in rows[1].changes
    assert rows[0].reason.startswith(f"new job {new.id}: its files are unchanged")
    # The old job was cancelled only after the new one's last gate passed.
    assert max(_t(r.healthy_at) for r in rows) <= _t(old.cancelled_at)
    assert site.scontrol_state(job.id) == "CANCELLED" and site.jobs()[new.id] == "RUNNING"
    decode_env = _environ(rows[1].pid)
    assert decode_env[KNOB] == "512" and decode_env["KNOBKEEPER_SIM_EXTRA_ARGS"] == BLANK
    assert KNOB not in _environ(rows[0].pid)
    script = (site.project.state_dir / f"slurm-stack/slurm/jobs/{new.id}/knobkeeper-decode.sh").read_text()
    assert f"# knob {KNOB}: entry {change.entries[0].id} (set" in script
    assert _chat(site.placed()["knobkeeper-router"].url)["choices"]
    assert {s.state for s in stack_status(site.project, INV, FAST)} == {"in sync"}
    # The timeline (and the report built on it) shows the job submission as each component's restart.
    timeline = kk(site.project, "timeline", "--around", second.started_at, "--window", "1h")
    assert timeline.exit_code == 0 and "restarted decode knobkeeper-decode on @local" in timeline.output, timeline.output


def test_a_64_kib_knob_value_reaches_the_process_through_the_job_script(site):
    """`set` takes values up to 64 KiB; the job script holds such a value three times (the export and
    two headers' JSON), ~200 KB: more than one shell argument can be (128 KiB), so nothing may pass
    the script through a command line (sbatch --test-only did: "Argument list too long", for 60 KB)."""
    lines = [f"line {i}: it's $(hostname) `id` \"q\" \\ ${{HOME}} |x" for i in range(2200)]
    # ... with a line that would end a here-document, and one like the exec line the job fills in
    value = "\n".join(lines[:1000] + [DELIMITER, "", "exec @kk:knobkeeper-decode:port@"] + lines[1000:])[:MAX_VALUE_BYTES]
    assert len(value.encode()) == MAX_VALUE_BYTES and f"\n{DELIMITER}\n" in value
    set_knob(site.project, "NCCL_SOCKET_IFNAME", value, "decode", "a 64 KiB value through Slurm")
    record = _ok(site.deploy())
    assert record.slurm.decision == "new job"
    decode = record.service("@local", "knobkeeper-decode")
    assert _environ(decode.pid)["NCCL_SOCKET_IFNAME"] == value  # byte for byte
    assert "NCCL_SOCKET_IFNAME" not in _environ(record.service("@local", "knobkeeper-prefill").pid)
    assert {s.state for s in stack_status(site.project, INV, FAST)} == {"in sync"}


def test_a_failed_gate_cancels_the_new_job_and_the_old_one_keeps_serving(site):
    serving = site.placed()["knobkeeper-router"].url
    [before] = [i for i, s in site.jobs().items() if s == "RUNNING"]
    args = {**FAST["engine_args"], "decode": ["--time-scale", "0.05", "--never-healthy"]}
    # Only decode's gate is short: a 4 s gate for every role would fail prefill too on a busy machine.
    decode_role = {**load_stack(site.project.root, INV).roles["decode"].to_json(), "health_timeout": 4}
    result = site.deploy(extra_data={"engine_args": args, "role_decode": decode_role})
    assert result.returncode != 0 and result.record is not None and result.record.result == "failed"
    new = result.record.slurm.job
    assert new.id != before and new.cancelled_at
    error = result.error
    assert error.startswith(f"gate failed: job {new.id}, knobkeeper-decode (decode): ") and "\n" not in error
    assert error.endswith(f"cancelled the new job {new.id}, job {before} still serves"), error
    assert result.record.service("@local", "knobkeeper-prefill").gate.result == "passed"
    assert result.record.service("@local", "knobkeeper-decode").gate.result == "failed"
    assert result.record.service("@local", "knobkeeper-router").gate.result == "not-run"
    deadline = time.monotonic() + 30
    while site.jobs().get(new.id) not in ("CANCELLED", None) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert site.scontrol_state(new.id) == "CANCELLED" and site.jobs()[before] == "RUNNING"
    assert _chat(serving)["choices"]  # the old job never stopped serving
    # How a gate names a job that ended, from what scontrol says of this cancelled one: its Reason
    # is "None", scontrol's word for none, which the line leaves out.
    client = Client(settings_of(load_stack(site.project.root, INV, FAST)),
                    lambda command: subprocess.run(command, shell=True, capture_output=True, text=True).stdout.splitlines())
    rows = client.show(new.id)
    assert rows[0]["Reason"] == "None"
    assert re.fullmatch(rf"job {new.id} ended CANCELLED \(exit \d+:\d+\)", ended_words(new.id, rows, None))

    # A job that dies during start-up: the one line carries its last output lines.
    args = {**FAST["engine_args"], "decode": ["--time-scale", "0.05", "--no-such-flag"]}
    died = site.deploy(extra_data={"engine_args": args})
    assert not died.ok and "ended FAILED" in died.error and "unrecognized arguments: --no-such-flag" in died.error
    assert f"job {before} still serves" in died.error and site.jobs()[before] == "RUNNING"


def test_bad_input_is_one_line_and_nothing_serving_is_cancelled(site, tmp_path):
    [serving] = [i for i, s in site.jobs().items() if s == "RUNNING"]
    count = len(site.jobs())
    _one_line(site.deploy(extra_data={"slurm_partition": "nope"}),
              "partition 'nope' is not one slurmctld knows (data slurm_partition; partitions: kk, locked)")
    _one_line(site.deploy(extra_data={"decode_slurm": {"cpus": 9}}),
              "data decode_slurm['cpus'] = 9: no node of partition kk has more than 2 CPUs")
    _one_line(site.deploy(extra_data={"router_slurm": {"mem": "64G"}}),
              "data router_slurm['mem'] = '64G': no node of partition kk has more than 4000 MB")
    # slurmctld unreachable: a controller port nothing listens on; every client call has a timeout.
    dead = tmp_path / "dead.conf"
    conf = Path(site.cluster.conf).read_text()
    dead.write_text(conf.replace(f"SlurmctldPort={site.cluster.controller_port}", f"SlurmctldPort={free_port()}"))
    started = time.monotonic()
    _one_line(site.deploy(extra_data={"slurm_conf": str(dead), "slurm_timeout": 2}),
              "slurmctld unreachable", str(dead))
    assert time.monotonic() - started < 60
    assert len(site.jobs()) == count  # none of these submitted anything

    # An account the partition does not allow: submitted, refused by the scheduler (a reason that
    # waiting will not cure): the new job is cancelled at once, the serving one stays.
    result = site.deploy(extra_data={"slurm_partition": "locked", "slurm_account": "bogus"})
    assert not result.ok and result.record.slurm.job.cancelled_at
    assert "cannot start: pending with reason" in result.error and "data slurm_account = 'bogus'" in result.error
    assert site.jobs()[serving] == "RUNNING"

    # A job script that does not render: the template names what it lacks, nothing is run.
    template = site.project.templates_dir / "slurm-job.sh.j2"
    text = template.read_text()
    template.write_text(text.replace("{{ job_name }}", "{{ job_nmae }}", 1))
    try:
        with pytest.raises(UserError, match=r"templates/slurm-job\.sh\.j2: 'job_nmae' is undefined"):
            site.deploy(allow_dirty=True)
        broken = kk(site.project, "check")
    finally:
        template.write_text(text)
    assert broken.exit_code == 1 and "templates/slurm-job.sh.j2" in broken.output and "job_nmae" in broken.output
    # And the data itself, before anything contacts the cluster.
    bad = kk(site.project, "plan", INV, "--data", 'prefill_slurm={"cpu": 2}')
    assert bad.exit_code == 2 and "data prefill_slurm['cpu']: no such key (keys: cpus, mem, gpus" in bad.output
    bad = kk(site.project, "plan", INV, "--data", 'slurm_time_limit="soon"')
    assert bad.exit_code == 2 and "data slurm_time_limit = 'soon': expected a Slurm time" in bad.output
    assert site.jobs()[serving] == "RUNNING"


def test_ab_run_switches_arms_by_submitting_jobs(site):
    """`ab run` through the same deploy API: every arm switch is a new job, the load goes to the router
    where that job placed it, the knob is read back from the job's script; a verdict is reached."""
    result = kk(site.project, "ab", "run", "--inventory", INV, "--role", "decode", "--set",
                f"{KNOB}=256", "--concurrency", "8", "--repeats", "2", "--duration", "1", "--input-len", "8",
                "--output-len", "64", "--json")
    assert result.exit_code == 0, result.output[-3000:]
    doc = json.loads(result.output[result.output.index("{"):])
    [level] = doc["judgement"]["levels"]
    assert level["verdict"] in ("better", "worse", "inconclusive", "no detectable change"), level
    assert {r["knob_seen"]["status"] for r in doc["runs"]} == {"carried"}, doc["runs"][0]["knob_seen"]
    assert all(r["errors"] == 0 and r["completed"] > 0 for r in doc["runs"]) and len(doc["runs"]) == 4
    assert all(r["prefill_prompt_tokens"] > 0 for r in doc["runs"])
    # Restored: the declared state (512) runs in one job, and the incident snapshot finds it there.
    running = [i for i, s in site.jobs().items() if s == "RUNNING"]
    assert len(running) == 1
    states = stack_status(site.project, INV)  # ab run deploys the inventory as it is (no test data)
    assert {s.state for s in states} == {"in sync"} and {s.job for s in states} == set(running), states
    opened = kk(site.project, "incident", "open", "client hangs")
    assert opened.exit_code == 0, opened.output
    ident = opened.output.split()[1].rstrip(":")
    snap = kk(site.project, "incident", "snapshot", ident, "--inventory", INV, "--window", "0.5")
    assert snap.exit_code == 0, snap.output
    placed = site.placed()
    [stored] = sorted(site.project.incidents_dir.rglob("snapshot-*.json"))
    rows = {r["service"]: r for r in json.loads(stored.read_text())["services"]}
    assert not any(r.get("error") for r in rows.values()), rows
    workers = {w["url"] for w in rows["knobkeeper-router"]["workers"]["workers"]}
    assert workers == {placed["knobkeeper-prefill"].url, placed["knobkeeper-decode"].url}, (workers, placed)

    # A serving job that ends (scancel here; node failure, preemption or a time limit alike): status
    # says down for every component and names the job and how Slurm says it ended.
    [gone] = running
    site.cluster.client("scancel", gone, check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        out = site.cluster.client("squeue", "-h", "-t", "all", "-o", "%i %T", check=True).stdout.split()
        if {s for i, s in zip(out[::2], out[1::2]) if i.split("+")[0] == gone} == {"CANCELLED"}:
            break
        time.sleep(0.2)
    states = stack_status(site.project, INV)
    assert {s.state for s in states} == {"down"}, states
    assert all(f"job {gone} ended CANCELLED" in s.differences[0] for s in states), states[0].differences
