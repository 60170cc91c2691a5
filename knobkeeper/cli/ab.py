"""`knobkeeper ab`: A/B evidence — run (through the deploy), import (benchmark tools), show, list, rejudge.

Imports inside functions: each command's library, on first use (the measured reason: knobkeeper/cli/__init__.py).
"""

from __future__ import annotations

import sys

import click

from knobkeeper import fmt
from knobkeeper.cli.common import KKGroup, console, emit_json, example, json_option, repo_option
from knobkeeper.cli.core import stack_option
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


def _print_doc(doc, *, header: bool = True) -> None:
    """`ab show`'s text: per level the table, the guards, validity, the looks, anomalies, the method."""
    from rich.markup import escape
    from rich.table import Table


    con = console()
    safe = lambda text: escape(fmt.safe(text))  # noqa: E731  (file contents: no markup, no escapes)
    if header:
        con.print(safe(f"evidence {doc.id}  {doc.knob} on {doc.scope}: A={fmt.value(doc.baseline)}  "
                       f"B={fmt.value(doc.candidate)}  [{doc.source.tool}, {doc.created[:19]}Z]"))
    if doc.rejudges:
        con.print(safe(f"re-judges evidence {doc.rejudges}: its runs, judged again by today's method"))
    con.print(safe(" · ".join(x for x in (doc.engine_text(), doc.setup.measured_text()) if x)))
    for note in doc.unrecorded_notes():
        con.print(safe(note))
    family = doc.judgement.family
    title = f"{doc.metric} per level (B vs A)"
    if family:
        title += f"; family-wise alpha {family.alpha:g} over {family.size} tests ({family.method})"
    table = Table(title=title)
    for col in ("conc", "mean A", "mean B", "effect", "95% CI", "p", "p adj", "verdict", "n A/B"):
        table.add_column(col, justify="right" if col not in ("verdict",) else "left")
    for lv in doc.judgement.levels:
        verdict = lv.verdict
        if not doc.is_adjusted and lv.valid:
            verdict += " (unadjusted)"
        if lv.repeats_needed:
            verdict += f" (needs {lv.repeats_needed} runs/arm)"
        if lv.outliers_dropped:
            verdict += f" [{len(lv.outliers_dropped)} dropped]"
        table.add_row(str(lv.concurrency), fmt.num(lv.mean_a), fmt.num(lv.mean_b), fmt.pct(lv.effect), lv.ci_text(),
                      fmt.p_value(lv.p_value), doc.p_cell(lv), verdict, f"{lv.n_a}/{lv.n_b}")
    con.print(table)
    if doc.judgement.guards:
        gt = Table(title="guards: latency B vs A (+ = slower)")
        for col in ("conc", "metric", "effect", "95% CI", "p", "p adj", "verdict"):
            gt.add_column(col, justify="left" if col in ("metric", "verdict") else "right")
        for g in doc.judgement.guards:
            gt.add_row(str(g.concurrency), g.label, fmt.pct(g.effect), g.ci_text(), fmt.p_value(g.p_value),
                       fmt.p_value(g.p_adjusted), g.verdict + (" REGRESSION" if g.regression else ""))
        con.print(gt)
    for row in doc.validity.levels:
        if not row.valid:
            con.print(safe(f"invalid @{row.concurrency}: " + "; ".join(row.reasons)))
        for note in row.not_applied:
            con.print(safe(f"@{row.concurrency}: {note}"))
    for note in doc.validity.reasons:
        con.print(safe(f"note: {note}"))
    if doc.sequential:
        looks = ", ".join(f"after {lk.repeat}: " + (", ".join(f"@{c} {v}" for c, v in lk.settled.items())
                                                    or "none settled") for lk in doc.sequential.looks)
        con.print(safe(f"sequential: {doc.sequential.rule}"))
        con.print(safe(f"looks: {looks or 'none taken'}"))
    for an in doc.anomalies:
        con.print(f"anomaly: {an.text()}")
    if not doc.anomalies:
        con.print("anomalies: none")
    con.print(safe(f"method: {doc.judgement.method}"))
    if doc.interrupted:
        con.print(safe(f"INTERRUPTED by {doc.interrupted.get('by')} at {doc.interrupted.get('at')} after "
                       f"{doc.interrupted.get('blocks')} blocks: the runs measured until then"))
    if doc.sweep is not None:
        _print_sweep(doc, con, safe)
    con.print(safe(f"summary: {doc.summary_line()}"))


