"""`make demo`: deploy the local stack of this repo (inventory/local.py), send a chat completion
through the real router with the openai client, print `knobkeeper status`, say how to stop.
`make demo PROMETHEUS=1` (`--prometheus`) also starts a real Prometheus on 127.0.0.1:9090 scraping
every engine and the router (the scrape config `knobkeeper canary --print-scrape-config` renders),
queries it, and shows the canary command that reads it. `make stop` (`--stop`) stops the stack's
supervisord, its programs and that Prometheus.
"""

from __future__ import annotations

import argparse
import sys
import time

from knobkeeper.deploy.options import DEFAULT_INVENTORY as INVENTORY
from knobkeeper.errors import UserError


def _stack(project):
    from knobkeeper.deploy.stack import load_stack

    return load_stack(project.root, INVENTORY)


def stop(project) -> int:
    from knobkeeper.deploy.local import stop_local, stop_prometheus

    prefix = _stack(project).hosts["@local"].prefix
    pids = stop_local(prefix)
    print(f"stopped the local stack (pids {', '.join(map(str, pids))})" if pids else "the local stack is not running")
    prometheus = stop_prometheus(prefix)
    if prometheus:
        print(f"stopped its Prometheus (pid {prometheus})")
    return 0


def prometheus(project, stack) -> None:
    """Start (or reload) the Prometheus beside the local stack, wait until it has scraped every
    target, and print what it holds of the engines' token counters."""
    import json
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


def demo(project, with_prometheus: bool = False) -> int:
    from knobkeeper.deploy.api import run_deploy
    from knobkeeper.deploy.render import dirty_paths

    stack = _stack(project)
    router = next(s for s in stack.services if s.role == "router")
    dirty = bool(dirty_paths(project.root))
    if dirty:
        print("note: inventory/ or templates/ have uncommitted changes; deploying them (allow_dirty=true, recorded)")
    print(f"deploying {INVENTORY}: prefill, then decode, then router, each health-gated ...", flush=True)
    result = run_deploy(project, INVENTORY, allow_dirty=dirty, record=_has_git_identity(project))
    if not result.ok:
        print(result.output[-3000:], file=sys.stderr)
        print(f"deploy failed: {result.error}", file=sys.stderr)
        return 1
    for row in result.record.services:
        print(f"  {row.service:<20} {row.action:<10} gate {row.gate.result} ({row.gate.status})")
    print(f"deploy {result.record.id} ok in {result.seconds:.1f} s\n")

    from openai import OpenAI

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
    print("\nknobkeeper status:")
    from rich.console import Console

    from knobkeeper.deploy.status import stack_status, status_table

    Console().print(status_table(stack_status(project, INVENTORY)))
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
    parser.add_argument("--repo", default=None, help="the infra repo (default: the git root above the cwd)")
    args = parser.parse_args(argv)
    from knobkeeper.project import find_project

    try:
        project = find_project(args.repo)
        return stop(project) if args.stop else demo(project, args.prometheus)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
