"""Render: templates -> launch scripts, supervisord sections, systemd units; topology; linting.

No process is started and no host is contacted. Lint tools (shellcheck, systemd-analyze) are run for
real: CI installs them (`make system-deps`).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from knobkeeper.deploy.render import (
    OVERRIDE,
    Source,
    normalize_overrides,
    parse_meta,
    render_service,
    render_stack,
    render_supervisord,
)
from knobkeeper.deploy.stack import load_stack
from knobkeeper.deploy.topology import Role, deploy_order, downstream, role_from_data
from knobkeeper.errors import UserError
from knobkeeper.knobs.catalog import load_catalog

ROOT = Path(__file__).resolve().parent.parent
NASTY = "a 'single' \"double\" $(touch /tmp/kk-pwned) `id` $HOME \\ ; | & * ?\nsecond line\ttab !x"
PROD = "inventory/example_prod.py"
LOCAL = "inventory/local.py"


@pytest.fixture(scope="module")
def catalog(shared):
    return load_catalog(shared.catalog_path)


def _rendered(project, inventory, data=None, overrides=None):
    stack = load_stack(project.root, inventory, data)
    return stack, render_stack(project, stack, knob_overrides=overrides, source=Source("0123abcd", False))


def _need(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is not installed (run `make system-deps`); rendered files must lint")


# --- topology --------------------------------------------------------------------------------------


def _roles(**after) -> dict[str, Role]:
    return {name: Role(name=name, services=(f"svc-{name}",), health="/health", after=tuple(deps))
            for name, deps in after.items()}


def test_order_is_a_topological_sort_of_after():
    roles = _roles(router=["prefill", "decode"], decode=["prefill"], prefill=[])
    assert deploy_order(roles) == ["prefill", "decode", "router"]
    assert downstream(["prefill", "decode", "router"], roles, ["decode"]) == {"router"}
    assert downstream(["prefill", "decode", "router"], roles, ["prefill"]) == {"decode", "router"}


def test_cycle_is_an_error_naming_the_cycle():
    roles = _roles(prefill=["router"], decode=["prefill"], router=["decode"])
    with pytest.raises(UserError, match=r"cycle: (\w+ -> ){3}\w+"):
        deploy_order(roles)
    with pytest.raises(UserError) as info:
        deploy_order(roles)
    text = str(info.value)
    assert "prefill" in text and "decode" in text and "router" in text


def test_unknown_role_in_after_is_named():
    with pytest.raises(UserError, match="'prefil' is not a role"):
        deploy_order(_roles(prefill=[], decode=["prefil"]))


def test_role_data_is_validated():
    with pytest.raises(UserError, match=r"role_decode\['health'\]"):
        role_from_data("decode", {"services": ["x"], "health": "health"})
    with pytest.raises(UserError, match="no such key"):
        role_from_data("decode", {"services": ["x"], "health": "/health", "afterr": []})


def test_inventories_give_order_from_group_data(shared):
    for inventory in (LOCAL, PROD):
        stack = load_stack(shared.root, inventory)
        assert stack.order == ["prefill", "decode", "router"]
    prod = load_stack(shared.root, PROD)
    assert [h for h in prod.hosts] == ["prefill-1", "prefill-2", "decode-1", "decode-2", "router-1"]
    router = prod.service("router-1", "knobkeeper-router")
    cmd = prod.command(router)
    assert cmd.count("--prefill") == 2 and cmd.count("--decode") == 2
    assert "--pd-disaggregation" in cmd and router.health_path == "/readiness"
    decode_cmd = prod.command(prod.service("decode-1", "knobkeeper-decode"))
    assert decode_cmd[decode_cmd.index("--disaggregation-mode") + 1] == "decode"


def test_local_ports_come_from_the_environment(shared, monkeypatch):
    monkeypatch.setenv("KNOBKEEPER_LOCAL_PORTS", "prefill=41000,bootstrap:41998,decode=41001,router=41080,router_metrics=41081")
    stack = load_stack(shared.root, LOCAL)
    ports = {s.role: s.port for s in stack.services}
    assert ports == {"prefill": 41000, "decode": 41001, "router": 41080}
    assert stack.service("@local", "knobkeeper-prefill").bootstrap_port == 41998
    assert stack.hosts["@local"].prefix == str(shared.root / ".knobkeeper-state" / "local")
    # --data beats the environment
    assert load_stack(shared.root, LOCAL, {"decode_port": 42001}).service("@local", "knobkeeper-decode").port == 42001
    monkeypatch.setenv("KNOBKEEPER_LOCAL_PORTS", "decod=1")
    with pytest.raises(UserError, match="KNOBKEEPER_LOCAL_PORTS"):
        load_stack(shared.root, LOCAL)


@pytest.mark.parametrize("inventory, variable, name, datum", [
    ("inventory/local.py", "KNOBKEEPER_LOCAL_PORTS", "decode", "decode_port"),
    ("inventory/local_vllm.py", "KNOBKEEPER_LOCAL_VLLM_PORTS", "decode_side_channel", "decode_side_channel_port"),
    ("inventory/local_slurm.py", "KNOBKEEPER_LOCAL_PORTS", "router_metrics", "router_metrics_port"),
])
def test_the_local_inventories_read_the_environment_with_one_parser(shared, monkeypatch, inventory, variable, name,
                                                                    datum):
    """NAME=N lists are parsed once, by knobkeeper.inventory_env (the inventories held three copies)."""
    from knobkeeper.deploy.stack import load_inventory

    text = (shared.root / inventory).read_text()
    assert "from knobkeeper.inventory_env import numbers" in text and ".split(\",\")" not in text
    monkeypatch.setenv(variable, f" {name}:41234 ")
    assert load_inventory(shared.root, inventory).get_host("@local").data.get(datum) == 41234
    monkeypatch.setenv(variable, f"{name}=x")
    with pytest.raises(UserError, match=re.escape(f"{variable}: '{name}=x': expected NAME=PORT with NAME one of ")):
        load_inventory(shared.root, inventory)


def test_decode_workers_datum_makes_more_services_each_with_its_port_behind_the_router(shared, monkeypatch):
    """decode_workers=N (--data, or KNOBKEEPER_LOCAL_WORKERS for every command)
    runs N decode services, named after the role's one, ports base+n, every one behind the router."""
    one = load_stack(shared.root, LOCAL)
    assert [s.name for s in one.services] == ["knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router"]
    monkeypatch.setenv("KNOBKEEPER_LOCAL_WORKERS", "decode=2")
    for stack in (load_stack(shared.root, LOCAL), load_stack(shared.root, LOCAL, {"decode_workers": 2})):
        decodes = [s for s in stack.services if s.role == "decode"]
        assert [(s.name, s.port, s.index) for s in decodes] == [("knobkeeper-decode", 30001, 0),
                                                                 ("knobkeeper-decode-2", 30002, 1)]
        router = stack.command(stack.service("@local", "knobkeeper-router"))
        assert [router[i + 1] for i, a in enumerate(router) if a == "--decode"] == [s.url for s in decodes]
        assert stack.command(decodes[1])[stack.command(decodes[1]).index("--port") + 1] == "30002"
    # --data wins over the environment; the default is the role's own service list
    assert len(load_stack(shared.root, LOCAL, {"decode_workers": 1}).hosts["@local"].role_services("decode")) == 1
    monkeypatch.delenv("KNOBKEEPER_LOCAL_WORKERS")
    for bad, needle in ((0, "data decode_workers = 0: expected a whole number of at least 1"),
                        ("two", "data decode_workers = 'two'"), (True, "data decode_workers = True")):
        with pytest.raises(UserError, match=re.escape(needle)):
            load_stack(shared.root, LOCAL, {"decode_workers": bad})
    # a second prefill worker would take the decode port: refused, naming both
    with pytest.raises(UserError, match="port 30001 on 127.0.0.1: used by both @local/knobkeeper-prefill-2 and "
                                        "@local/knobkeeper-decode"):
        load_stack(shared.root, LOCAL, {"prefill_workers": 2})
    monkeypatch.setenv("KNOBKEEPER_LOCAL_WORKERS", "decode=x")
    with pytest.raises(UserError, match="KNOBKEEPER_LOCAL_WORKERS: 'decode=x': expected NAME=COUNT"):
        load_stack(shared.root, LOCAL)


