"""What every engine family answers, and the small value types it answers with (NamedTuples: `set`
imports every family, and a frozen dataclass costs seven times as much to define).

A family is one class (one module: sglang.py, vllm.py, sim.py, routers.py) whose instance the
lookup in knobkeeper.engine returns. The rest of the tool asks it:

    kind               "worker" (serves prefill or decode) or "router" (fronts the workers)
    simulated          True for the sim: it says so wherever it is used
    command(...)       the argv a service runs; instance_environment(...): per-instance variables
    managed_env(...)   the cached engine environment the deploy installs for it (vLLM's CPU build)
    instance_ports     extra per-instance ports read from data `<role>_<name>_port`
    uses_bootstrap     whether its prefill serves a bootstrap port the router names
    endpoints          health / readiness / workers paths
    metrics            Prometheus names: throughput counter, running/waiting gauges, TTFT/ITL/TPOT
                       histograms, finished and aborted requests
    bench_format       the evidence importer format of its own benchmark client's files
    registry           how its variable registry is read (None: it has none)
    parser             its own flag parser, run in a side environment (None: not checked)
    pairing_problems   the PD invariants between its parsed prefill and decode arguments
    stuck_start(...)   words for a start-up its own log says can never finish (the gate stops
                       waiting at once), with start_marker: how its process's own log lines begin
    deaths(lines)      words for each of its processes its own log says died, and how (vLLM's
                       worker "died unexpectedly (exit code: -4)": SIGILL): a gate, the PD proof
                       and the record name that instead of the router's HTTP 500
    prove_pd(...)      (where a family has it: vLLM) that every decode instance's prompt tokens come
                       over the connector, after a deploy that restarted a worker

Families import nothing of knobkeeper but errors, fmt, ports and this package: they sit below knobs and
deploy, which ask them.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Mapping, NamedTuple

from knobkeeper.errors import UserError

Workers = dict[str, list[tuple[str, int | None]]]  # {"prefill": [(url, bootstrap port)], "decode": [...]}
VENV_PYTHON = "{prefix}/venv/bin/python"


class Series(NamedTuple):
    """A Prometheus series: a name as exposed, optionally only the samples whose `label` is one of
    `values` (vLLM counts aborted requests as request_success{finished_reason="abort"})."""

    name: str
    label: str | None = None
    values: tuple[str, ...] = ()

    def promql(self) -> str:
        if self.label is None:
            return self.name
        return f'{self.name}{{{self.label}=~"{"|".join(self.values)}"}}'


class Metrics(NamedTuple):
    """The names one engine exports its serving metrics under (counters with their _total)."""

    tokens: str  # output tokens generated (counter)
    running: str  # requests being processed (gauge)
    waiting: str  # requests queued (gauge)
    ttft: str  # time to first token (histogram)
    itl: str  # inter-token latency (histogram): its _sum's rate is the requests generating
    tpot: tuple[str, ...]  # time per output token (histogram), names newest version first
    requests: Series | None  # finished requests (counter)
    aborted: Series | None  # aborted / failed requests (counter)
    prompt_tokens: str | None = None  # prompt tokens processed (counter): did prefill run


class Endpoints(NamedTuple):
    health: str  # 200 while the process serves
    readiness: str  # 200 only when it can take traffic: what a gate polls
    workers: str | None = None  # a router's list of its workers and their health


class Parsed(NamedTuple):
    """One service's command as its engine version's own parser read it."""

    key: str  # host/service
    role: str
    url: str
    host: str  # the address other hosts reach it at
    version: str
    ok: bool
    args: dict[str, Any]
    message: str = ""
    environment: Mapping[str, str] = {}  # what its launch script exports (never mutated)


class RegistryReader(NamedTuple):
    """Where a family declares the variables it reads, and the function that reads them (ast only):
    `read(source)` returns {"knobs": {NAME: entry}, "deprecated": {NAME: {"replacement", "note"}}},
    entries in the catalog's vocabulary (type, kind, default | default_computed, doc, secret, alias,
    choices, optional)."""

    file: str  # inside the package's parent: "sglang/srt/environ.py"
    top: str  # the package: "sglang"
    wheels: tuple[str, ...]  # distributions whose wheels hold it, preferred first for a download
    read: Any  # Callable[[EngineSource], dict]


# How every family's parser child ends (its loop's `try:` parses one argv into `out`): argparse's own
# message on a rejection, the exception's on anything else, the verdicts written to sys.argv[2].
PARSER_CHILD_END = r"""
    except SystemExit as exc:
        lines = [l for l in err.getvalue().strip().splitlines() if "error:" in l] or err.getvalue().strip().splitlines()
        text = lines[-1].split("error:", 1)[-1].strip() if lines else f"exit status {exc.code}"
        out.append({"ok": False, "message": text})
    except Exception as exc:
        out.append({"ok": False, "message": f"{type(exc).__name__}: {exc}"})
