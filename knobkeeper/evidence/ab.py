"""`ab run`: switch the stack between two arms, load it at every level, judge, always restore.

The arm switcher is a parameter, so the same orchestration drives the real deploy (the CLI
passes one that runs the deploy with knob_overrides: only the role restarts, gates included)
and tests (a switcher that restarts a sim process with the arm's environment).

Schedule: repeats are blocks of both arms in ABBA order (AB, BA, AB, ...), so a linear drift
(thermal, a neighbour, a cache filling) lands equally on both arms. Each block: switch to the
arm (a restart: restart-to-restart variation is part of what the repeats measure), check that
the running engine carries the arm's knob value (`Probes.knob`), one warm-up load that is thrown
away, then every open level once, in ascending order (around each level, the prefill's
prompt-token counter when the stack is disaggregated: `Probes.prefill_tokens`). Whatever
happens — a failed switch, a failed load, Ctrl-C — `restore()` runs at the end, and a failure in
restore is reported above the original error, never swallowed.

Stopping: with `max_repeats` the design is sequential (knobkeeper.evidence.judge: looks after
3, 5, 7, 10, 14, ... repeats, alpha spending, weighted Holm over the family): after each planned
look the settled levels (better/worse, no detectable change, or invalid) are no longer loaded,
and the run ends when every level is settled or at the cap. The rule and every look are
recorded in the evidence's `sequential`, so `verify` can recompute the p-values. With
`repeats` the design is fixed (one look at the end).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from knobkeeper.errors import UserError
from knobkeeper.evidence import judge as J
from knobkeeper.evidence import validity as V

Switch = Callable[[dict], None]
LoadFn = Callable[..., dict]


@dataclass
class Probes:
    """What `ab run` reads from the stack besides the load: `knob(arm) -> knob_seen` after each
    switch (status, running value, detail), `prefill_tokens() -> counter | None` (None: the stack
    is not disaggregated). Either may be None (not checked: the runs say "unverified")."""

    knob: Callable[[dict], dict] | None = None
    prefill_tokens: Callable[[], float | None] | None = None


def schedule(repeats: int) -> list[tuple[int, str]]:
    """[(repeat, arm)] in ABBA order: A B B A A B B A ... (each repeat has one block of each arm)."""
    order = []
    for r in range(1, repeats + 1):
        pair = ("A", "B") if r % 2 == 1 else ("B", "A")
        order += [(r, arm) for arm in pair]
    return order


def _run_fields(summary: dict) -> dict[str, Any]:
    keep = ("output_tokens_per_s", "requests_per_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "completed",
            "errors", "errors_by_kind", "warmup_errors", "window_s", "client_cpu_util")
    out = {k: summary.get(k) for k in keep}
    out["errors"] = int(out.get("errors") or 0)
    if summary.get("requests_target") is not None:
        out["requested"] = summary["requests_target"]
    return out


def knob_seen(arm: dict, knob: str, running: dict | None, source: str) -> dict:
    """knob_seen of a run of `arm` (see validity.knob_seen): `running` is the engine's environment."""
    return V.knob_seen(arm["knobs"].get(knob), knob, running, source)


class Stopping:
    """The sequential design's bookkeeping: which levels are still open, the looks taken."""

    def __init__(self, levels: list[int], max_repeats: int, metric: str = J.METRIC):
        self.levels, self.metric = list(levels), metric
        self.record = J.sequential_rule(max_repeats)
        self.open = list(levels)

    def after_repeat(self, repeat: int, runs: list[dict]) -> None:
        """Take the planned look after `repeat` complete repeats (if one is planned there)."""
        if repeat not in self.record["planned_looks"] or not self.open:
            return
        self.record["looks"].append({"repeat": repeat, "open": list(self.open), "settled": {}})
        _, invalid = V.assess(runs, self.metric)
        judgement = J.judge(runs, self.metric, invalid=invalid, sequential=self.record)
        for level in judgement["levels"]:
            if level["concurrency"] in self.open and J.settled(level):
                self.record["looks"][-1]["settled"][str(level["concurrency"])] = level["verdict"]
                self.open.remove(level["concurrency"])


