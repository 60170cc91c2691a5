"""`ab run`: switch the stack between two arms, load it at every level, judge, always restore.

The arm switcher is a parameter, so the same orchestration drives the real deploy (the CLI
passes one that runs the deploy with knob_overrides: only the role restarts, gates included)
and tests (a switcher that restarts a sim process with the arm's environment).

Schedule: repeats are blocks of both arms in ABBA order (AB, BA, AB, ...), so a linear drift
(thermal, a neighbour, a cache filling) lands equally on both arms. Each block: switch to the
arm (a restart: restart-to-restart variation is part of what the repeats measure), one warm-up
load that is thrown away, then every level once, in ascending order. Whatever happens — a
failed switch, a failed load, Ctrl-C — `restore()` runs at the end, and a failure in restore is
reported above the original error, never swallowed.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from knobkeeper.errors import UserError

Switch = Callable[[dict], None]
LoadFn = Callable[..., dict]


def schedule(repeats: int) -> list[tuple[int, str]]:
    """[(repeat, arm)] in ABBA order: A B B A A B B A ... (each repeat has one block of each arm)."""
    order = []
    for r in range(1, repeats + 1):
        pair = ("A", "B") if r % 2 == 1 else ("B", "A")
        order += [(r, arm) for arm in pair]
    return order


def _run_fields(summary: dict) -> dict[str, Any]:
    keep = ("output_tokens_per_s", "requests_per_s", "ttft_ms", "itl_ms", "e2e_ms", "completed", "errors",
            "errors_by_kind", "warmup_errors", "window_s", "client_cpu_util")
    return {k: summary.get(k) for k in keep}


def run_ab(switch_arm: Switch, restore: Callable[[], None], endpoint: str, levels: list[int], repeats: int, *,
           arms: dict[str, dict], knob: str, role: str, requests: int | None = None,
           duration: float | None = None, api: str = "chat", input_len: int = 128, output_len: int = 64,
           warmup_requests: int | None = None, level_warmup: int | None = None, model: str | None = None,
           setup: dict | None = None, load_options: dict | None = None,
           load: LoadFn | None = None, progress: bool | Any = False) -> dict:
    """Run the A/B and return the judged evidence doc (not yet written).

    `warmup_requests`: the block's warm-up load (default: one request per stream at the top
    level); `level_warmup`: completions excluded at the start of each level (default: one per
    stream, see knobkeeper.loadgen); `load_options`: more keyword arguments for every load
    (e.g. keepalive=True for an endpoint without the router's keep-alive delay).
    `arms`: {"A": {"label":..., "knobs": {...}}, "B": {...}}; `switch_arm(arm_dict)` must leave the
    endpoint serving that arm. `load(endpoint, concurrency, **kw) -> summary` defaults to
    knobkeeper.loadgen.run_load. `progress`: True for a rich progress bar on stderr, or a
    rich Console to draw it on.
    """
    from knobkeeper.evidence.store import build_doc

    if repeats < 1:
        raise UserError(f"--repeats {repeats}: expected at least 1 (2 or more to judge)")
    if not levels or any(c < 1 for c in levels):
        raise UserError(f"--concurrency {levels}: expected positive integers, e.g. 64,80,96")
    if (requests is None) == (duration is None):
        raise UserError("give exactly one of --requests or --duration")
    if load is None:
        from knobkeeper.loadgen import run_load as load
    levels = sorted(set(levels))
    plan = schedule(repeats)
    runs: list[dict] = []
    bar = _progress(progress, len(plan) * len(levels))
    started = time.time()
    try:
        if bar is not None:
            bar.start()
            task = bar.add_task("A/B", total=len(plan) * len(levels))
        for repeat, arm in plan:
            if bar is not None:
                bar.update(task, description=f"switch to {arm} (repeat {repeat}/{repeats})")
            switch_arm(arms[arm])
            warm_conc = max(levels)
            load(endpoint, warm_conc, requests=warmup_requests or warm_conc, api=api, model=model,
                 input_len=input_len, output_len=output_len, warmup=0, **(load_options or {}))
            for conc in levels:
                if bar is not None:
                    bar.update(task, description=f"{arm} @{conc} (repeat {repeat}/{repeats})")
                summary = load(endpoint, conc, requests=requests, duration=duration, api=api, model=model,
                               input_len=input_len, output_len=output_len, warmup=level_warmup,
                               **(load_options or {}))
                if summary["output_tokens_per_s"] <= 0:
                    raise UserError(f"{endpoint}: arm {arm} @{conc} produced no output "
                                    f"({summary.get('errors')} errors: {summary.get('errors_by_kind')})")
                runs.append({"arm": arm, "repeat": repeat, "concurrency": conc, **_run_fields(summary)})
                if bar is not None:
                    bar.advance(task)
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
                  "schedule": {"order": "ABBA", "repeats": repeats, "levels": levels, "endpoint": endpoint,
                               "warmup_requests": warmup_requests or max(levels),
                               "wall_s": round(time.time() - started, 3)}}
    return build_doc(knob=knob, role=role, arms=arms, runs=runs, setup=full_setup,
                     source={"tool": "knobkeeper ab run", "format": None})


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


def engine_of(project, inventory: str, role: str) -> str:
    """The engine the role runs in this inventory (sim, sglang, ...), for the evidence's setup."""
    from knobkeeper.deploy.stack import load_stack

    engines = {s.engine for s in load_stack(project.root, inventory).services if s.role == role}
    return ", ".join(sorted(engines)) or "unknown"


def ab_run(project, *, inventory: str, role: str, set_spec: str, baseline: str = "current",
           levels: list[int], repeats: int, requests: int | None = None, duration: float | None = None,
           endpoint: str | None = None, api: str = "chat", input_len: int = 128, output_len: int = 64,
           no_commit: bool = False, progress: bool | Any = False,
           switcher: tuple[Switch, Callable[[], None], str | None] | None = None,
           load: LoadFn | None = None) -> dict:
    """`knobkeeper ab run`: A/B through the deploy, then write + commit the evidence; returns the doc.

    `switcher` replaces the deploy-backed one (tests, or a custom harness).
    """
    import json

    from knobkeeper.evidence.store import git_sha, write

    knob, arms = arms_from_specs(project, role, set_spec, baseline)
    switch_arm, restore, default_endpoint = switcher or deploy_switcher(project, inventory, role)
    endpoint = endpoint or default_endpoint
    if not endpoint:
        raise UserError("--endpoint: required (the inventory names no router endpoint)")
    engine = engine_of(project, inventory, role) if switcher is None else "custom switcher"
    setup = {"inventory": inventory, "git_sha": git_sha(project), "engine": engine}
    doc = run_ab(switch_arm, restore, endpoint, levels, repeats, arms=arms, knob=knob, role=role,
                 requests=requests, duration=duration, api=api, input_len=input_len, output_len=output_len,
                 setup=setup, load=load, progress=progress)
    path = write(project, doc, no_commit=no_commit)
    return json.loads(path.read_text())
