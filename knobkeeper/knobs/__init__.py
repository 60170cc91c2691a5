"""The knobs part: what may be set and what is declared.

Owns: the catalog (catalog.py: knob names, types, bounds, roles, risk; value parsing and
validation; fingerprints of secrets) and the declared state (state.py: inventory/knobs.toml,
read and edited with its comments kept); the engine registries live here too.

May import: knobkeeper.fmt, tomlio, errors. Nothing else of knobkeeper: it is the bottom layer,
which every other part asks.
"""