def run_ab(switch_arm: Switch, restore: Callable[[], None], endpoint: str, levels: list[int],
           repeats: int | None = None, *, arms: dict[str, dict], knob: str, role: str,
           max_repeats: int | None = None, requests: int | None = None,
           duration: float | None = None, api: str = "chat", input_len: int = 128, output_len: int = 64,
           warmup_requests: int | None = None, level_warmup: int | None = None, model: str | None = None,
           setup: dict | None = None, load_options: dict | None = None, probes: Probes | None = None,
           keep_invalid: bool = False, load: LoadFn | None = None, progress: bool | Any = False) -> dict:
    """Run the A/B and return the judged evidence doc (not yet written).

    `repeats`: a fixed design of that many blocks per arm; `max_repeats`: the sequential design
    capped there (give one). `warmup_requests`: the block's warm-up load (default: one request
    per stream at the top open level); `level_warmup`: completions excluded at the start of each
    level (default: one per stream, see knobkeeper.loadgen); `load_options`: more keyword
    arguments for every load (e.g. keepalive=True for an endpoint without the router's
    keep-alive delay). `arms`: {"A": {"label":..., "knobs": {...}}, "B": {...}};
    `switch_arm(arm_dict)` must leave the endpoint serving that arm. `probes`: the validity
    checks read from the stack (see Probes). `load(endpoint, concurrency, **kw) -> summary`
    defaults to knobkeeper.loadgen.run_load. `progress`: True for a rich progress bar on
    stderr, or a rich Console to draw it on.
    """
    from knobkeeper.evidence.store import build_doc

    if (repeats is None) == (max_repeats is None):
        raise UserError("give one of --repeats (fixed design) or --max-repeats (sequential design)")
    cap = repeats if max_repeats is None else max_repeats
    if cap < 1:
        raise UserError(f"--{'repeats' if max_repeats is None else 'max-repeats'} {cap}: expected at least 1 "
                        f"(2 or more to judge)")
    if not levels or any(c < 1 for c in levels):
        raise UserError(f"--concurrency {levels}: expected positive integers, e.g. 64,80,96")
    if (requests is None) == (duration is None):
        raise UserError("give exactly one of --requests or --duration")
    if load is None:
        from knobkeeper.loadgen import run_load as load
    probes = probes or Probes()
    levels = sorted(set(levels))
    stopping = Stopping(levels, cap) if max_repeats is not None else None
    plan = schedule(cap)
    runs: list[dict] = []
    bar = _progress(progress, len(plan) * len(levels))
    started = time.time()
    blocks = 0
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("A/B", total=len(plan) * len(levels))
        for index, (repeat, arm) in enumerate(plan):
            todo = stopping.open if stopping is not None else levels
            if not todo:
                break
            if bar is not None:
                bar.update(task, description=f"switch to {arm} (repeat {repeat}/{cap})")
            switch_arm(arms[arm])
            blocks += 1
            seen = probes.knob(arms[arm]) if probes.knob is not None else None
            warm_conc = max(todo)
            load(endpoint, warm_conc, requests=warmup_requests or warm_conc, api=api, model=model,
                 input_len=input_len, output_len=output_len, warmup=0, **(load_options or {}))
            for conc in list(todo):
                if bar is not None:
                    bar.update(task, description=f"{arm} @{conc} (repeat {repeat}/{cap})")
                before = probes.prefill_tokens() if probes.prefill_tokens is not None else None
                summary = load(endpoint, conc, requests=requests, duration=duration, api=api, model=model,
                               input_len=input_len, output_len=output_len, warmup=level_warmup,
                               **(load_options or {}))
                run = {"arm": arm, "repeat": repeat, "concurrency": conc, **_run_fields(summary)}
                if seen is not None:
                    run["knob_seen"] = seen
                if before is not None:
                    after = probes.prefill_tokens()
                    if after is not None:
                        run["prefill_prompt_tokens"] = after - before
                runs.append(run)
                if bar is not None:
                    bar.advance(task)
            if stopping is not None and index % 2 == 1:
                stopping.after_repeat(repeat, runs)
    finally:
        try:
            if bar is not None:
                bar.update(task, description="restoring the declared state")
            restore()
        finally:
            if bar is not None:
                bar.stop()
    workload = {"api": api, "input_len": input_len, "output_len": output_len, "requests_per_run": requests,
                "duration_s": duration}
    full_setup = {**(setup or {}), "workload": workload,
                  "schedule": {"order": "ABBA", "repeats": cap, "levels": levels, "endpoint": endpoint,
                               "design": "sequential" if stopping is not None else "fixed", "blocks": blocks,
                               "warmup_requests": warmup_requests or max(levels),
                               "wall_s": round(time.time() - started, 3)}}
    return build_doc(knob=knob, role=role, arms=arms, runs=runs, setup=full_setup,
                     source={"tool": "knobkeeper ab run", "format": None},
                     sequential=stopping.record if stopping is not None else None, keep_invalid=keep_invalid)