def _print_sweep(doc, con, safe) -> None:
    """A sweep's part of `ab show`: every arm against the control per level with the family's
    simultaneous intervals, each arm's fate, the elimination timeline, the pick."""
    from rich.table import Table


    block, plan = doc.sweep, doc.sweep.plan
    table = Table(title=f"sweep of {len(plan.candidates)} candidates vs the control, one family "
                        f"(simultaneous 95% intervals); the table above is "
                        f"{'the confirming A/B' if block.confirm else 'the search runs of A and B'}")
    table.add_column("arm", justify="left")
    for conc in plan.levels:
        table.add_column(f"@{conc}", justify="right")
    table.add_column("fate", justify="left")
    for arm in plan.arms:
        cells = [f"{fmt.pct(e)} " + (f"[{fmt.pct(i[0])}..{fmt.pct(i[1])}] " if i else "") + v
                 for _, e, i, v in block.cells(arm)] or [""] * len(plan.levels)
        table.add_row(safe(plan.arm_text(arm)), *[safe(c) for c in cells], safe(block.fate(arm)))
    con.print(table)
    for line in block.timeline():
        con.print(safe(f"  {line}"))
    con.print(safe(f"plan {plan.id} ({block.plan_path}, commit {(block.plan_commit or 'none')[:10]}): delta "
                   f"{plan.delta:.1%} ({plan.delta_source}), alpha {plan.alpha:g}, up to {plan.max_repeats} blocks, "
                   f"order {plan.order} seed {plan.seed}; search {len(block.blocks)} blocks: {block.stopped}"))
    con.print(safe(block.pick_text() + (f" (status {block.status})" if block.status != "complete" else "")))


def _print_new(doc, as_json: bool, notes: list[str] | tuple[str, ...] = ()) -> None:
    """What `ab import` and `ab run` print of the evidence they wrote: its JSON, or its id, the
    notes on what the files could not say, and the table."""
    if as_json:
        emit_json(doc.to_json())
        return
    click.echo(f"evidence {doc.id}")
    for note in notes:
        click.echo(f"note: {note}")
    _print_doc(doc, header=False)


# The one --keep-invalid of both producers (import and run): the validity gates are the same.
keep_invalid_option = click.option("--keep-invalid", is_flag=True,
                                   help="Write the evidence even when no level passes the validity gates.")


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
@keep_invalid_option
@stack_option
@repo_option
@json_option
@example("knobkeeper ab import --baseline base-*.jsonl --candidate ctas512-*.jsonl --role decode "
         "--knob SGLANG_SM120_MMA_TARGET_CTAS=512")
