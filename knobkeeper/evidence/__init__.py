"""Evidence: what a knob change measurably does, judged so that it cannot fool us.

Owns: the evidence file as one typed model (model.py: Evidence, Arm, Setup, Run, Level, Guard,
Judgement, Validity and the rest, read from and written to JSON there only; `Setup.build` is the
one setup every producer fills; the model answers is_adjusted, the p a verdict rests on, one text
per level, whether it backs a change; the schema is that declaration: knobkeeper/declared.py makes
its validation and JSON Schema from it, schema.py says what the fields mean), the only reader
and writer of changelog/evidence/ (store.py: `find`, `load`, `list_all`, `summary_line`, `gains`,
`verify`, `import_files`), the family-wise judgement (judge.py: Welch t on log throughput, Holm
over every level x judged metric, guard metrics, the sequential design; it returns a Judgement),
the validity gates (validity.py), importers of the benchmark tools people already use
(importers/, one module per tool), `ab run` through the deploy (ab.py: `measure(harness, design)`, `ab_run`), the
canary (canary.py: `canary` the one call, `run` and `measure` beneath it, `Options`), the
defaults of both, which the CLI shows (defaults.py, importing nothing), the engines' own metrics
(metrics.py), plots (plot.py).

May import: knobkeeper.deploy (ab.py and canary.py switch arms through the deploy API), changelog,
knobs, loadgen, fmt, gitio, errors. Not review, audit, report or cli, which read evidence through
store and the model's attributes.
"""