def test_a_service_keyed_override_renders_that_service_only(shared, catalog):
    """{"HOST/SERVICE": {KNOB: value}} changes one worker's launch script (a canary on a
    host that also runs baseline workers); its sibling renders byte for byte as without it."""
    data = {"decode_workers": 2}
    knob = "SGLANG_SM120_MMA_TARGET_CTAS"
    _, plain = _rendered(shared, LOCAL, data)
    _, canary = _rendered(shared, LOCAL, data, {"@local/knobkeeper-decode-2": {knob: "256"}})
    second = canary[("@local", "knobkeeper-decode-2")]
    assert second.knobs == {knob: "256"} and f"# knob {knob}: {OVERRIDE}" in second.launch
    assert second.digest != plain[("@local", "knobkeeper-decode-2")].digest
    for key in (("@local", "knobkeeper-decode"), ("@local", "knobkeeper-prefill"), ("@local", "knobkeeper-router")):
        assert canary[key].files == plain[key].files and canary[key].digest == plain[key].digest
    # a service's override wins over its role's
    _, both = _rendered(shared, LOCAL, data, {"decode": {knob: 128}, "@local/knobkeeper-decode-2": {knob: 512}})
    assert both[("@local", "knobkeeper-decode")].knobs == {knob: "128"}
    assert both[("@local", "knobkeeper-decode-2")].knobs == {knob: "512"}
    services = {"@local/knobkeeper-decode": "decode", "@local/knobkeeper-prefill": "prefill"}
    with pytest.raises(UserError, match=re.escape("knob_overrides: '@local/knobkeeper-decode-9' is not a service of "
                                                  "this inventory (services: @local/knobkeeper-decode, "
                                                  "@local/knobkeeper-prefill)")):
        normalize_overrides(catalog, {"@local/knobkeeper-decode-9": {knob: 512}}, ["decode"], services)
    with pytest.raises(UserError, match="does not apply to role 'prefill'"):
        normalize_overrides(catalog, {"@local/knobkeeper-prefill": {knob: 512}}, ["prefill", "decode"], services)
    with pytest.raises(UserError, match="expected an integer"):
        normalize_overrides(catalog, {"@local/knobkeeper-decode": {knob: "many"}}, ["decode"], services)