def _progress(progress: bool | Any, total: int):
    if not progress:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = progress if isinstance(progress, Console) else Console(stderr=True)
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


# ---------------------------------------------------------------- `knobkeeper ab run` (project level)

def arms_from_specs(project, role: str, set_spec: str, baseline: str = "current") -> tuple[str, dict[str, dict]]:
    """(knob, arms) from `--set KNOB=VALUE` and `--baseline current|KNOB=VALUE`.

    `current` is the declared value in inventory/knobs.toml (None when unset).
    """
    from knobkeeper.evidence.store import parse_knob_spec
    from knobkeeper.knobs.state import read_declared, value_of

    knob, value = parse_knob_spec(project, set_spec, role, "--set")
    if baseline == "current":
        base = value_of(read_declared(project.knobs_path), role, knob) if project.knobs_path.exists() else None
        label = "baseline (declared)"
    else:
        name, base = parse_knob_spec(project, baseline, role, "--baseline")
        if name != knob:
            raise UserError(f"--baseline {baseline!r}: must set the same knob as --set ({knob})")
        label = "baseline"
    if base == value:
        raise UserError(f"--set {set_spec!r}: the baseline already has {knob}={value}; nothing to compare "
                        f"(for an A/A check pass --baseline {knob}=<other value> or use the library)")
    return knob, {"A": {"label": label, "knobs": {knob: base}}, "B": {"label": "candidate", "knobs": {knob: value}}}


def deploy_switcher(project, inventory: str, role: str) -> tuple[Switch, Callable[[], None], str | None]:
    """(switch_arm, restore, router endpoint) backed by the real deploy.

    switch_arm(arm) deploys `inventory` with knob_overrides={role: arm knobs} and only=role, so only
    that role restarts and every gate (the router's included) holds before load starts; restore()
    deploys the declared state. Arm switches are not committed as deploy records (record=false:
    they land in .knobkeeper-state/deploys/); the evidence file lists the schedule instead.
    """
    from knobkeeper.deploy.api import run_deploy
    from knobkeeper.deploy.stack import load_stack

    def deploy(overrides: dict | None) -> None:
        result = run_deploy(project, inventory, only=role, knob_overrides=overrides, record=False)
        if not result.ok:
            raise UserError(f"ab run: deploy of {inventory} failed: {result.error}")

    def switch_arm(arm: dict) -> None:
        deploy({role: dict(arm["knobs"])})

    def restore() -> None:
        deploy(None)

    stack = load_stack(project.root, inventory)
    router = next((s for s in stack.services if s.role == "router"), None)
    return switch_arm, restore, router.url if router else None


def engine_of(project, inventory: str, role: str) -> dict:
    """The evidence's setup.engine / engine_version (and stack) of the role in this inventory, as its
    pin says (knobkeeper.engine.role_engine, through the stack)."""
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.engine.pins import evidence_setup

    return evidence_setup(load_stack(project.root, inventory), role)


