"""The changelog part: the audit trail under changelog/ and the only code that writes it.

Owns: entries (one TOML per knob change) and their order in history (order.py), incidents,
the write path (store.py: the repo lock, the journal, exactly one git commit per change), the
knob changes set/unset/revert/restore/record (ops.py), the secret store outside git
(secrets.py), and the read-side views commands print (queries.py).

May import: knobkeeper.knobs (catalog, declared state), knobkeeper.project, gitio, fmt,
timeutil, tomlio, errors. Never anything above it (evidence, deploy, audit, review, report,
cli): those call into it.
"""