# --- render ------------------------------------------------------------------------------------------


def test_every_file_has_a_header_naming_the_commit(shared):
    for inventory in (LOCAL, PROD):
        stack, rendered = _rendered(shared, inventory)
        assert len(rendered) == len(stack.services)
        for item in rendered.values():
            for path, text in item.files.items():
                lines = text.splitlines()
                first = 1 if lines[0].startswith("#!") else 0   # the header follows a shebang
                assert lines[first + 1].lstrip("#; ").startswith("source: 0123abcd"), (path, lines[:4])
            launch = item.launch
            assert launch.startswith("#!/usr/bin/env bash\n")
            assert "set -euo pipefail" in launch
            assert parse_meta(launch)["digest"] == item.digest


def test_knob_values_are_quoted_and_named_with_their_entry(shared, catalog):
    stack = load_stack(shared.root, LOCAL)
    svc = stack.service("@local", "knobkeeper-decode")
    item = render_service(
        svc, stack.command(svc), knobs={"SGLANG_SM120_MMA_TARGET_CTAS": 512, "KNOBKEEPER_SIM_EXTRA_ARGS": NASTY,
                                        "NCCL_IB_DISABLE": True},
        catalog=catalog, provenance={"SGLANG_SM120_MMA_TARGET_CTAS": "entry 1a2b3c4d (set 2026-11-29T00:00:00Z by A)"},
        source=Source("feedface", True), templates_dir=shared.templates_dir,
    )
    text = item.launch
    assert "# source: feedface (dirty)" in text
    assert "# knob SGLANG_SM120_MMA_TARGET_CTAS: entry 1a2b3c4d" in text
    assert "export SGLANG_SM120_MMA_TARGET_CTAS=512" in text
    assert "export NCCL_IB_DISABLE=1" in text
    assert "unset " in text and "SGLANG_DISAGGREGATION_WAITING_TIMEOUT" in text.split("unset ", 1)[1].splitlines()[0]
    assert "\nexec " in text
    assert item.knobs["NCCL_IB_DISABLE"] == "true"


