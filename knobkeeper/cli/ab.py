"""`knobkeeper ab`: A/B evidence — run (through the deploy), import (benchmark tools), show, list."""

from __future__ import annotations

import click

from knobkeeper.cli.common import KKGroup, console, emit_json, example, json_option, repo_option
from knobkeeper.errors import UserError
from knobkeeper.project import find_project

ab = KKGroup("ab", help="A/B evidence: run an A/B, import benchmark results, show a judgement.")


class _MultiValueCommand(click.Command):
    """Lets `--baseline a.json b.json --candidate c.json` take several values per option
    (click needs `--baseline a.json --baseline b.json`; both spellings work)."""

    greedy = ("--baseline", "--candidate")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        current = None
        for arg in args:
            if arg in self.greedy:
                current = arg
                out.append(arg)
                continue
            if arg.startswith("-"):
                current = None
                out.append(arg)
                continue
            if current is not None and out and out[-1] != current:
                out.append(current)
            out.append(arg)
        return super().parse_args(ctx, out)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--concurrency {text!r}: expected comma-separated integers, e.g. 64,80,96") from None
    if not levels or any(c < 1 for c in levels):
        raise UserError(f"--concurrency {text!r}: expected positive integers, e.g. 64,80,96")
    return levels


def _print_doc(doc: dict, *, header: bool = True) -> None:
    from rich.table import Table

    from knobkeeper.evidence import judge as J
    from knobkeeper.evidence.store import summary_line

    con = console()
    if header:
        a = doc["arms"]["A"]["knobs"].get(doc["knob"])
        b = doc["arms"]["B"]["knobs"].get(doc["knob"])
        con.print(f"evidence {doc['id']}  {doc['knob']} on {doc['role']}: "
                  f"A={'(unset)' if a is None else a}  B={'(unset)' if b is None else b}  "
                  f"[{doc['source'].get('tool')}, {doc['created'][:19]}Z]")
    table = Table(title=f"{doc['metric']} per level (B vs A)")
    for col in ("conc", "mean A", "mean B", "effect", "95% CI", "p", "verdict", "n A/B"):
        table.add_column(col, justify="right" if col not in ("verdict",) else "left")
    for lv in doc["judgement"]["levels"]:
        ci = (f"{J.fmt_pct(lv['ci_low'])}..{J.fmt_pct(lv['ci_high'])}" if lv.get("ci_low") is not None else "n/a")
        verdict = lv["verdict"]
        if lv.get("repeats_needed"):
            verdict += f" (needs {lv['repeats_needed']} runs/arm)"
        if lv.get("outliers_dropped"):
            verdict += f" [{len(lv['outliers_dropped'])} dropped]"
        p = lv.get("p_value")
        table.add_row(str(lv["concurrency"]),
                      "n/a" if lv.get("mean_a") is None else f"{lv['mean_a']:.1f}",
                      "n/a" if lv.get("mean_b") is None else f"{lv['mean_b']:.1f}",
                      J.fmt_pct(lv.get("effect")), ci, "n/a" if p is None else f"{p:.3g}", verdict,
                      f"{lv['n_a']}/{lv['n_b']}")
    con.print(table)
    for an in doc.get("anomalies") or []:
        conf = "unconfirmed" if an.get("confidence") is None else f"confidence {an['confidence'] * 100:.1f}%"
        con.print(f"anomaly: arm {an['arm']} throughput at {an['to_concurrency']} is {J.fmt_pct(an['change'])} "
                  f"vs {an['from_concurrency']} ({conf})")
    if not doc.get("anomalies"):
        con.print("anomalies: none")
    con.print(f"method: {doc['judgement'].get('method')}")
    con.print(f"summary: {summary_line(doc)}")


@ab.command("import", cls=_MultiValueCommand)
@click.option("--baseline", "baseline", multiple=True, required=True, metavar="FILE...",
              help="Result files of the baseline arm (A).")
@click.option("--candidate", "candidate", multiple=True, metavar="FILE...",
              help="Result files of the candidate arm (B). Kernels: optional (B runs of the baseline files).")
@click.option("--role", required=True, help="The role the knob applies to, e.g. decode.")
@click.option("--knob", "knob", default=None, metavar="KNOB=VALUE",
              help="The candidate arm's knob value (kernels files name it themselves).")
@click.option("--baseline-value", default=None, metavar="VALUE", help="The baseline's value (default: unset).")
@click.option("--format", "fmt", default="auto", show_default=True,
              type=click.Choice(["auto", "sglang", "vllm", "guidellm", "aiperf", "kernels"]))
@click.option("--inventory", default=None, help="The inventory the results came from (recorded).")
@click.option("--engine", default=None, help="Engine name to record (default: from the format).")
@click.option("--no-commit", is_flag=True, help="Write and stage the files but do not commit.")
@repo_option
@json_option
@example("knobkeeper ab import --baseline base-*.jsonl --candidate ctas512-*.jsonl --role decode "
         "--knob SGLANG_SM120_MMA_TARGET_CTAS=512")
