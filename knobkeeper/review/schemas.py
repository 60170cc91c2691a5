"""The JSON Schemas of the records knobkeeper writes, each made from the record's one declaration
(knobkeeper/declared.py): the same declaration the tool validates with, so the documented schema
cannot drift from the checked one. docs/schemas/<name>.json holds them for readers and other tools;
the suite checks that those files are what the declarations give today.

    knobkeeper schema evidence > evidence.json     (or deploy-record, canary-marker, experiment-marker, sweep-plan)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from knobkeeper.declared import json_schema
from knobkeeper.deploy.canary_state import CanaryMarker
from knobkeeper.deploy.experiment_state import ExperimentMarker
from knobkeeper.deploy.record import DeployRecord
from knobkeeper.errors import UserError
from knobkeeper.evidence.model import SweepPlan
from knobkeeper.evidence.schema import evidence_schema

# name -> (where the tool writes it, how its schema is made)
RECORDS = {
    "evidence": ("changelog/evidence/<stamp>-<id>.json", evidence_schema),
    "deploy-record": ("changelog/deploys/<stamp>-<id>.json",
                      lambda: json_schema(DeployRecord, "knobkeeper deploy record")),
    "canary-marker": (".git/knobkeeper/canary.json", lambda: json_schema(CanaryMarker, "knobkeeper canary marker")),
    "experiment-marker": (".git/knobkeeper/experiment.json",
                          lambda: json_schema(ExperimentMarker, "knobkeeper ab run / sweep marker")),
    "sweep-plan": ("changelog/plans/<stamp>-<id>.json", lambda: json_schema(SweepPlan, "knobkeeper sweep plan")),
}


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of record `name` (UserError naming the accepted names)."""
    if name not in RECORDS:
        raise UserError(f"schema {name}: not a record knobkeeper writes (one of {', '.join(RECORDS)})")
    where, make = RECORDS[name]
    return {**make(), "description": f"knobkeeper writes it as {where}"}


def schema_text(name: str) -> str:
    return json.dumps(schema_of(name), indent=2) + "\n"


def stale_files(folder: Path) -> list[str]:
    """The names whose docs/schemas/<name>.json is missing or not what the declaration gives."""
    return [name for name in RECORDS
            if not (folder / f"{name}.json").is_file() or (folder / f"{name}.json").read_text() != schema_text(name)]


def write_files(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in RECORDS:
        path = folder / f"{name}.json"
        path.write_text(schema_text(name))
        written.append(path)
    return written