def test_quoted_value_reaches_the_process_byte_for_byte(shared, catalog, tmp_path):
    """Run the rendered script with a command that prints the variable: same bytes, nothing executed."""
    stack = load_stack(shared.root, LOCAL, {"prefix": str(tmp_path / "p")})
    svc = stack.service("@local", "knobkeeper-decode")
    printer = [sys.executable, "-c", "import os,sys; sys.stdout.buffer.write(os.environb[b'KNOBKEEPER_SIM_EXTRA_ARGS'])"]
    item = render_service(svc, printer, knobs={"KNOBKEEPER_SIM_EXTRA_ARGS": NASTY}, catalog=catalog, provenance={},
                          source=Source("x"), templates_dir=shared.templates_dir)
    script = tmp_path / "launch.sh"
    script.write_text(item.launch)
    Path(svc.service_dir).mkdir(parents=True)
    marker = Path("/tmp/kk-pwned")
    marker.unlink(missing_ok=True)
    done = subprocess.run(["bash", str(script)], capture_output=True, env={**os.environ, "NCCL_DEBUG": "TRACE"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == NASTY.encode()
    assert not marker.exists()


def test_undeclared_catalog_knobs_are_unset_not_inherited(shared, catalog, tmp_path):
    stack = load_stack(shared.root, LOCAL, {"prefix": str(tmp_path / "p")})
    svc = stack.service("@local", "knobkeeper-prefill")
    printer = [sys.executable, "-c", "import os; print(os.environ.get('NCCL_DEBUG', 'absent'))"]
    item = render_service(svc, printer, knobs={}, catalog=catalog, provenance={}, source=Source("x"),
                          templates_dir=shared.templates_dir)
    (tmp_path / "l.sh").write_text(item.launch)
    Path(svc.service_dir).mkdir(parents=True)
    done = subprocess.run(["bash", str(tmp_path / "l.sh")], capture_output=True, text=True,
                          env={**os.environ, "NCCL_DEBUG": "TRACE"})
    assert done.stdout.strip() == "absent"


def test_secret_is_never_inlined(shared, catalog):
    stack = load_stack(shared.root, PROD)
    svc = stack.service("prefill-1", "knobkeeper-prefill")
    fp = "sha256:0123456789abcdef"
    item = render_service(svc, stack.command(svc), knobs={"HF_TOKEN": fp}, catalog=catalog, provenance={},
                          source=Source("x"), templates_dir=shared.templates_dir)
    path = "/opt/knobkeeper/secrets/prefill/HF_TOKEN"
    assert item.secrets == {path: ("prefill", "HF_TOKEN")}
    assert f"HF_TOKEN=\"$(cat {path})\"\nexport HF_TOKEN" in item.launch
    assert item.knobs["HF_TOKEN"] == fp


def test_digest_ignores_the_commit_but_not_the_values(shared, catalog):
    stack = load_stack(shared.root, LOCAL)
    svc = stack.service("@local", "knobkeeper-decode")

    def digest(source, knobs):
        return render_service(svc, stack.command(svc), knobs=knobs, catalog=catalog, provenance={}, source=source,
                              templates_dir=shared.templates_dir).digest

    assert digest(Source("aaaa"), {}) == digest(Source("bbbb", True), {})
    assert digest(Source("aaaa"), {}) != digest(Source("aaaa"), {"SGLANG_SM120_MMA_TARGET_CTAS": 512})
    assert digest(Source("aaaa"), {"KNOBKEEPER_SIM_EXTRA_ARGS": "a\n# b"}) != \
        digest(Source("aaaa"), {"KNOBKEEPER_SIM_EXTRA_ARGS": "a\n# c"})


def test_overrides_are_marked_and_checked(shared, catalog):
    _, rendered = _rendered(shared, LOCAL, overrides={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}})
    decode = rendered[("@local", "knobkeeper-decode")]
    assert f"# knob SGLANG_SM120_MMA_TARGET_CTAS: {OVERRIDE}" in decode.launch
    assert decode.knobs == {"SGLANG_SM120_MMA_TARGET_CTAS": "256"}
    assert rendered[("@local", "knobkeeper-prefill")].knobs == {}
    flat = normalize_overrides(catalog, {"NCCL_MIN_NCHANNELS": 4}, ["prefill", "decode", "router"])
    assert flat == {"prefill": {"NCCL_MIN_NCHANNELS": 4}, "decode": {"NCCL_MIN_NCHANNELS": 4}}
    with pytest.raises(UserError, match="SGLANG_SM120_MMA_TARGET_CTAS"):
        normalize_overrides(catalog, {"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": 0}}, ["decode"])
    with pytest.raises(UserError, match="secret"):
        normalize_overrides(catalog, {"prefill": {"HF_TOKEN": "x"}}, ["prefill"])


