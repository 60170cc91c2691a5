"""The audit: reverts are hypotheses. Owns revert status (status: derived from incidents' notes and
resolutions, never stored), what reverts gave up and can be reclaimed plus the audit around the
revert and restore commands (reclaim), the timeline (history), and incident snapshots (snapshot:
the stack's gauges recorded in an incident).

May import: knobkeeper.evidence.store (the one evidence reader), knobkeeper.evidence.metrics (the
engines' gauges, for snapshots), knobkeeper.deploy.record (the deploy records), knobkeeper.deploy.stack,
knobkeeper.changelog, knobkeeper.knobs, and the shared fmt/project/errors/timeutil modules. Never the
CLI, review or report (they import this).
"""

from knobkeeper.audit.history import (CANDIDATE_WARNING, Candidate, Event, OpenIncident, Timeline, deploy_events,
                                      deploy_records, duration, format_timeline, incident_events, timeline, window)
from knobkeeper.audit.reclaim import (STALE_DAYS, EvidenceView, Reclaim, ReclaimReport,
                                      current_engine_version, evidence_gains, format_reclaimable, gains_text,
                                      load_evidence, reclaimable, restore, restore_guard, revert, view_evidence)
from knobkeeper.audit.status import STATUSES, RevertStatus, revert_status, revert_statuses, reverts_by_incident

__all__ = [
    "CANDIDATE_WARNING", "Candidate", "Event", "EvidenceView", "OpenIncident", "Reclaim",
    "ReclaimReport", "RevertStatus", "STALE_DAYS", "STATUSES", "Timeline", "current_engine_version",
    "deploy_events", "deploy_records", "duration", "evidence_gains", "format_reclaimable", "format_timeline",
    "gains_text", "incident_events", "load_evidence", "reclaimable", "restore",
    "restore_guard", "revert", "revert_status", "revert_statuses", "reverts_by_incident", "timeline",
    "view_evidence", "window",
]
