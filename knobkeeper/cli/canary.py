"""`knobkeeper canary`: a knob value on some of a role's hosts, judged against the rest on live traffic.

    knobkeeper canary KNOB=VALUE --role R ...   (= `canary run`) the canary itself
    knobkeeper canary abort                     put back what a canary that died left on its candidate
    knobkeeper canary scrape-config             the prometheus.yml that scrapes an inventory's workers

`--abort` and `--print-scrape-config` on the canary itself were the last two; they still work and
say which command replaced them.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import sys

import click

from knobkeeper.cli.common import KKGroup, emit_json, example, json_option, repo_option
from knobkeeper.deploy.options import DEFAULT_INVENTORY
from knobkeeper.errors import UserError
from knobkeeper.evidence import defaults
from knobkeeper.project import find_project
from knobkeeper.timeutil import duration_words, parse_duration


def _seconds(text: str, option: str) -> float:
    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise UserError(f"{option}: {exc}") from None


class CanaryGroup(KKGroup):
    """`canary KNOB=VALUE ...` is `canary run KNOB=VALUE ...`: a first word that is not one of the
    group's commands (a KNOB=VALUE, an option, nothing) goes to `run`, so the canary keeps its
    one-word form beside `canary abort` and `canary scrape-config`; `canary --help` is the group's."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or args[0] not in (*self.commands, "--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("canary", cls=CanaryGroup)
@example("knobkeeper canary SGLANG_SM120_MMA_TARGET_CTAS=512 --role decode --hosts 1 --duration 10m")
def canary_group() -> None:
    """A knob value on some of a role's hosts, judged against the rest on live traffic.

    `knobkeeper canary KNOB=VALUE --role R` runs one (`knobkeeper canary run --help`: its options);
    `canary abort` puts back what one that died left; `canary scrape-config` prints a Prometheus
    configuration for an inventory.
    """


def _deprecated(flag: str, command: str) -> None:
    click.echo(f"knobkeeper: canary {flag} is deprecated: use `knobkeeper canary {command}`", err=True)


@canary_group.command("run")
@click.argument("spec", metavar="KNOB=VALUE", required=False)
@click.option("--role", default=None, help="The role whose hosts are split into canary and baseline, e.g. decode (required).")
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
@click.option("--abort", "abort", is_flag=True, hidden=True, help="Deprecated: `knobkeeper canary abort`.")
@click.option("--print-scrape-config", is_flag=True, hidden=True, help="Deprecated: `knobkeeper canary scrape-config`.")
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
    if abort:
        _deprecated("--abort", "abort")
        return _abort(find_project(repo), as_json)
    if print_scrape_config:
        _deprecated("--print-scrape-config", "scrape-config")
        return _scrape_config(find_project(repo), inventory, scrape_interval)
    from knobkeeper.evidence import canary

    project = find_project(repo)
    if role is None:
        raise UserError("--role: missing (the role whose hosts are split, e.g. --role decode)")
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


@canary_group.command("abort")
@repo_option
@json_option
@example("knobkeeper canary abort")
def abort_cmd(repo, as_json) -> None:
    """Put back what a canary that died left on its candidate: a deploy of those services to the
    declared state (of the whole role when it died promoting), then its marker is cleared. Refused
    while that canary still runs."""
    _abort(find_project(repo), as_json)


@canary_group.command("scrape-config")
@click.option("--inventory", default=DEFAULT_INVENTORY, show_default=True, help="The inventory whose workers are scraped.")
@click.option("--scrape-interval", default=duration_words(defaults.SCRAPE_INTERVAL_S), show_default=True,
              help="The scrape interval the configuration asks for.")
@repo_option
@example("knobkeeper canary scrape-config --inventory inventory/prod.py > prometheus.yml")
def scrape_config_cmd(inventory, scrape_interval, repo) -> None:
    """Print the prometheus.yml that scrapes every engine worker and the router of an inventory, for
    `knobkeeper canary --source prometheus URL`."""
    _scrape_config(find_project(repo), inventory, scrape_interval)


def _abort(project, as_json: bool) -> None:
    from knobkeeper.deploy.canary_state import phase_words
    from knobkeeper.evidence import canary

    data, result = canary.abort(project)
    what = (f"the promote finished: role {data.role} deployed" if data.phase == "promote"
            else "put back to the declared state")
    done = f"canary {data.knob}={canary._raw(data.value)} on {', '.join(data.services)} " \
           f"(abandoned {phase_words(data)}): {what} (deploy {result.deploy_id})"
    emit_json({"aborted": data.to_json(), "deploy": result.deploy_id}) if as_json else click.echo(done)


def _scrape_config(project, inventory: str, scrape_interval: str) -> None:
    from knobkeeper.deploy.stack import load_stack
    from knobkeeper.evidence.metrics import scrape_config

    click.echo(scrape_config(load_stack(project.root, inventory), _seconds(scrape_interval, "--scrape-interval")),
               nl=False)


COMMANDS = [canary_group]