def test_undefined_template_variable_is_an_error(shared, catalog, tmp_path):
    templates = tmp_path / "templates"
    shutil.copytree(shared.templates_dir, templates)
    (templates / "launch.sh.j2").write_text((templates / "launch.sh.j2").read_text() + "{{ no_such_variable }}\n")
    stack = load_stack(shared.root, LOCAL)
    svc = stack.service("@local", "knobkeeper-decode")
    with pytest.raises(UserError, match="no_such_variable"):
        render_service(svc, stack.command(svc), knobs={}, catalog=catalog, provenance={}, source=Source("x"),
                       templates_dir=templates)


# --- lint --------------------------------------------------------------------------------------------


def _all_launch_scripts(project, tmp_path):
    nasty = {"decode": {"KNOBKEEPER_SIM_EXTRA_ARGS": NASTY, "SGLANG_SM120_MMA_TARGET_CTAS": 512},
             "prefill": {"NCCL_SOCKET_IFNAME": "^docker,lo", "NCCL_IB_DISABLE": True}}
    for inventory in (LOCAL, PROD):
        _, rendered = _rendered(project, inventory, overrides=nasty)
        for (host, name), item in rendered.items():
            yield f"{inventory}:{host}/{name}", item


def test_launch_scripts_pass_bash_n_and_shellcheck(shared, tmp_path):
    _need("shellcheck")
    count = 0
    for label, item in _all_launch_scripts(shared, tmp_path):
        script = tmp_path / f"launch-{count}.sh"
        script.write_text(item.launch)
        count += 1
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{label}: {done.stderr}"
        done = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
        assert done.returncode == 0 and not done.stdout.strip(), f"{label}:\n{done.stdout}{done.stderr}"
    assert count == 3 + 5


def test_systemd_units_verify_without_warnings(shared, tmp_path):
    """Render the production units with the prefix in a temp dir where the launch script exists."""
    _need("systemd-analyze")
    prefix = tmp_path / "opt"
    units = tmp_path / "units"
    stack, rendered = _rendered(shared, PROD, data={"prefix": str(prefix), "systemd_unit_dir": str(units)})
    for (host, name), item in rendered.items():
        for path, text in item.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
            if path.endswith("launch.sh"):
                os.chmod(path, 0o755)
        unit = item.service.unit_path
        done = subprocess.run(["systemd-analyze", "verify", unit], capture_output=True, text=True)
        assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), \
            f"{host}/{name}:\n{done.stdout}{done.stderr}"
        os.remove(unit)  # each unit verified alone (same name on every host)


def test_supervisor_sections_parse(shared, tmp_path):
    from supervisor.options import ServerOptions

    stack, rendered = _rendered(shared, LOCAL, data={"prefix": str(tmp_path / "p")})
    plan = stack.hosts["@local"]
    for path, text in render_supervisord(plan, Source("x"), shared.templates_dir).items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    for item in rendered.values():
        for path, text in item.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    (Path(plan.supervisor.root) / "logs").mkdir()
    options = ServerOptions()
    options.realize(args=["-c", plan.supervisor.conf])
    groups = {g.name: g for g in options.process_group_configs}
    assert set(groups) == {"knobkeeper-prefill", "knobkeeper-decode", "knobkeeper-router"}
    for group in groups.values():
        proc = group.process_configs[0]
        assert proc.autostart is False
        assert proc.command.endswith("/launch.sh")


