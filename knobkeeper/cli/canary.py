"""`knobkeeper canary`: a knob value on some of a role's hosts, judged against the rest on live traffic."""

from __future__ import annotations

import sys

import click

from knobkeeper.cli.common import emit_json, example, json_option, repo_option
from knobkeeper.deploy.options import DEFAULT_INVENTORY
from knobkeeper.errors import UserError
from knobkeeper.evidence import defaults
from knobkeeper.project import find_project
from knobkeeper.timeutil import duration_words


def _seconds(text: str, option: str) -> float:
    from knobkeeper.timeutil import parse_duration

    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


@click.command("canary")
@click.argument("spec", metavar="KNOB=VALUE", required=False)
@click.option("--role", default=None, help="(required but with --abort) The role whose hosts are split into canary and baseline, e.g. decode.")
@click.option("--inventory", default=DEFAULT_INVENTORY, show_default=True, help="The inventory to deploy.")
@click.option("--hosts", "hosts", type=int, default=None, help="How many of the role's workers get the candidate (default 1).")
@click.option("--host", "host_names", multiple=True, metavar="HOST", help="A canary host by name (repeatable).")
@click.option("--duration", default=duration_words(defaults.CANARY_DURATION_S), show_default=True, help="How long to compare (30s, 10m, 1h).")
@click.option("--interval", default=duration_words(defaults.CANARY_INTERVAL_S), show_default=True,
              help="Window length: one sample per host per window.")
@click.option("--calibrate", default=None, metavar="DURATION",
              help="Windows before the deploy, every host at the declared value: they measure the hosts' "
                   "lasting differences (default: as long as --duration; 0: none, hosts assumed alike).")
@click.option("--restart-noise", type=float, default=defaults.RESTART_NOISE, show_default=True,
              help=f"Log-sd of a restart's own speed offset, which no window averages out "
                   f"({defaults.RESTART_NOISE:g}: {defaults.RESTART_NOISE:.0%}).")
@click.option("--alpha", type=float, default=defaults.ALPHA, show_default=True,
              help="Family-wise error rate of the judgement: how sure before it promotes or rolls back.")
@click.option("--source", "source", nargs=2, default=None, metavar="prometheus URL",
              help="Read the metrics from a Prometheus scraping the workers (default: --scrape).")
@click.option("--scrape", is_flag=True, help="knobkeeper scrapes every worker's /metrics itself (the default).")
@click.option("--scrape-interval", default=duration_words(defaults.SCRAPE_INTERVAL_S), show_default=True,
              help="How often the scrape path samples.")
@click.option("--promote", is_flag=True, help="On 'better': `set` the value with the evidence and deploy the whole role.")
@click.option("--reason", default=None, help="The reason of the entry --promote writes.")
@click.option("--abort", "abort", is_flag=True,
              help="Put back what a canary that died left on its candidate (a deploy of those services to the "
                   "declared state), and clear its marker.")
@click.option("--print-scrape-config", is_flag=True,
              help="Print the prometheus.yml that scrapes this inventory's workers and router, and exit.")
@repo_option
@json_option
@example("knobkeeper canary SGLANG_SM120_MMA_TARGET_CTAS=512 --role decode --hosts 1 --duration 10m "
         "--interval 30s --promote")
def canary_cmd(spec, role, inventory, hosts, host_names, duration, interval, calibrate, restart_noise, alpha, source,
               scrape, scrape_interval, promote, reason, abort, print_scrape_config, repo, as_json):
    """Put KNOB=VALUE on some of a role's hosts, compare them with the rest over the same windows.

    The router spreads live traffic. Per window the canary hosts' throughput (tokens/s at the
    window's mean load) is taken relative to the baseline hosts' in that same window, first for
    --calibrate with every host at the declared value, then for --duration with the candidate on
    the canary hosts; the change between the two is judged family-wise with TTFT and TPOT as guards
    and an errors test. Worse, a failed guard, or a canary worker that died on the candidate (the
    windows stop there): the evidence is committed, then the canary hosts are rolled back, exit 1.
    Better with --promote: a `set` with the evidence, then the whole role is deployed.
    Otherwise the canary hosts are put back, and it says how long a canary would decide. Ctrl-C or
    SIGTERM puts them back too. The evidence is written either way (changelog/evidence/, source
    "knobkeeper canary").
    """
    from knobkeeper.evidence import canary

    project = find_project(repo)
    if abort:
        data, result = canary.abort(project)
        from knobkeeper.deploy.canary_state import phase_words

        what = (f"the promote finished: role {data.get('role')} deployed" if data.get("phase") == "promote"
                else "put back to the declared state")
        done = f"canary {data['knob']}={canary._raw(data['value'])} on {', '.join(data.get('services') or [])} " \
               f"(abandoned {phase_words(data)}): {what} (deploy {result.deploy_id})"
        emit_json({"aborted": data, "deploy": result.deploy_id}) if as_json else click.echo(done)
        return
    if role is None:
        raise UserError("--role: missing (the role whose hosts are split, e.g. --role decode)")
    if print_scrape_config:
        from knobkeeper.deploy.stack import load_stack
        from knobkeeper.evidence.metrics import scrape_config

        click.echo(scrape_config(load_stack(project.root, inventory), _seconds(scrape_interval, "--scrape-interval")),
                   nl=False)
        return
    if spec is None:
        raise UserError("KNOB=VALUE: missing (e.g. SGLANG_SM120_MMA_TARGET_CTAS=512)")
    prometheus = None
    if source is not None:
        kind, prometheus = source
        if kind != "prometheus":
            raise UserError(f"--source {kind}: expected `--source prometheus URL`")
        if scrape:
            raise UserError("--source prometheus and --scrape: give one")
    if hosts is not None and host_names:
        raise UserError("--hosts and --host: give one")

    def progress(k: int, n: int) -> None:
        if not as_json:
            click.echo(f"  window {k}/{n}", err=True)

    options = canary.Options(duration=_seconds(duration, "--duration"), interval=_seconds(interval, "--interval"),
                             calibrate=None if calibrate is None else 0.0 if calibrate.strip() == "0"
                             else _seconds(calibrate, "--calibrate"),
                             restart_noise=restart_noise, alpha=alpha, promote=promote, reason=reason,
                             scrape_interval=_seconds(scrape_interval, "--scrape-interval"), on_window=progress)
    try:
        out = canary.canary(project, spec, role=role, inventory=inventory, hosts=hosts,
                            host_names=list(host_names) or None, prometheus=prometheus, options=options)
    except canary.Interrupted as stopped:   # one line saying what was put back, not click's "Aborted!"
        click.echo(stopped.line, err=True)
        sys.exit(130)
    if as_json:
        emit_json({"verdict": out.verdict, "action": out.action, "evidence": out.doc.id, "entry": out.entry})
    else:
        for line in canary.report_lines(out):
            click.echo(line)
    if out.exit_code:
        sys.exit(out.exit_code)


COMMANDS = [canary_cmd]
