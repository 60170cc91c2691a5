"""Evidence: what a knob change measurably does, judged so that it cannot fool us.

Owns: the evidence file (schema.py, schema 2: per arm, level and repeat; the judgement; validity;
the sequential looks), the only reader and writer of changelog/evidence/ (store.py: `find`,
`load`, `list_all`, `gains`, `summary_line`, `verify`, `import_files`), the family-wise judgement
(judge.py: Welch t on log throughput, Holm over every level x judged metric, guard metrics, the
sequential design), the validity gates (validity.py), importers of the benchmark tools people
already use (importers.py), `ab run` through the deploy (ab.py), plots (plot.py).

May import: knobkeeper.deploy (ab.py switches arms through the deploy API), changelog, knobs,
loadgen, fmt, gitio, errors. Not review, audit, report or cli, which read evidence through store.
"""