def test_launch_script_mode_and_paths(shared):
    stack, rendered = _rendered(shared, PROD)
    item = rendered[("decode-1", "knobkeeper-decode")]
    assert item.modes == {"/opt/knobkeeper/services/knobkeeper-decode/launch.sh": "0755",
                          "/etc/systemd/system/knobkeeper-decode.service": "0644"}
    unit = item.files["/etc/systemd/system/knobkeeper-decode.service"]
    assert "ExecStart=/opt/knobkeeper/services/knobkeeper-decode/launch.sh" in unit
    assert "User=sglang" in unit
    assert stat.S_IMODE(0o755) == 0o755


def test_deploy_refuses_bad_only_and_overrides_before_pyinfra_starts(project):
    from click.testing import CliRunner

    from knobkeeper.cli import main
    from tests.infra import git

    head = git(project.root, "rev-parse", "HEAD")
    for args, needle in (
        (["--only", "nope"], "--only 'nope': not a role of inventory/local.py"),
        (["--override", "decode:NOPE=1"], "unknown knob 'NOPE'"),
        (["--override", "decode:SGLANG_SM120_MMA_TARGET_CTAS=abc"], "expected an integer in [1, 8192]"),
        (["--override", "prefill:SGLANG_SM120_MMA_TARGET_CTAS=512"], "does not apply to role 'prefill'"),
        (["--override", "decode-SGLANG=1"], "expected ROLE:KNOB=VALUE"),
    ):
        result = CliRunner().invoke(main, ["deploy", *args, "--repo", str(project.root)])
        assert result.exit_code == 2, (args, result.output)
        assert result.output.count("error:") == 1 and needle in result.output, (args, result.output)
    assert git(project.root, "rev-parse", "HEAD") == head
    assert git(project.root, "status", "--porcelain") == ""
    assert not (project.state_dir / "local").exists()


# --- one header rule, one options parser -------------------------------------------------------------


def test_strip_header_is_the_digest_rule_and_keeps_the_shebang(shared, catalog):
    from knobkeeper.deploy.render import strip_header

    stack, rendered = _rendered(shared, LOCAL)
    for item in rendered.values():
        for path, text in item.files.items():
            body = strip_header(text)
            assert "rendered by knobkeeper" not in body and "digest:" not in body, path
            if path.endswith("launch.sh"):
                assert body.startswith("#!/usr/bin/env bash\n")
                # the template's own comments are body, not header
                assert "# Knob values are literals" in body and "# shellcheck disable=SC2016" in body
    # Another source commit changes every header, never a body or a digest.
    _, again = _rendered_with(shared, LOCAL, Source("feedbeef", True))
    for key, item in rendered.items():
        assert item.digest == again[key].digest
        assert {p: strip_header(t) for p, t in item.files.items()} == {p: strip_header(t) for p, t in again[key].files.items()}


def _rendered_with(project, inventory, source, data=None):
    stack = load_stack(project.root, inventory, data)
    return stack, render_stack(project, stack, source=source)


def test_deploy_options_are_validated_once_with_one_line_errors():
    from knobkeeper.deploy.options import DeployOptions

    opts = DeployOptions.from_data({"restart": "co", "only": "decode", "batch": "2", "rollback": "true",
                                    "knob_overrides": '{"decode": {"X": 1}}', "record": False})
    assert (opts.restart, opts.only, opts.batch, opts.rollback, opts.record) == ("co", "decode", 2, True, False)
    assert opts.knob_overrides == {"decode": {"X": 1}}
    assert DeployOptions.from_data(opts.to_data()) == opts
    for data, needle in (({"restart": "sometimes"}, "--data restart=sometimes: expected one of changed, co, none"),
                         ({"batch": 0}, "--data batch=0: expected a number of hosts"),
                         ({"rollback": "maybe"}, "--data rollback='maybe': expected true or false"),
                         ({"knob_overrides": "[1"}, "expected a JSON object")):
        with pytest.raises(UserError, match=None) as err:
            DeployOptions.from_data(data)
        assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="--only 'nope': not a role of inventory/local.py"):
        DeployOptions(only="nope").check_roles(["prefill", "decode"], "inventory/local.py")


