"""`make demo`: deploy the local stack of this repo (inventory/local.py), send a chat completion
through the real router with the openai client, print `knobkeeper status`, say how to stop.
`make demo ENGINE=vllm` (`--engine vllm`): the same with the REAL stack (inventory/local_vllm.py:
vLLM's CPU build as prefill and decode, vllm-router in front, the tiny model as a stand-in for your
model, the CPU for your GPU), a streamed chat completion through the router, and the PD proof (the
prompt's KV came over the connector). `make stop` stops whichever local stack runs.
`make demo PROMETHEUS=1` (`--prometheus`) also starts a real Prometheus on 127.0.0.1:9090 scraping
every engine and the router (the scrape config `knobkeeper canary scrape-config` renders),
queries it, and shows the canary command that reads it. `make stop` (`--stop`) stops the stack's
supervisord, its programs and that Prometheus.

Imports inside functions: each path loads what it drives, so `make stop` loads the local
deploy's helpers only: `import knobkeeper.demo` takes 0.04 s against 1.5 s with them all at the
top (openai's client is most of it; 5 runs each, 2026-12-06).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from knobkeeper.deploy.options import DEFAULT_INVENTORY as INVENTORY
from knobkeeper.errors import UserError
from knobkeeper.project import find_project

# The local stacks `make demo` deploys, by ENGINE: the sim (fast, the SGLang path) and the real vLLM.
INVENTORIES = {"sim": INVENTORY, "vllm": "inventory/local_vllm.py"}


def _stack(project, inventory: str = INVENTORY):
    from knobkeeper.deploy.stack import load_stack

    return load_stack(project.root, inventory)


def stop(project) -> int:
    """Stop every local stack of this repo that runs (each one's supervisord, its programs, its Prometheus)."""
    from knobkeeper.deploy.local import stop_local, stop_prometheus

    for engine, inventory in INVENTORIES.items():
        if not (project.root / inventory).is_file():
            continue
        prefix = _stack(project, inventory).hosts["@local"].prefix
        pids = stop_local(prefix, timeout=60)
        if pids:
            print(f"stopped the local {engine} stack, {inventory} (pids {', '.join(map(str, pids))})")
        else:
            print(f"the local {engine} stack ({inventory}) is not running")
        prometheus = stop_prometheus(prefix)
        if prometheus:
            print(f"stopped its Prometheus (pid {prometheus})")
    return 0


def prometheus(project, stack) -> None:
    """Start (or reload) the Prometheus beside the local stack, wait until it has scraped every
    target, and print what it holds of the engines' token counters."""
    import urllib.request

    from knobkeeper.deploy.local import start_prometheus
    from knobkeeper.evidence.metrics import LABEL, PrometheusSource, scrape_config, targets_of

    pid, url = start_prometheus(stack.hosts["@local"].prefix, scrape_config(stack, 1.0))
    targets = targets_of(stack)
    deadline = time.monotonic() + 60
    up: list = []
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/api/v1/targets", timeout=5) as resp:
            up = [t for t in json.loads(resp.read())["data"]["activeTargets"] if t["health"] == "up"]
        if len(up) >= len(targets) + 1:   # every engine and the router's metrics port
            break
        time.sleep(0.5)
    print(f"\nPrometheus {url} (pid {pid}) scrapes {len(up)} targets; its PromQL, per engine:")
    for tokens in dict.fromkeys(t.metrics.tokens for t in targets):  # the engine family's counter name
        for row in sorted(PrometheusSource(url, targets).query(f"sum by ({LABEL}) ({tokens})"),
                          key=lambda r: r["metric"].get(LABEL, "")):
            print(f"  {tokens}{{{LABEL}=\"{row['metric'].get(LABEL)}\"}} = {float(row['value'][1]):g}")
    print(f"a canary that reads it: knobkeeper canary KNOB=VALUE --role decode --source prometheus {url}")


def demo(project, with_prometheus: bool = False, engine: str = "sim") -> int:
    from knobkeeper.deploy.api import run_deploy
    from knobkeeper.deploy.render import dirty_paths

    inventory = INVENTORIES[engine]
    stack = _stack(project, inventory)
    router = next(s for s in stack.services if s.role == "router")
    dirty = bool(dirty_paths(project.root))
    if dirty:
        print("note: inventory/ or templates/ have uncommitted changes; deploying them (allow_dirty=true, recorded)")
    if engine == "vllm":
        print("the real stack: vLLM's CPU build stands in for your GPU, the tiny model (built here, seeded, "
              "no hub) for your model; first run: the engine install takes a few minutes, then seconds")
    print(f"deploying {inventory}: prefill, then decode, then router, each health-gated ...", flush=True)
    result = run_deploy(project, inventory, allow_dirty=dirty, record=_has_git_identity(project),
                        echo=engine == "vllm")
    if not result.ok:
        print(result.output[-3000:], file=sys.stderr)
        print(f"deploy failed: {result.error}", file=sys.stderr)
        return 1
    for row in result.record.services:
        print(f"  {row.service:<20} {row.action:<10} gate {row.gate.result} ({row.gate.status})")
    print(f"deploy {result.record.id} ok in {result.seconds:.1f} s\n")
    if result.record.pd_proof:
        print(result.record.pd_proof + "\n")

    from openai import OpenAI

    if engine == "vllm":
        _streamed_chat(stack, router)
        return _closing(project, stack, inventory, with_prometheus)

    client = OpenAI(base_url=f"{router.url}/v1", api_key="not-needed", max_retries=3, timeout=60)
    model = str(stack.hosts[router.host].data.get("served_model_name") or "knobkeeper-sim")
    started = time.monotonic()
    reply = client.chat.completions.create(
        model=model, max_tokens=24,
        messages=[{"role": "user", "content": "Say hello from the disaggregated stack."}],
    )
    took = time.monotonic() - started
    print(f"chat completion through the router ({router.url}, model {model}, {took * 1000:.0f} ms):")
    print(f"  {reply.choices[0].message.content!r}")
    if reply.usage:
        print(f"  tokens: prompt {reply.usage.prompt_tokens}, completion {reply.usage.completion_tokens}")
    return _closing(project, stack, inventory, with_prometheus)


def _streamed_chat(stack, router) -> None:
    """A streamed chat completion through the router with the openai client: what came, how fast."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{router.url}/v1", api_key="not-needed", max_retries=3, timeout=120)
    model = str(stack.hosts[router.host].data.get("served_model_name"))
    started = time.monotonic()
    first, chunks, text, usage = None, 0, [], None
    stream = client.chat.completions.create(
        model=model, max_tokens=24, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Say hello from the disaggregated stack."}])
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                first = first or time.monotonic()
                chunks += 1
                text.append(choice.delta.content)
    took = time.monotonic() - started
    ttft = f"{(first - started) * 1000:.0f} ms" if first else "no content"
    print(f"streamed chat completion through vllm-router ({router.url}, model {model} = the tiny model, a "
          f"stand-in for yours: random weights, so the words are noise):")
    print(f"  {''.join(text)!r}")
    print(f"  {chunks} content chunks, first after {ttft}, {took * 1000:.0f} ms in all"
          + (f"; tokens: prompt {usage.prompt_tokens}, completion {usage.completion_tokens}" if usage else ""))


def _closing(project, stack, inventory: str, with_prometheus: bool) -> int:
    print("\nknobkeeper status:")
    from rich.console import Console

    from knobkeeper.deploy.status import stack_status, status_table

    Console().print(status_table(stack_status(project, inventory)))
    if with_prometheus:
        prometheus(project, stack)
    from knobkeeper.report import write_report

    written = write_report(project)
    print(f"\nreport of this repository: {written.path}  (open it in a browser, or: knobkeeper report --open)")
    print("\nstop the stack with: make stop")
    return 0


def _has_git_identity(project) -> bool:
    from knobkeeper import gitio

    if gitio.config(project.root, "user.name") and gitio.config(project.root, "user.email"):
        return True
    print("note: git user.name/user.email are not set: the deploy record is kept in .knobkeeper-state/deploys/")
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m knobkeeper.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--stop", action="store_true", help="stop the local stack (and its Prometheus)")
    parser.add_argument("--prometheus", action="store_true",
                        help="also start a real Prometheus on 127.0.0.1:9090 scraping the stack")
    parser.add_argument("--engine", choices=sorted(INVENTORIES), default="sim",
                        help="sim: the simulated engine (inventory/local.py); vllm: the real vLLM CPU stack")
    parser.add_argument("--repo", default=None, help="the infra repo (default: the git root above the cwd)")
    args = parser.parse_args(argv)

    try:
        project = find_project(args.repo)
        return stop(project) if args.stop else demo(project, args.prometheus, args.engine)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
