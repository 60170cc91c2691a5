"""Read the result files of the benchmark tools people already use into evidence runs.

One module per tool, each with one small reader returning an `Imported` (runs without arm/repeat,
plus what the file says about the setup, the tool and its version) and, for the four serving
benchmarks, the command line `ab run --bench` runs it with and its `BenchTool` row:

    sglang.py    read_sglang, sglang_command, SGLANG
    vllm.py      read_vllm, vllm_command, VLLM
    guidellm.py  read_guidellm, guidellm_command, GUIDELLM
    aiperf.py    read_aiperf (a file or an --artifact-dir), aiperf_files, aiperf_command, AIPERF
    kernels.py   read_kernels
    common.py    what they share: Imported, the parsed file (File), JSON loading, the request counts
                 and their notes, Load, BenchTool, OFFLINE, check_same_tool; no tool's module
                 imports another's
    __init__.py  the dispatch: FORMATS, TOOLS, detect, read, evidence_fields, expand, check_arms;
                 and every name above, so callers use `importers.read`, `importers.TOOLS`, ...

Field names follow each tool's own writer; the fixtures under tests/data/bench_formats/<tool>-<version>/
are files the real tools wrote (bench/bench_format_fixtures.py regenerates them):

    sglang    `python -m sglang.bench_serving` JSONL: one JSON object per line, one run per line
              (several levels appended to one file each keep their own counts); the level is
              `max_concurrency` (the configured one), never `concurrency` (sglang's measured
              sum-of-latencies / duration). The file never says sglang's version: the 0.5.23 line
              is known by its keys (`server_info`, `total_input_text_tokens`). It has no `failed`
              and no `num_prompts`: lost requests are counted from `--output-details` (the
              per-request `errors` list), from the default file name sglang gives it
              (<backend>_<MMDD>_<num_prompts>_<in>_<out>.jsonl), or not at all (said so).
    vllm      `vllm bench serve --save-result` JSON (0.32, 0.33): one object per file;
              `max_concurrency`; `completed`, `failed`, `num_prompts`; `request_rate` may be
              `Infinity`. No version in the file unless `--metadata vllm_version=...` put one.
    guidellm  benchmarks.json: {"metadata": {"guidellm_version"}, "benchmarks": [...]}, each with
              a concurrent/synchronous strategy (`config.strategy` since the v0.7-era schema,
              `args.strategy` before), request counts in `metrics.request_totals` (0.8.x; at the
              benchmark's top level before) and `metrics.<name>.successful.{mean,median,percentiles}`.
    aiperf    profile_export_aiperf.json: top-level metric tags with unit/avg/pNN and
              `aiperf_version`; the level is `input_config.phases[]` {"type": "concurrency",
              "concurrency": N} (0.13) or `input_config.loadgen.concurrency` (before). A directory
              (`--artifact-dir` of a `--concurrency 8,32` sweep) is read as one argument: its
              concurrency_N/profile_export_aiperf.json files are the runs; the aggregate/ and
              sweep_aggregate/ files are read too and must agree.
    kernels   the kernels benchmark (kernels/knobkeeper_kernels/bench.py): already an evidence
              doc (schema knobkeeper.evidence/1 or /2) whose runs carry arm A/B; a NaN, zero or
              negative throughput anywhere is a broken file (refused).

Lost requests, always accounted: every run carries `completed` (finished), `errors` (failed) and
`requested` as the file holds them, and `errors_recorded`. Where the file cannot tell, `errors`
is None, `errors_recorded` False and `Imported.notes` says "errors: not recorded by <tool>
<version>": a reader never reads 0 errors from a field that is not there.

TTFT and TPOT (median, p99) are read wherever the tool writes them: they are the guards.
A throughput of 0 is read, not refused: the validity gates name it (zero generated tokens).

Anything unknown or malformed is a UserError naming the file and the field; a shape a reader does
not know names the tool, its version and the field it looked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable

from knobkeeper.errors import UserError
from knobkeeper.evidence.importers.aiperf import (
    AIPERF, AIPERF_AGGREGATE, AIPERF_RESULT, AIPERF_SWEEP, aiperf_command, aiperf_files, read_aiperf,
)
from knobkeeper.evidence.importers.common import OFFLINE, BenchTool, Imported, Load, check_same_tool, load_json
from knobkeeper.evidence.importers.guidellm import GUIDELLM, guidellm_command, read_guidellm
from knobkeeper.evidence.importers.kernels import read_kernels
from knobkeeper.evidence.importers.sglang import SGLANG, SGLANG_0_5_23_KEYS, read_sglang, sglang_command
from knobkeeper.evidence.importers.vllm import VLLM, VLLM_VERSION_KEYS, read_vllm, vllm_command

__all__ = [
    "AIPERF", "AIPERF_AGGREGATE", "AIPERF_RESULT", "AIPERF_SWEEP", "FORMATS", "GUIDELLM", "OFFLINE", "READERS",
    "SGLANG", "SGLANG_0_5_23_KEYS", "TOOLS", "VLLM", "VLLM_VERSION_KEYS", "BenchTool", "Imported", "Load",
    "aiperf_command", "aiperf_files", "check_arms", "check_same_tool", "detect", "evidence_fields", "expand",
    "guidellm_command", "read", "read_aiperf", "read_guidellm", "read_kernels", "read_sglang", "read_vllm",
    "sglang_command", "vllm_command",
]

FORMATS = ("sglang", "vllm", "guidellm", "aiperf", "kernels")


# ---------------------------------------------------------------- which reader a file is for

TOOLS: dict[str, BenchTool] = {t.name: t for t in (VLLM, SGLANG, GUIDELLM, AIPERF)}
READERS: dict[str, Callable[..., Imported]] = {
    "sglang": read_sglang, "vllm": read_vllm, "guidellm": read_guidellm, "aiperf": read_aiperf,
    "kernels": read_kernels,
}
_NAMES = {"sglang": "sglang bench_serving JSONL", "vllm": "vllm bench serve JSON",
          "guidellm": "guidellm benchmarks.json", "aiperf": "aiperf profile_export_aiperf(_aggregate|_sweep).json",
          "kernels": "kernels evidence JSON"}


_SGLANG_KEYS = ("mean_e2e_latency_ms", "random_input_len", "dataset_name", "accept_length", "total_input_text_tokens")
_VLLM_KEYS = ("mean_e2el_ms", "tokenizer_id", "num_prompts", "burstiness", "endpoint_type", "request_goodput")


def _detect(data: Any) -> str | None:
    if isinstance(data, list):
        if data and all(isinstance(r, dict) and ("output_throughput" in r or "max_concurrency" in r) for r in data):
            return "sglang"
    elif isinstance(data, dict):
        if isinstance(data.get("schema"), str) and data["schema"].startswith("knobkeeper.evidence/"):
            return "kernels"
        if isinstance(data.get("benchmarks"), list):
            return "guidellm"
        if (isinstance(data.get("output_token_throughput"), dict) or "aiperf_version" in data
                or (data.get("aggregation_type") == "sweep" and "per_combination_metrics" in data)):
            return "aiperf"
        if "output_throughput" in data or "max_concurrency" in data:
            # both write max_concurrency, output_throughput and (sglang 0.5.23 too) max_concurrent_requests
            if any(k in data for k in _SGLANG_KEYS):
                return "sglang"
            return "vllm" if any(k in data for k in _VLLM_KEYS) else "sglang"
    return None


def detect(path: Path, data: Any) -> str:
    """The format of an already-parsed file, or a UserError naming it."""
    found = _detect(data)
    if found is None:
        raise UserError(f"{path}: unknown result format (accepted: {', '.join(_NAMES.values())}; "
                        f"an aiperf --artifact-dir; or pass --format)")
    return found


def read(path: str | Path, fmt: str = "auto") -> tuple[str, Imported]:
    """(format, Imported) for one file, or for an aiperf artifact directory (all its levels)."""
    path = Path(path)
    if fmt != "auto" and fmt not in READERS:
        raise UserError(f"--format {fmt!r}: expected auto or one of {', '.join(FORMATS)}")
    if path.is_dir():
        if fmt not in ("auto", "aiperf"):
            raise UserError(f"{path}: a directory (only an aiperf --artifact-dir is read as one argument; "
                            f"--format is {fmt})")
        return "aiperf", _name_unrecorded(read_aiperf(path))
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    data = load_json(path)
    if fmt == "auto":
        fmt = detect(path, data)
    else:
        found = _detect(data)
        if found is not None and found != fmt:
            raise UserError(f"{path}: --format {fmt}, but this is a {_NAMES[found]} (pass --format {found} or auto)")
    if fmt != "sglang" and isinstance(data, list):
        if len(data) == 1:
            data = data[0]
        else:
            raise UserError(f"{path}: (top level): {len(data)} JSON lines, but --format {fmt} expects one object")
    imp = READERS[fmt](path, data)
    imp.files = imp.files or [path]
    return fmt, _name_unrecorded(imp)


def _name_unrecorded(imp: Imported) -> Imported:
    """Each run whose file cannot tell its failed requests names the tool that did not record them
    (`not_recorded`, the evidence run's field): `errors` stays None, never a silent 0."""
    for run in imp.runs:
        if run.get("errors_recorded") is False:
            run.setdefault("not_recorded", {})["errors"] = imp.tool
    return imp


def evidence_fields(run: dict) -> dict:
    """A reader's run as an evidence run's fields (knobkeeper.evidence.model.Run): `errors_recorded`
    is said by `not_recorded` there (Run.errors_recorded), so it is not stored twice."""
    return {k: v for k, v in run.items() if k != "errors_recorded"}


def expand(paths: Iterable[str]) -> list[str]:
    """The result files behind `paths`: an aiperf artifact directory becomes its per-level files (each
    a run, kept and copied like any file), everything else is left as given."""
    out: list[str] = []
    for p in paths:
        out += [str(x) for x in aiperf_files(Path(p))] if Path(p).is_dir() else [p]
    return out


def check_arms(baseline: Iterable[str], candidate: Iterable[str], fmt: str = "auto") -> list[str]:
    """Read both arms' files (before anything is written): mixed tool versions within an arm are
    refused; returns the notes of what the files cannot tell (e.g. errors not recorded), once each."""
    notes: list[str] = []
    for option, files in (("--baseline", baseline), ("--candidate", candidate)):
        items = []
        for p in files:
            _, imp = read(p, fmt)
            items.append((p, imp))
            notes += [n for n in imp.notes if n not in notes and n.startswith("errors: not recorded")]
        check_same_tool(items, option)
    return notes