def import_cmd(baseline, candidate, role, knob, baseline_value, fmt, inventory, engine, no_commit, keep_invalid,
               stack, repo, as_json):
    """Build one evidence file from the two arms' benchmark result files, judge it, commit it.

    The repeats of each level are the runs found for it. The level is the configured
    concurrency. Knob, role and values are checked against the catalog; the validity gates
    apply (zero tokens, lost requests, errors, the knob not carried, duplicates); a set with no
    valid level is refused. One arm's files must come from one version of one tool. Failed
    requests are read where the file records them; where it does not, the import says
    "errors: not recorded by TOOL VERSION": the runs keep errors null, the tool named in
    not_recorded, and the errors gate is marked not applied (never passed with 0).

    \b
    What to run against the local stack (router http://127.0.0.1:30080, model knobkeeper-sim;
    TOK = a local tokenizer directory), once per arm, and what to pass:
    \b
    sglang bench_serving 0.5.23: pass the .jsonl (one line per run; levels may share a file).
      python -m sglang.bench_serving --backend sglang --dataset-name random-ids
        --base-url URL --model knobkeeper-sim --tokenizer TOK --random-input-len 64
        --random-output-len 32 --num-prompts 64 --max-concurrency 8 --output-details
        --output-file base.jsonl
      Its line has no failed/num_prompts: --output-details records each request's
      error (or keep sglang's default file name, which holds num_prompts).
    vllm bench serve 0.32/0.33: pass each --result-filename (one level per file).
      vllm bench serve --backend vllm --base-url URL --endpoint /v1/completions
        --model knobkeeper-sim --tokenizer TOK --dataset-name random --random-input-len 64
        --random-output-len 32 --ignore-eos --num-prompts 64 --max-concurrency 8
        --save-result --result-dir D --result-filename base-c8.json
      Records failed always; --metadata KNOB=VALUE records the server's knob value,
      --metadata vllm_version=0.33.0 the version (the file has none otherwise).
    guidellm 0.8.1: pass the --output json file (all levels in one).
      guidellm run --backend kind=openai_http,target=URL --profile kind=concurrent
        --override profile.streams 8,32 --constraint kind=max_requests,count=64
        --data kind=synthetic_text,prompt_tokens=64,output_tokens=32
        --tokenizer kind=huggingface_auto,model=TOK --output kind=json,path=base.json
      Records successful/errored/incomplete per level (metrics.request_totals).
    aiperf 0.13.0: pass the --artifact-dir (or its concurrency_N/profile_export_aiperf.json).
      aiperf profile --model knobkeeper-sim --url URL --endpoint-type completions --streaming
        --tokenizer TOK --concurrency 8,32 --request-count 64 --isl 64 --osl 32
        --use-server-token-count --artifact-dir base
      Without --use-server-token-count it counts tokens with the client's tokenizer.
      Records error_request_count / error_summary always.
    Behind smg a failed request is retried (5 times by default) before the tool sees it:
    start the router with --disable-retries to count the engine's failures.
    """
    from knobkeeper.evidence import importers
    from knobkeeper.evidence.store import import_files

    project = find_project(repo)
    # an aiperf artifact directory is its per-level files (each a run, copied beside the evidence)
    baseline, candidate = importers.expand(baseline), importers.expand(candidate)
    notes = importers.check_arms(baseline, candidate, fmt)   # mixed versions refused; nothing written yet
    doc = import_files(project, baseline=list(baseline), candidate=list(candidate), role=role, knob=knob,
                       baseline_value=baseline_value, fmt=fmt, inventory=inventory, engine=engine,
                       no_commit=no_commit, keep_invalid=keep_invalid, stack=stack)
    _print_new(doc, as_json, notes)  # notes: runs whose errors gate had nothing to read


@ab.command("run")
@click.option("--inventory", required=True, help="The inventory to deploy, e.g. inventory/local.py.")
@click.option("--role", required=True, help="The role under test (only it restarts), e.g. decode.")
@click.option("--set", "set_spec", required=True, metavar="KNOB=VALUE", help="The candidate arm (B).")
@click.option("--baseline", default="current", show_default=True, metavar="current|KNOB=VALUE",
              help="The baseline arm (A): the declared state, or an explicit value.")
@click.option("--concurrency", "levels", default="64,80,96", show_default=True, help="Levels, comma-separated.")
@click.option("--repeats", type=int, default=None,
              help="A fixed design: exactly this many blocks per arm, ABBA-interleaved.")
@click.option("--max-repeats", type=int, default=None,
              help="The sequential design's cap (default design; default cap: the fixed design's power at 3% "
                   "noise, 10 on a real engine).")
@click.option("--requests", type=int, default=None, help="Measured requests per level and repeat.")
@click.option("--duration", type=float, default=None,
              help="Measured seconds per level and repeat. Default on a real engine (not the sim): 25, after a "
                   "5-s block warm-up that is recorded, not judged.")
@click.option("--endpoint", default=None, help="Router base URL (default: from the inventory).")
@click.option("--api", type=click.Choice(["chat", "completions", "generate"]), default="chat", show_default=True)
@click.option("--input-len", type=int, default=128, show_default=True)
@click.option("--output-len", type=int, default=64, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True,
              help="The prompts' seed: the same for every arm, level and repeat.")