def deploy_probes(project, inventory: str, role: str, knob: str) -> Probes:
    """Probes backed by the stack: the knob as each of the role's services was started with it
    (the started.sh record `status` reads), and the prefill services' prompt-token counter (the
    family's name: sglang:prompt_tokens_total, vllm:prompt_tokens_total) summed over their /metrics
    when the stack has a prefill role."""
    from knobkeeper.deploy.observe import host_shell
    from knobkeeper.deploy.stack import load_inventory, stack_from_inventory
    from knobkeeper.deploy.status import observe

    inv = load_inventory(project.root, inventory)
    stack = stack_from_inventory(inv, inventory.rsplit("/", 1)[-1].rsplit(".", 1)[0])
    services = [s for s in stack.services if s.role == role]
    prefills = [s for s in stack.services if s.role == "prefill"] if role != "prefill" else []

    def knob_probe(arm: dict) -> dict:
        worst = None
        with host_shell(inv) as shell:
            for svc in services:
                seen = observe(shell, stack.hosts[svc.host], svc)
                started = (seen or {}).get("started") if seen and seen.get("running") else None
                running = started.get("knobs") if isinstance(started, dict) else None
                result = knob_seen(arm, knob, running, f"{svc.host}/{svc.name} started.sh")
                if worst is None or result["status"] == V.NOT_CARRIED or (
                        result["status"] == V.UNVERIFIED and worst["status"] == V.CARRIED):
                    worst = result
        return worst or knob_seen(arm, knob, None, f"no {role} service in {inventory}")

    def prefill_tokens() -> float | None:
        total = 0.0
        for svc in prefills:
            value = prompt_tokens_total(svc.url, svc.family.metrics.prompt_tokens)
            if value is None:
                return None
            total += value
        return total

    return Probes(knob=knob_probe, prefill_tokens=prefill_tokens if prefills else None)


def prompt_tokens_total(base_url: str, name: str = "sglang:prompt_tokens_total", timeout: float = 5.0) -> float | None:
    """The sum of the engine's prompt-token counter `name` on `base_url`/metrics (None when unreadable)."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    total, found = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(None, 1)[-1])
                found = True
            except ValueError:
                continue
    return total if found else None


def server_info_knobs(base_url: str, timeout: float = 5.0) -> dict | None:
    """The knobs an engine reports in /get_server_info (the sim's `knobs`), or None."""
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/get_server_info", timeout=timeout) as resp:
            info = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    knobs = info.get("knobs") if isinstance(info, dict) else None
    return knobs if isinstance(knobs, dict) else None


def ab_run(project, *, inventory: str, role: str, set_spec: str, baseline: str = "current",
           levels: list[int], repeats: int | None = None, max_repeats: int | None = None,
           requests: int | None = None, duration: float | None = None,
           endpoint: str | None = None, api: str = "chat", input_len: int = 128, output_len: int = 64,
           no_commit: bool = False, keep_invalid: bool = False, progress: bool | Any = False,
           switcher: tuple[Switch, Callable[[], None], str | None] | None = None,
           probes: Probes | None = None, load: LoadFn | None = None) -> dict:
    """`knobkeeper ab run`: A/B through the deploy, then write + commit the evidence; returns the doc.

    Neither `repeats` nor `max_repeats`: the sequential design with the fixed design's power at
    3% noise (judge.sequential_repeats). `switcher` replaces the deploy-backed one (tests, or a
    custom harness); `probes` then default to none (the runs say "unverified").
    """
    from knobkeeper.evidence.store import git_sha, write

    knob, arms = arms_from_specs(project, role, set_spec, baseline)
    if repeats is None and max_repeats is None:
        max_repeats = J.sequential_repeats(levels=len(set(levels)), guards=True)
    switch_arm, restore, default_endpoint = switcher or deploy_switcher(project, inventory, role)
    if probes is None and switcher is None:
        probes = deploy_probes(project, inventory, role, knob)
    endpoint = endpoint or default_endpoint
    if not endpoint:
        raise UserError("--endpoint: required (the inventory names no router endpoint)")
    engine = engine_of(project, inventory, role) if switcher is None else {"engine": "custom switcher"}
    setup = {"inventory": inventory, "git_sha": git_sha(project), **engine}
    from knobkeeper.deploy.api import terminate_as_interrupt

    with terminate_as_interrupt():  # a CI job's SIGTERM restores the declared state, as Ctrl-C does
        doc = run_ab(switch_arm, restore, endpoint, levels, repeats, max_repeats=max_repeats, arms=arms, knob=knob,
                     role=role, requests=requests, duration=duration, api=api, input_len=input_len,
                     output_len=output_len, setup=setup, load=load, probes=probes, keep_invalid=keep_invalid,
                     progress=progress)
    path = write(project, doc, no_commit=no_commit)
    return json.loads(path.read_text())