# --- what changed, in words (the reasons a restart names) ---------------------------------------------


def test_change_reasons_name_knob_flag_interpreter_and_template(shared, catalog, tmp_path):
    from knobkeeper.deploy.plan import change_reasons

    stack, before = _rendered(shared, LOCAL)
    data = {"python": "/opt/other/bin/python",
            "engine_args": {"prefill": ["--time-scale", "0.1"], "decode": ["--time-scale", "0.05", "--seed", "7"],
                            "router": []}}
    _, after = _rendered(shared, LOCAL, data=data, overrides={"decode": {"SGLANG_SM120_MMA_TARGET_CTAS": 512}})
    key = ("@local", "knobkeeper-decode")
    reasons = change_reasons(before[key].files, after[key].files)
    assert "knob SGLANG_SM120_MMA_TARGET_CTAS: set to 512 (was unset)" in reasons
    assert "flag --time-scale: 0.1 -> 0.05" in reasons
    assert "flag --seed: added (7)" in reasons
    assert f"interpreter: {sys.executable} -> /opt/other/bin/python" in reasons
    assert not any("sha256:" in r for r in reasons)
    # A template change in the program section names the setting and both values.
    old_conf = before[key].files[stack.service("@local", "knobkeeper-decode").manager_file]
    path = stack.service("@local", "knobkeeper-decode").manager_file
    assert change_reasons({path: old_conf.replace("startsecs=2", "startsecs=0")}, {path: old_conf}) == [
        "supervisor program section: startsecs: 0 -> 2"]
    # The same render twice: nothing changed, nothing said.
    assert change_reasons(before[key].files, before[key].files) == []


def test_a_multi_line_value_is_one_knob_change_not_template_lines(shared):
    """An export of a multi-line value spans lines of the script; they are one shell line, so its
    change is the knob's (both values in full), never "launch script template: N line(s) added",
    and a line of it that looks like the exec line is not taken for the command."""
    from knobkeeper.deploy.plan import change_reasons

    knob, key = "KNOBKEEPER_SIM_EXTRA_ARGS", ("@local", "knobkeeper-decode")
    first, second = "first line\n\nafter an empty line; it's $HOME", "one\nexec /bin/false --x 'y'\ntwo"
    _, unset = _rendered(shared, LOCAL)
    _, one = _rendered(shared, LOCAL, overrides={"decode": {knob: first}})
    _, two = _rendered(shared, LOCAL, overrides={"decode": {knob: second}})
    assert change_reasons(unset[key].files, one[key].files) == [
        f"knob {knob}: set to \"first line\\n\\nafter an empty line; it's $HOME\" (was unset)"]
    assert change_reasons(one[key].files, two[key].files) == [
        f"knob {knob}: \"first line\\n\\nafter an empty line; it's $HOME\" -> \"one\\nexec /bin/false --x 'y'\\ntwo\""]


# --- secrets: the value shipped is the value declared ----------------------------------------------------