@click.option("--bench", "bench", default="loadgen", show_default=True,
              type=click.Choice(["loadgen", "vllm", "sglang", "guidellm", "aiperf"]),
              help="Who loads each level: knobkeeper's load generator, or your installed tool "
                   "(vllm bench serve, sglang.bench_serving, guidellm, aiperf).")
@click.option("--bench-python", default=None, envvar="KNOBKEEPER_BENCH_PYTHON", metavar="PYTHON",
              help="The python of the environment the --bench tool is installed in (env "
                   "KNOBKEEPER_BENCH_PYTHON). Default: the tool's command on PATH (vllm, guidellm, aiperf; "
                   "python3 for sglang).")
@click.option("--bench-arg", "bench_args", multiple=True, metavar="ARG",
              help="One more word for every --bench command, as given (repeat it: --bench-arg=--num-warmups "
                   "--bench-arg=2).")
@click.option("--tokenizer", default=None, metavar="DIR",
              help="The --bench tool's tokenizer (a local directory; default: the tool's, from the model name).")
@click.option("--no-commit", is_flag=True, help="Write and stage the evidence but do not commit.")
@keep_invalid_option
@repo_option
@json_option
@example("knobkeeper ab run --inventory inventory/local.py --role decode --set SGLANG_SM120_MMA_TARGET_CTAS=512 "
         "--concurrency 64,80,96 --max-repeats 12 --requests 600\n"
         "  knobkeeper ab run --inventory inventory/local.py --role decode --set SGLANG_SM120_MMA_TARGET_CTAS=512 "
         "--concurrency 8,32 --requests 64 --api completions --input-len 64 --output-len 32 "
         "--bench vllm --bench-python ~/venvs/vllm/bin/python --tokenizer ~/tok --bench-arg=--num-warmups "
         "--bench-arg=2")
def run_cmd(inventory, role, set_spec, baseline, levels, repeats, max_repeats, requests, duration, endpoint, api,
            input_len, output_len, seed, bench, bench_python, bench_args, tokenizer, no_commit, keep_invalid, repo,
            as_json):
    """A/B a knob on the live stack: switch arms through the deploy, load every level, judge, restore.

    Arms are interleaved ABBA so drift cancels; each block restarts the role, checks the engine
    carries the arm's value, warms up, then loads every open level. By default the design is
    sequential: after 3, 5, 7, 10, ... repeats the settled levels stop (the error rate stays
    controlled over every level and the TTFT/TPOT guards); --repeats N runs a fixed design.
    The declared state is ALWAYS restored at the end (also on Ctrl-C or error); Ctrl-C and SIGTERM
    keep the runs measured as evidence marked interrupted, and after a SIGKILL the run's marker
    makes check, deploy and set say so until `knobkeeper ab abort`. An A/B is a `knobkeeper sweep`
    with one candidate (the same search; see `knobkeeper sweep --help` to try several values).

    \b
    --bench TOOL: your own tool loads every arm, level and repeat (the block's warm-up stays
    knobkeeper's), with the same prompt shape (--api, --input-len, --output-len) and --seed,
    --requests prompts at the level's concurrency; its result file is kept beside the evidence
    and read as `ab import` reads it (its failed requests, or "errors: not recorded"). The tool
    is found as --bench-python PYTHON -m TOOL (or $KNOBKEEPER_BENCH_PYTHON), else through its
    command on PATH; one that is not installed is said before any arm is switched, one that
    exits non-zero stops the run with its last lines and the declared state is restored.
      vllm      vllm bench serve --dataset-name random --ignore-eos --save-result (chat, completions)
      sglang    python -m sglang.bench_serving --dataset-name random-ids --output-details (generate,
                completions, chat; behind smg use --api generate)
      guidellm  guidellm run --profile kind=concurrent --constraint kind=max_requests (chat, completions)
      aiperf    aiperf profile --use-server-token-count (chat, completions)
    """
    from knobkeeper.evidence.ab import Design, ab_run

    if requests is not None and duration is not None:
        raise UserError("--requests and --duration: give only one")
    if repeats is not None and max_repeats is not None:
        raise UserError("--repeats and --max-repeats: give only one (fixed or sequential design)")
    project = find_project(repo)
    design = Design(_levels(levels), repeats=repeats, max_repeats=max_repeats, requests=requests, duration=duration,
                    api=api, input_len=input_len, output_len=output_len, keep_invalid=keep_invalid, seed=seed)
    located = None
    if bench != "loadgen":
        from knobkeeper.evidence.bench import locate

        if requests is None:
            raise UserError(f"--bench {bench}: give --requests (the tools run a number of prompts, not a duration)")
        located = locate(bench, bench_python)   # not installed: said here, before any arm is switched
    elif bench_args:
        raise UserError("--bench-arg: only with --bench TOOL (the default loadgen takes none)")
    from knobkeeper.evidence.experiment import Interrupted

    try:
        doc = ab_run(project, inventory=inventory, role=role, set_spec=set_spec, baseline=baseline, design=design,
                     endpoint=endpoint, no_commit=no_commit, progress=not as_json, bench=located,
                     bench_args=list(bench_args), tokenizer=tokenizer)
    except Interrupted as stopped:   # one line saying what was put back and kept, not click's "Aborted!"
        click.echo(stopped.line, err=True)
        sys.exit(130)
    _print_new(doc, as_json)


