"""Median whole-process time of `reclaimable` and `timeline` on a repo with 10,000 entries,
500 incidents (each with a revert made for it; most resolved, with notes), 50 evidence files
and 200 deploy records.

Target: under 1 s each. The first run after a change fills the entries and incidents caches
(.git/knobkeeper/entries.json, incidents.json); it is timed apart as the cold figure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import common  # noqa: F401  (puts the repo root on sys.path)

from knobkeeper.changelog.entries import Entry, entry_path, replay
from knobkeeper.changelog.incidents import Incident, Note, Resolution, incident_path
from knobkeeper.knobs.state import load_document, with_value
from knobkeeper.timeutil import file_stem, iso, new_id, utcnow
from tests.infra import make_infra_repo

ENTRIES = 10_000
INCIDENTS = 500
EVIDENCE = 50
DEPLOYS = 200
AUTHOR = "Bench <bench@example.com>"
KNOBS = [
    ("SGLANG_SM120_MMA_TARGET_CTAS", "decode", [128, 256, 512, 1024]),
    ("NCCL_DEBUG", "prefill", ["INFO", "WARN"]),
    ("SGLANG_DISAGGREGATION_QUEUE_SIZE", "decode", [4, 8, 16]),
    ("KNOBKEEPER_SPLITKV_TARGET_CTAS", "decode", [256, 512]),
]


def evidence_doc(ident: str, created, knob: str, role: str, value) -> dict:
    from knobkeeper.evidence.schema import SCHEMA

    levels = [(64, 0.128, 0.101, 0.154, 0.0004, "better"), (96, 0.057, 0.031, 0.084, 0.002, "better")]
    runs = [{"arm": arm, "repeat": r, "concurrency": c, "output_tokens_per_s": 1000.0 * (1 + (e if arm == "B" else 0)),
             "errors": 0} for c, e, *_ in levels for arm in "AB" for r in (1, 2, 3)]
    return {"schema": SCHEMA, "id": ident, "created": iso(created), "knob": knob, "role": role,
            "metric": "output_tokens_per_s",
            "arms": {"A": {"label": "baseline", "knobs": {knob: None}}, "B": {"label": "candidate", "knobs": {knob: value}}},
            "setup": {"engine": "sglang", "engine_version": "0.5.5"}, "runs": runs,
            "judgement": {"method": "welch-log", "alpha": 0.05,
                          "levels": [{"concurrency": c, "effect": e, "ci_low": lo, "ci_high": hi, "p_value": p,
                                      "verdict": v} for c, e, lo, hi, p, v in levels]},
            "anomalies": [], "source": {"tool": "bench", "raw_files": [], "format": None}}


def build(project) -> tuple[int, int]:
    now = utcnow()
    start = now - timedelta(days=90)
    step = timedelta(days=89) / ENTRIES
    evidence_ids = []
    for i in range(EVIDENCE):
        ident = new_id()
        knob, role, values = KNOBS[i % len(KNOBS)]
        created = start + timedelta(days=i)
        (project.evidence_dir / f"{file_stem(created, ident)}.json").write_text(
            json.dumps(evidence_doc(ident, created, knob, role, values[-1])))
        evidence_ids.append(ident)
    entries: list[Entry] = []
    last: dict[tuple[str, str], Entry] = {}
    incidents: list[Incident] = []
    every = ENTRIES // INCIDENTS  # one incident + one revert every 20 entries
    for i in range(ENTRIES):
        knob, role, values = KNOBS[i % len(KNOBS)]
        moment = start + step * i
        prev = last.get((role, knob))
        if i % every == every - 1 and prev is not None and prev.action != "revert":
            began = moment - timedelta(minutes=10)
            inc = Incident(id=new_id(), title=f"incident {len(incidents)}", opened=iso(began + timedelta(minutes=2)),
                           started=iso(began), opened_by=AUTHOR)
            entry = Entry(id=new_id(), time=iso(moment), author=AUTHOR, action="revert", knob=knob, role=role,
                          reason="suspect", old=prev.new, new=prev.old, reverts=prev.id, incident=inc.id,
                          hypothesis="the symptom stops")
            n = len(incidents)
            if n < INCIDENTS - 5:  # the last five stay open
                inc.notes.append(Note(time=iso(moment + timedelta(minutes=5)), author=AUTHOR,
                                      text="symptom persisted after the revert" if n % 3 else "symptom stopped",
                                      refutes=entry.id if n % 3 else None, confirms=None if n % 3 else entry.id))
                inc.resolution = Resolution(time=iso(moment + timedelta(minutes=30)), author=AUTHOR,
                                            root_cause="elsewhere" if n % 3 else "the knob",
                                            implicates=[] if n % 3 else [entry.id])
            incidents.append(inc)
        else:
            value = values[(i // len(KNOBS)) % len(values)]
            old = prev.new if prev else None
            if old == value:
                value = values[((i // len(KNOBS)) + 1) % len(values)]
            # 1 set in 10 has evidence, and every set near the end: the latest reverts give something up.
            evidence = [evidence_ids[(i // 10) % EVIDENCE]] if i % 10 == 0 or i > ENTRIES - 400 else []
            entry = Entry(id=new_id(), time=iso(moment), author=AUTHOR, action="set", knob=knob, role=role,
                          reason=f"bench change {i}", old=old, new=value, evidence=evidence)
        entries.append(entry)
        last[(role, knob)] = entry
    for entry in entries:
        entry_path(project, entry).write_text(entry.to_toml())
    for inc in incidents:
        incident_path(project, inc).write_text(inc.to_toml())
    for i in range(DEPLOYS):
        moment = start + timedelta(days=89) * i / DEPLOYS
        ident = new_id()
        services = [{"host": f"gpu-{h}", "role": role, "service": f"sglang-{role}", "action": "restarted",
                     "restart_issued_at": iso(moment + timedelta(seconds=10 * k)),
                     "healthy_at": iso(moment + timedelta(seconds=10 * k + 8)), "gate": {"result": "passed"}}
                    for k, (h, role) in enumerate([(1, "prefill"), (2, "prefill"), (1, "decode"), (2, "decode")])]
        (project.deploys_dir / f"{file_stem(moment, ident)}.json").write_text(json.dumps(
            {"id": ident, "inventory": "inventory/prod.py", "inventory_path": "inventory/prod.py", "commit": "a" * 40,
             "dirty": False, "allow_dirty": False, "options": {}, "order": ["prefill", "decode", "router"],
             "started_at": iso(moment), "finished_at": iso(moment + timedelta(seconds=40)), "result": "ok",
             "error": None, "services": services}, indent=2))
    doc = load_document(project.knobs_path)
    text = project.knobs_path.read_text()
    for role, table in replay(entries).items():
        for knob, value in table.items():
            text = with_value(doc, role, knob, value)
    project.knobs_path.write_text(text)
    subprocess.run(["git", "-C", str(project.root), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(project.root), "commit", "-qm", "bench data"], check=True)
    return len(entries), len(incidents)


def time_cpu(cmd: list[str], repeats: int = 7) -> tuple[float, float]:
    """Median wall and median CPU (user+sys) seconds of a whole process; CPU time is what a
    loaded machine (other test runs on the same cores) distorts least."""
    import resource
    import statistics

    subprocess.run(cmd, capture_output=True, check=True)
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="kk-bench-audit-"))
    try:
        project = make_infra_repo(tmp)
        n_entries, n_incidents = build(project)
        kk = [str(Path(sys.executable).parent / "knobkeeper")]
        repo = ["--repo", str(project.root)]
        middle = iso(utcnow() - timedelta(days=45))
        start = time.perf_counter()
        done = subprocess.run([*kk, "reclaimable", *repo], capture_output=True, text=True, check=True)
        cold = time.perf_counter() - start
        listed = done.stdout.count("\n   restore ")
        print(f"entries: {n_entries}, incidents: {n_incidents}, evidence: {EVIDENCE}, deploys: {DEPLOYS}  "
              f"(cold `reclaimable`, filling the caches: {cold:.3f} s; it lists {listed} knobs)")
        failed = False
        # `knobs` reads the same 10,000 entries and nothing else: the floor under these commands.
        for name, args in (("knobs (reference)", ["knobs"]), ("reclaimable", ["reclaimable"]), ("reclaimable --json", ["reclaimable", "--json"]),
                           ("timeline (7 days)", ["timeline"]),
                           ("timeline --around", ["timeline", "--around", middle, "--window", "1d"]),
                           ("timeline --json", ["timeline", "--json"])):
            median, cpu = time_cpu([*kk, *args, *repo])
            verdict = "OK" if median < 1.0 else "OVER TARGET"
            failed |= median >= 1.0 and "reference" not in name
            print(f"{name:>20}: median {median:.3f} s wall, {cpu:.3f} s CPU over 7 runs  [{verdict}, target < 1 s]")
        if failed:
            sys.exit(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