json.dump(out, open(sys.argv[2], "w"), default=str)
"""


class ParserSpec(NamedTuple):
    """How to run a family's own argument parser in a side environment (engine/sideenv.py)."""

    wheels: tuple[str, ...]  # distributions whose wheel holds the parser, preferred first
    deps: tuple[str, ...]  # what the parser imports besides the engine and torch (pip --no-deps)
    child: str  # Python run in the side environment: argv lists in sys.argv[1], verdicts to sys.argv[2]


class Family:
    """Defaults shared by every family; each module's class sets or overrides what differs."""

    name: str = ""
    kind: str = "worker"
    simulated: bool = False
    package: str | None = None  # the pip requirement's name in an engine venv ("sglang[all]")
    distribution: str | None = None  # the installed distribution (`importlib.metadata`) in that venv
    version_key: str | None = None  # the inventory datum that pins its version (e.g. sglang_version)
    tested_version: str | None = None  # the version this project runs in its tests (routers)
    endpoints: Endpoints = Endpoints("/health", "/health")
    metrics: Metrics | None = None
    bench_format: str | None = None
    uses_bootstrap: bool = False
    instance_ports: tuple[str, ...] = ()
    registry: RegistryReader | None = None
    parser: ParserSpec | None = None
    venv_default: bool = False  # production runs it from {prefix}/venv (else this interpreter)
    runs_kernels: bool = False  # this repo's kernels/ are installed into its venv (the SGLang fork's)
    # A text on the log lines of the process it runs ({pid}: the supervised PID), so that the gate reads
    # this start-up's lines only, not an earlier process's in the same log; None: it is not read.
    start_marker: str | None = None

    @property
    def reads_knobs_of(self) -> str:
        """The engine whose knobs reach it (the sim stands in for sglang and reads sglang's)."""
        return self.name

    def __repr__(self) -> str:
        return f"<engine family {self.name}>"

    # --- how it is started ---------------------------------------------------------------------

    def interpreter(self, data: Mapping[str, Any], prefix: str) -> str:
        """The Python it runs with: host data `python` ("{prefix}" expanded), else the engine venv
        under the prefix (engines with venv_default), else the controller's own interpreter."""
        chosen = data.get("python") or (VENV_PYTHON if self.venv_default else sys.executable)
        return str(chosen).replace("{prefix}", prefix)

    def command(self, svc: Any, data: Mapping[str, Any], workers: Workers) -> list[str]:
        raise NotImplementedError

    def managed_env(self, host: str, services: list[str], data: Mapping[str, Any], prefix: str) -> Any:
        """The environment the deploy's engine step builds and caches for it on the host
        (engine/vllm_install.EngineEnv), or None: it runs from the host's venv or interpreter."""
        return None

    def instance_environment(self, svc: Any, data: Mapping[str, Any]) -> dict[str, str]:
        """Variables one instance needs that differ per instance (not knobs: never role-wide)."""
        return {}

    def requirement(self, version: str) -> str | None:
        return f"{self.package}=={version}" if self.package else None

    # --- what check asks -----------------------------------------------------------------------

    def parser_argv(self, command: list[str]) -> list[str]:
        """The arguments of a rendered command that its parser takes."""
        raise UserError(f"{self.name}: no flag parser")

    def pairing_problems(self, label: str, parsed: list[Parsed], routers: Mapping[str, tuple["Family", list[str]]],
                         unparsed: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
        """(problems, warnings) of the PD invariants between this family's parsed workers."""
        return [], []

    # --- what the gate asks ----------------------------------------------------------------------

    def stuck_start(self, lines: list[str], svc: Any) -> str | None:
        """Words for a start-up that its own log lines (this process's, oldest first) say can never
        finish although the process lives on, or None: the gate then fails at once instead of at its
        timeout."""
        return None

    def deaths(self, lines: list[str]) -> list[str]:
        """One phrase per process of the engine that its own log lines (this process's, oldest
        first) say died, with how it died, e.g. "worker VllmWorker-0 died of SIGILL (illegal
        instruction)"; [] when the log says none did (or the family reads no log)."""
        return []


def model_name(data: Mapping[str, Any]) -> str:
    return str(data.get("served_model_name") or "knobkeeper-sim")


def engine_args(svc: Any, data: Mapping[str, Any]) -> list[str]:
    """`engine_args[role]`: appended last, so an inventory (or --data) can add or override flags."""
    extra = (data.get("engine_args") or {}).get(svc.role, [])
    if isinstance(extra, str) or not isinstance(extra, (list, tuple)):
        raise UserError(f"host {svc.host}: data engine_args[{svc.role!r}]: expected a list of arguments")
    return [str(a) for a in extra]


def flag_values(command: Iterable[str], flag: str) -> list[list[str]]:
    """The values after each occurrence of `flag` (up to the next --flag) in an argv."""
    command = list(command)
    out = []
    for i, arg in enumerate(command):
        if arg == flag:
            values = []
            for nxt in command[i + 1:]:
                if nxt.startswith("--"):
                    break
                values.append(nxt)
            out.append(values)
    return out