@ab.command("abort")
@repo_option
@json_option
@example("knobkeeper ab abort")
def abort_cmd(repo, as_json):
    """Put back what an `ab run` or `sweep` that died (SIGKILL, a reboot) left on an arm.

    Deploys the role it was measuring back to the declared state (a recorded deploy), writes the
    runs its marker kept as evidence marked "interrupted", and removes the marker. `check`,
    `deploy`, `status`, `set`, `ab run` and `sweep` name such an abandoned run until then.
    """
    from knobkeeper.evidence.sweep import abort

    data, result, doc = abort(find_project(repo))
    if as_json:
        emit_json({"aborted": {k: v for k, v in data.to_json().items() if k != "journal"}, "deploy": result.deploy_id,
                   "evidence": doc.id if doc is not None else None})
        return
    kept = f"; evidence {doc.id} (interrupted) kept the {len(doc.runs) + (len(doc.sweep.runs) if doc.sweep else 0)} " \
           f"runs measured" if doc is not None else "; no run was measured"
    click.echo(f"{data.kind} of {data.knob} on {data.scope or data.role} (abandoned): "
               f"role {data.role} put back to the declared state (deploy {result.deploy_id}){kept}")


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
        emit_json(doc.to_json())
        return
    _print_doc(doc)
    if plot_path:
        click.echo(f"plot: {plot_path}")


@ab.command("rejudge")
@click.argument("ident", metavar="ID")
@click.option("--no-commit", is_flag=True, help="Write and stage the new file but do not commit.")
@repo_option
@json_option
@example("knobkeeper ab rejudge 1a2b3c4d")
def rejudge_cmd(ident, no_commit, repo, as_json):
    """Judge an evidence file's runs again by today's method, into a NEW evidence file.

    Evidence files are append-only: the file ID is kept byte for byte, and the entries that cite
    it keep citing it. The new file has its own id, names ID in `rejudges`, and holds ID's runs,
    arms and setup unchanged (check refuses a re-judgement whose runs differ); cite it in a new
    change (set ... --evidence NEW). Refused when today's method says what ID says already.
    """
    from knobkeeper.evidence.store import rejudge_file

    _print_new(rejudge_file(find_project(repo), ident, no_commit=no_commit), as_json)


@ab.command("list")
@repo_option
@json_option
@example("knobkeeper ab list")
def list_cmd(repo, as_json):
    """Every evidence file, oldest first, with its one-line judgement."""
    from knobkeeper.evidence.store import list_all

    rows = list_all(find_project(repo))
    if as_json:
        emit_json([row.to_json() for row in rows])
        return

    for row in rows:
        click.echo(fmt.safe(f"{row.created[:19]}Z {row.id} {row.role}: {row.knob} "
                            f"{fmt.value(row.baseline)} -> {fmt.value(row.candidate)}: {row.summary}"))
