"""aiperf profile_export_aiperf.json, its aggregate and sweep summaries and an --artifact-dir of them:
its reader, the files of a directory, its command line, its BenchTool row."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from knobkeeper.errors import UserError
from knobkeeper.evidence.importers.common import (
    BenchTool, File, Imported, Load, check_same_tool, clean, int_or_none, load_json, not_recorded, pct,
    requests_per_run, str_or_none, tokenizer, with_counts,
)
from knobkeeper.evidence.model import METRIC


AIPERF_RESULT = "profile_export_aiperf.json"
AIPERF_AGGREGATE = "profile_export_aiperf_aggregate.json"
AIPERF_SWEEP = "profile_export_aiperf_sweep.json"


def _aiperf_level(f: File, doc: dict) -> int:
    """The configured concurrency: the profiling phase of `input_config.phases[]` (0.13), or
    `input_config.loadgen.concurrency` (before)."""
    config = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    phases = config.get("phases")
    if isinstance(phases, list):
        measured = [(i, p) for i, p in enumerate(phases) if isinstance(p, dict)
                    and not p.get("exclude_from_results") and p.get("kind", p.get("name")) != "warmup"]
        if len(measured) != 1:
            raise f.unknown("input_config.phases", f"{len(measured)} measured phases (expected one per file)")
        i, phase = measured[0]
        if phase.get("type") != "concurrency":
            raise f.fail(f"input_config.phases[{i}].type", f"{phase.get('type')!r} is not a fixed concurrency "
                                                            f"(accepted: concurrency; run aiperf with --concurrency)")
        return f.level(phase, "concurrency", f"input_config.phases[{i}].")
    loadgen = config.get("loadgen")
    if isinstance(loadgen, dict):
        return f.level(loadgen, "concurrency", "input_config.loadgen.")
    raise f.unknown("input_config.phases", "missing (and no input_config.loadgen.concurrency either)")


def _aiperf_setup(doc: dict) -> dict:
    config = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    setup: dict[str, Any] = {}
    models = config.get("models")
    items = models.get("items") if isinstance(models, dict) else models if isinstance(models, list) else None
    names = [m.get("name") if isinstance(m, dict) else m for m in items or []]
    endpoint = config.get("endpoint") if isinstance(config.get("endpoint"), dict) else {}
    if not names and isinstance(endpoint.get("model_names"), list):   # before 0.13
        names = endpoint["model_names"]
    if names and isinstance(names[0], str):
        setup["model"] = names[0]
    kind = endpoint.get("type")
    if kind in ("chat", "completions"):
        setup["api"] = kind
    datasets = config.get("datasets")
    if isinstance(datasets, list) and datasets and isinstance(datasets[0], dict):
        ds = datasets[0]
        setup["dataset"] = str_or_none(ds.get("type")) or str_or_none(ds.get("name"))
        prompts = ds.get("prompts") if isinstance(ds.get("prompts"), dict) else {}
        for key, name in (("input_len", "isl"), ("output_len", "osl")):
            part = prompts.get(name)
            if isinstance(part, dict) and int_or_none(part.get("mean")) is not None:
                setup[key] = int_or_none(part["mean"])
    prompt = ((config.get("input") or {}).get("prompt") or {}) if isinstance(config.get("input"), dict) else {}
    for key, name in (("input_len", "input_tokens"), ("output_len", "output_tokens")):   # before 0.13
        part = prompt.get(name)
        if key not in setup and isinstance(part, dict) and int_or_none(part.get("mean")) is not None:
            setup[key] = int_or_none(part["mean"])
    return clean(setup)


def read_aiperf(path: Path, data: Any = None) -> Imported:
    """One profile_export_aiperf.json (one level), or a directory of them (aiperf's --artifact-dir)."""
    if path.is_dir():
        return _read_aiperf_dir(path)
    doc = load_json(path) if data is None else data
    f = File(path, "aiperf")
    if not isinstance(doc, dict):
        raise f.fail("(top level)", "expected one JSON object (aiperf profile_export_aiperf.json)")
    version = str_or_none(doc.get("aiperf_version"))
    tool = "aiperf" + (f" {version}" if version else "")
    f.tool = tool
    if doc.get("aggregation_type") == "sweep" or isinstance((doc.get("metadata") or {}).get("aggregation_type"), str):
        return _read_aiperf_summary(f, doc, path)
    tput = doc.get("output_token_throughput")
    if not isinstance(tput, dict):
        raise f.unknown("output_token_throughput", "missing (expected a metric object with avg)")

    def stat(tag: str) -> dict | None:
        m = doc.get(tag)
        if not isinstance(m, dict):
            return None
        return pct(m, {"mean": "avg", "p50": "p50", "p90": "p90", "p99": "p99"}, f, f"{tag}.")

    def total(tag: str) -> int | None:
        m = doc.get(tag)
        value = f.num(m, "avg", f"{tag}.", required=False) if isinstance(m, dict) else None
        return None if value is None else int(round(value))

    completed = total("request_count")                 # the successful ones
    errors = total("error_request_count")
    if errors is None and isinstance(doc.get("error_summary"), list):
        # aiperf writes error_request_count only when a request failed; the summary is always there
        errors = sum(int(e.get("count") or 0) for e in doc["error_summary"] if isinstance(e, dict))
    answered = total("completed_request_count")         # success + error (0.13)
    if errors is None and answered is not None and completed is not None:
        errors = answered - completed
    if answered is None and completed is not None and errors is not None:
        answered = completed + errors
    if None not in (answered, completed, errors) and answered != completed + errors:
        raise f.fail("completed_request_count", f"{answered} answered but request_count {completed} + "
                                                f"errors {errors} (the file contradicts itself)")
    run = with_counts({
        "concurrency": _aiperf_level(f, doc),
        METRIC: f.num(tput, "avg", "output_token_throughput.", nonnegative=True),
        "requests_per_s": f.num(doc.get("request_throughput") or {}, "avg", "request_throughput.", required=False),
        "ttft_ms": stat("time_to_first_token"),
        "itl_ms": stat("inter_token_latency"),
        # aiperf's inter_token_latency is per request (latency - TTFT) / (output tokens - 1): a TPOT.
        "tpot_ms": stat("inter_token_latency"),
        "e2e_ms": stat("request_latency"),
        "output_tokens": total("total_output_tokens"),
        "duration_s": f.num(doc.get("benchmark_duration") or {}, "avg", "benchmark_duration.", required=False),
    }, completed=completed, errors=errors, requested=answered)
    if doc.get("was_cancelled") is True:
        raise f.fail("was_cancelled", "true: the run was cancelled before it finished (not a measurement)")
    out = Imported(tool, [run], tool_version=version, files=[path],
                   shape="aiperf profile_export_aiperf.json" + (" (input_config.phases)" if isinstance(
                       (doc.get("input_config") or {}).get("phases"), list) else " (input_config.loadgen)"))
    if errors is None:
        out.notes.append(not_recorded(tool, "no error_request_count and no error_summary"))
    out.setup = _aiperf_setup(doc)
    out.setup.update(clean({"requests_per_run": answered if answered is not None else completed,
                             "tool": "aiperf", "tool_version": version}))
    return out


def _read_aiperf_summary(f: File, doc: dict, path: Path) -> Imported:
    """An aggregate file (aggregate/concurrency_N/profile_export_aiperf_aggregate.json: one level over
    its trials) or the sweep file (sweep_aggregate/profile_export_aiperf_sweep.json: every level).
    Their numbers are means over trials: one trial each is one run; more is refused (the trials'
    own files are the runs)."""
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    if doc.get("aggregation_type") == "sweep":
        trials, where = meta.get("num_trials_per_value"), "metadata.num_trials_per_value"
        entries = doc.get("per_combination_metrics")
        if not isinstance(entries, list) or not entries:
            raise f.unknown("per_combination_metrics", "missing (expected the sweep's per-level entries)")
        rows = []
        for i, entry in enumerate(entries):
            at = f"per_combination_metrics[{i}]."
            params = entry.get("parameters") if isinstance(entry, dict) else None
            metrics = entry.get("metrics") if isinstance(entry, dict) else None
            if not isinstance(metrics, dict):
                raise f.unknown(f"{at}metrics", "missing")
            rows.append((f.level(params, "concurrency", f"{at}parameters."), metrics, f"{at}metrics.", ""))
        shape = "aiperf sweep file (sweep_aggregate/profile_export_aiperf_sweep.json)"
    else:
        trials, where = meta.get("num_profile_runs"), "metadata.num_profile_runs"
        values = meta.get("variation_values") if isinstance(meta.get("variation_values"), dict) else {}
        key = next((k for k in values if k == "concurrency" or k.endswith(".concurrency")), None)
        if key is None:
            raise f.unknown("metadata.variation_values", "no concurrency (expected phases.profiling.concurrency)")
        metrics = doc.get("metrics")
        if not isinstance(metrics, dict):
            raise f.unknown("metrics", "missing")
        rows = [(f.level(values, key, "metadata.variation_values."), metrics, "metrics.", "_avg")]
        shape = "aiperf aggregate file (aggregate/concurrency_N/profile_export_aiperf_aggregate.json)"
    if trials != 1:
        raise f.fail(where, f"{trials!r} trials averaged: each trial is a run, pass the artifact directory "
                            f"(or its profile_runs/*/profile_export_aiperf.json files), not the mean of them")
    version = str_or_none(doc.get("aiperf_version"))
    tool = "aiperf" + (f" {version}" if version else "")
    out = Imported(tool, tool_version=version, shape=shape, files=[path])
    for level, metrics, at, suffix in rows:
        def mean(tag: str, required: bool = False) -> float | None:
            m = metrics.get(tag + suffix)
            if not isinstance(m, dict):
                if required:
                    raise f.unknown(f"{at}{tag}{suffix}", "missing (expected a metric with mean)")
                return None
            return f.num(m, "mean", f"{at}{tag}{suffix}.", required=required)

        def dist(tag: str) -> dict | None:
            if suffix:   # the aggregate file: one key per statistic (time_to_first_token_p99)
                vals = {k: _mean_key(metrics, f"{tag}_{src}", f, at)
                        for k, src in (("mean", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"))}
            else:        # the sweep file: each metric's avg (its mean over trials), no percentiles
                vals = {"mean": _mean_key(metrics, tag, f, at), "p50": None, "p90": None, "p99": None}
            return vals if any(v is not None for v in vals.values()) else None

        completed = mean("request_count")
        answered = mean("completed_request_count")
        errors = None if completed is None or answered is None else int(round(answered - completed))
        out.runs.append(with_counts({
            "concurrency": level,
            METRIC: mean("output_token_throughput", required=True),
            "requests_per_s": mean("request_throughput"),
            "ttft_ms": dist("time_to_first_token"), "itl_ms": dist("inter_token_latency"),
            "tpot_ms": dist("inter_token_latency"), "e2e_ms": dist("request_latency"),
            "duration_s": mean("benchmark_duration"),
        }, completed=None if completed is None else int(round(completed)), errors=errors,
            requested=None if answered is None else int(round(answered))))
        if errors is None:
            out.notes = [not_recorded(tool, "no completed_request_count beside request_count")]
    out.setup = clean({"model": str_or_none(meta.get("model")), "requests_per_run": requests_per_run(out.runs),
                        "tool": "aiperf", "tool_version": version})
    return out


def _mean_key(metrics: dict, key: str, f: File, at: str) -> float | None:
    m = metrics.get(key)
    return f.num(m, "mean", f"{at}{key}.", required=False) if isinstance(m, dict) else None


def aiperf_files(directory: Path) -> list[Path]:
    """The per-level results under an aiperf --artifact-dir: concurrency_N/profile_export_aiperf.json
    (a sweep; trials under profile_runs/ too), or the directory's own profile_export_aiperf.json."""
    found = sorted(p for p in directory.rglob(AIPERF_RESULT)
                   if "aggregate" not in p.relative_to(directory).parts[:-1]
                   and "sweep_aggregate" not in p.relative_to(directory).parts[:-1])
    if not found:
        raise UserError(f"{directory}: no aiperf result in it (looked for */{AIPERF_RESULT}; aggregate/ and "
                        f"sweep_aggregate/ files alone are summaries, not runs)")
    return found


def _read_aiperf_dir(directory: Path) -> Imported:
    parts = [read_aiperf(p) for p in aiperf_files(directory)]
    check_same_tool([(p, imp) for p, imp in zip(aiperf_files(directory), parts)], where=str(directory))
    first = parts[0]
    out = Imported(first.tool, [r for imp in parts for r in imp.runs], tool_version=first.tool_version,
                   shape=f"aiperf artifact directory ({len(parts)} profile_export_aiperf.json)",
                   files=[p for imp in parts for p in imp.files])
    out.notes = sorted({n for imp in parts for n in imp.notes})
    out.setup = dict(first.setup)
    out.setup["requests_per_run"] = requests_per_run(out.runs)
    if out.setup["requests_per_run"] is None:
        out.setup.pop("requests_per_run")
    _check_aiperf_summaries(directory, out)
    return out


def _check_aiperf_summaries(directory: Path, imp: Imported) -> None:
    """aiperf's own summaries in the directory (the sweep file, the per-level aggregate files) must
    agree with its per-level results: same levels, same throughput. A directory whose parts
    disagree (a file copied in from another run) is not one measurement."""
    have = {r["concurrency"]: r[METRIC] for r in imp.runs}
    summaries = sorted(directory.glob(f"sweep_aggregate/{AIPERF_SWEEP}")) + sorted(
        directory.glob(f"aggregate/*/{AIPERF_AGGREGATE}"))
    for path in summaries:
        data = load_json(path)
        if isinstance(data, dict) and ((data.get("metadata") or {}).get("num_trials_per_value", 1) != 1
                                       or (data.get("metadata") or {}).get("num_profile_runs", 1) != 1):
            continue   # a mean over several trials: not comparable run by run
        for run in read_aiperf(path, data).runs:
            level, value = run["concurrency"], run[METRIC]
            if level not in have or not math.isclose(value, have[level], rel_tol=1e-9):
                said = f"{value:g} at {level}" if level in have else f"level {level}"
                raise UserError(f"{path}: {said}, but the directory's results are "
                                f"{', '.join(f'{v:g} at {c}' for c, v in sorted(have.items()))}")


def aiperf_command(load: Load) -> list[str]:
    """`aiperf profile` for one level into an artifact directory; server token counts (not the client's
    tokenizer's). Not HF_HUB_OFFLINE: aiperf 0.13.0 then looks a tokenizer directory up in the hub cache."""
    return ["profile", "--model", load.model, "--url", load.endpoint, "--endpoint-type", load.api, "--streaming",
            *tokenizer(load), "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
            "--synthetic-input-tokens-mean", str(load.input_len), "--output-tokens-mean", str(load.output_len),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", str(load.seed),
            "--ui-type", "simple", "--artifact-dir", str(load.out)]


AIPERF = BenchTool("aiperf", "aiperf", ("-m", "aiperf"), "aiperf", ("aiperf",), aiperf_command,
                   env=(("COLUMNS", "200"),))