def import_cmd(baseline, candidate, role, knob, baseline_value, fmt, inventory, engine, no_commit, repo, as_json):
    """Build one evidence file from the two arms' benchmark result files, judge it, commit it.

    The repeats of each level are the runs found for it. Formats: sglang bench_serving JSONL,
    vllm bench serve JSON, guidellm benchmarks.json, aiperf profile_export_aiperf.json, and the
    kernels benchmark's evidence files. The level is the configured concurrency.
    """
    from knobkeeper.evidence.store import import_files

    project = find_project(repo)
    doc = import_files(project, baseline=list(baseline), candidate=list(candidate), role=role, knob=knob,
                       baseline_value=baseline_value, fmt=fmt, inventory=inventory, engine=engine,
                       no_commit=no_commit)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"evidence {doc['id']}")
    _print_doc(doc, header=False)


@ab.command("run")
@click.option("--inventory", required=True, help="The inventory to deploy, e.g. inventory/local.py.")
@click.option("--role", required=True, help="The role under test (only it restarts), e.g. decode.")
@click.option("--set", "set_spec", required=True, metavar="KNOB=VALUE", help="The candidate arm (B).")
@click.option("--baseline", default="current", show_default=True, metavar="current|KNOB=VALUE",
              help="The baseline arm (A): the declared state, or an explicit value.")
@click.option("--concurrency", "levels", default="64,80,96", show_default=True, help="Levels, comma-separated.")
@click.option("--repeats", type=int, default=None,
              help="Blocks per arm, ABBA-interleaved (default: the judgement's recommendation at 3% noise).")
@click.option("--requests", type=int, default=None, help="Measured requests per level and repeat.")
@click.option("--duration", type=float, default=None, help="Measured seconds per level and repeat.")
@click.option("--endpoint", default=None, help="Router base URL (default: from the inventory).")
@click.option("--api", type=click.Choice(["chat", "completions", "generate"]), default="chat", show_default=True)
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option("--no-commit", is_flag=True, help="Write and stage the evidence but do not commit.")
@repo_option
@json_option
@example("knobkeeper ab run --inventory inventory/local.py --role decode --set SGLANG_SM120_MMA_TARGET_CTAS=512 "
         "--concurrency 64,80,96 --repeats 6 --requests 600")
def run_cmd(inventory, role, set_spec, baseline, levels, repeats, requests, duration, endpoint, api, input_len,
            output_len, no_commit, repo, as_json):
    """A/B a knob on the live stack: switch arms through the deploy, load every level, judge, restore.

    Arms are interleaved ABBA so drift cancels; each block restarts the role, warms up, then
    loads every level. The declared state is ALWAYS restored at the end (also on Ctrl-C or error).
    """
    from knobkeeper.evidence.ab import ab_run
    from knobkeeper.evidence.judge import recommended_repeats

    if requests is None and duration is None:
        raise UserError("--requests or --duration: give one (how long each level is measured)")
    if requests is not None and duration is not None:
        raise UserError("--requests and --duration: give only one")
    project = find_project(repo)
    doc = ab_run(project, inventory=inventory, role=role, set_spec=set_spec, baseline=baseline,
                 levels=_levels(levels), repeats=repeats or recommended_repeats(), requests=requests,
                 duration=duration, endpoint=endpoint, api=api, input_len=input_len, output_len=output_len,
                 no_commit=no_commit, progress=not as_json)
    if as_json:
        emit_json(doc)
        return
    click.echo(f"evidence {doc['id']}")
    _print_doc(doc, header=False)


@ab.command("show")
@click.argument("ident", metavar="ID")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Also write a PNG: throughput vs concurrency, both arms, 95% CIs, anomalies marked.")
@repo_option
@json_option
@example("knobkeeper ab show 1a2b3c4d --plot ctas.png")
def show_cmd(ident, plot_path, repo, as_json):
    """One evidence file: per level mean A, mean B, effect, 95% CI, p, verdict; anomalies."""
    from knobkeeper.evidence.store import load

    project = find_project(repo)
    doc = load(project, ident)
    if plot_path:
        from knobkeeper.evidence.plot import plot

        plot(doc, plot_path)
    if as_json:
        emit_json(doc)
        return
    _print_doc(doc)
    if plot_path:
        click.echo(f"plot: {plot_path}")


@ab.command("list")
@repo_option
@json_option
@example("knobkeeper ab list")
def list_cmd(repo, as_json):
    """Every evidence file, oldest first, with its one-line judgement."""
    from knobkeeper.evidence.store import list_all

    rows = list_all(find_project(repo))
    if as_json:
        emit_json(rows)
        return
    for row in rows:
        a = "(unset)" if row["baseline"] is None else row["baseline"]
        b = "(unset)" if row["candidate"] is None else row["candidate"]
        click.echo(f"{row['created'][:19]}Z {row['id']} {row['role']}: {row['knob']} {a} -> {b}: {row['summary']}")