def test_deploy_and_status_refuse_a_secret_whose_stored_value_is_not_the_declared_one(project):
    from knobkeeper.changelog.ops import revert_knob, set_knob
    from knobkeeper.deploy.api import run_deploy
    from knobkeeper.deploy.status import stack_status
    from tests.infra import git

    set_knob(project, "HF_TOKEN", "token-a", "decode", "first token")
    set_knob(project, "HF_TOKEN", "token-b", "decode", "rotated")
    revert_knob(project, "HF_TOKEN", "decode", "back to a")
    stack = load_stack(project.root, LOCAL)
    from knobkeeper.changelog.secrets import secret_path
    from knobkeeper.knobs.catalog import fingerprint

    # The store keeps a value per fingerprint, so the revert found token-a; edit that file by hand.
    value_file = secret_path(project, "decode", "HF_TOKEN", fingerprint("token-a"))
    assert value_file.read_text() == "token-a"
    value_file.write_text("token-b")
    with pytest.raises(UserError, match=r"\[decode\] HF_TOKEN: .* holds a value whose fingerprint is not sha256:"):
        render_stack(project, stack, check_secrets=True)
    head = git(project.root, "rev-parse", "HEAD")
    with pytest.raises(UserError, match=r"\[decode\] HF_TOKEN"):
        run_deploy(project, LOCAL)
    assert git(project.root, "rev-parse", "HEAD") == head and not (project.state_dir / "local").exists()
    rows = {r.service: r for r in stack_status(project, LOCAL)}
    assert any("[decode] HF_TOKEN: " in d and "fingerprint is not" in d for d in rows["knobkeeper-decode"].differences)
    assert not any("HF_TOKEN" in d for d in rows["knobkeeper-prefill"].differences)
    value_file.unlink()  # a value this machine never had: refused as missing, not shipped
    with pytest.raises(UserError, match=r"\[decode\] HF_TOKEN: the secret value sha256:\w+ is not in"):
        render_stack(project, stack, check_secrets=True)
    assert "token-a" not in str(rows) and "token-b" not in str(rows)


# --- names that reach the launch script --------------------------------------------------------------------


def test_host_environment_names_are_checked_where_they_enter(shared):
    marker = "/tmp/kk-env-name-pwned"
    with pytest.raises(UserError) as err:
        load_stack(shared.root, LOCAL, {"environment": {f"X;touch {marker};Y": "1"}})
    text = str(err.value)
    assert "inventory local, host @local: data environment" in text and "touch" in text and "\n" not in text
    assert load_stack(shared.root, LOCAL, {"environment": {"GOOD_NAME_1": "x"}}).hosts["@local"]


def test_the_launch_script_stops_what_an_earlier_run_of_its_service_left_first(shared, catalog, tmp_path):
    """A kill -9 of vLLM's API server leaves its engine core and worker running, and supervisord restarts
    only the process it started. Each run writes its process group next to its launch script; the next
    start stops (TERM) every process still in that group whose working folder is the service's, and
    only those: one of that group elsewhere, or one in the folder but of another group (a shell cd'ed
    there), lives on. Then it writes its own group."""
    stack = load_stack(shared.root, LOCAL, {"prefix": str(tmp_path / "p")})
    svc = stack.service("@local", "knobkeeper-decode")
    item = render_service(svc, ["true"], knobs={"SGLANG_SM120_MMA_TARGET_CTAS": 512}, catalog=catalog,
                          provenance={}, source=Source("x"), templates_dir=shared.templates_dir)
    # ... before any knob is exported: its helpers (tr, cut, kill) never see the engine's environment,
    # and shellcheck stays linear in a 64 KiB value (after the exports it took 20 s on one).
    assert item.launch.index("kk_leftovers()") < item.launch.index("export ") < item.launch.index("\nexec ")
    script = tmp_path / "launch.sh"
    script.write_text(item.launch)
    Path(svc.service_dir).mkdir(parents=True)
    left = subprocess.Popen(["sleep", "600"], cwd=svc.service_dir, process_group=0)     # a group of its own
    elsewhere = subprocess.Popen(["sleep", "600"], cwd=tmp_path, process_group=left.pid)
    bystander = subprocess.Popen(["sleep", "600"], cwd=svc.service_dir, process_group=0)
    Path(svc.group_path).write_text(f"{left.pid}\n")
    try:
        done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert left.wait(10) == -15                                    # TERM'd by the launch script
        assert elsewhere.poll() is None and bystander.poll() is None   # not what the last run left
        assert done.stdout.splitlines() == [f"knobkeeper: stopping what is left of an earlier knobkeeper-decode: "
                                            f"pid {left.pid} (sleep 600)"]
        assert Path(svc.group_path).read_text().strip() == str(os.getpgid(0))   # this run's group
        again = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and again.stdout == ""            # nothing left of that run
    finally:
        for proc in (left, elsewhere, bystander):
            proc.kill()
            proc.wait()
