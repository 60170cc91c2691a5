# knobkeeper — `make test` from a fresh clone creates .venv, installs everything, runs the suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test test-real test-under-load demo stop bench system-deps clean docs-screenshot

# The Debian packages of system-packages.txt that are missing (root: installs them; otherwise one
# line naming the command). `make test` runs it first, so a new machine needs nothing else.
system-deps:
	bash scripts/system-deps.sh

$(STAMP): pyproject.toml kernels/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# The CPU torch wheel first: a loose torch requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test,bench]' -e ./kernels
	touch $(STAMP)

test: system-deps $(STAMP)
	# scripts/test.sh: the real engine's environments and the tiny model install in the background
	# (cold ~3 min once per machine, lines in .knobkeeper-state/engine-install.log) while the engines'
	# flag parsers build (side environments under ~/.cache/knobkeeper/, cold ~3 min); then the suite in
	# two halves at once: the tests that need the engine or its real stack, and the rest. Each prints
	# its slowest tests: the CI budget is 30 minutes, and this is where it goes.
	bash scripts/test.sh

# The real engine's modules alone (part of `make test`): the PD stack deployed and gated, chat through
# the router, KV over the connector, the metrics, one decided ab run and the field story (~12 min here).
test-real: system-deps $(STAMP)
	$(PY) -m pytest -q --durations=10 tests/test_real_stack.py tests/test_real_evidence.py

# The suite 3 times in a row with one core kept busy (tests must not need a quiet machine).
test-under-load: system-deps $(STAMP)
	bash scripts/test-under-load.sh

# make demo TARGET=slurm: the same stack as one job on a real local Slurm cluster (knobkeeper/demo_slurm.py).
# make demo ENGINE=vllm: the real stack (inventory/local_vllm.py: vLLM's CPU build, vllm-router, the tiny
# model as a stand-in for yours); the engine installs into ~/.cache/knobkeeper/engines once (minutes).
demo: $(STAMP)
ifeq ($(TARGET),slurm)
	$(PY) -m knobkeeper.demo_slurm
else
	$(PY) -m knobkeeper.demo $(if $(PROMETHEUS),--prometheus) $(if $(ENGINE),--engine $(ENGINE))
endif

stop: $(STAMP)
	$(PY) -m knobkeeper.demo --stop
	$(PY) -m knobkeeper.demo_slurm --stop

bench: $(STAMP)
	$(PY) bench/run_all.py

# docs/report.png (the README's screenshot): the report of the field story, in headless Chromium.
docs-screenshot: system-deps $(STAMP)
	$(PY) -m tests.fieldstory --screenshot docs/report.png

clean:
	rm -rf $(VENV) .knobkeeper-state

# The kernels' GPU check (kernels/knobkeeper_kernels/gpu_check.py): the machine's own python3, no
# venv and no install (a lent GPU runs it bare). Files go to $OUT if set, else bench/out/gpu;
# without CUDA it says so in one line and exits 0. GPU_CHECK_ARGS="--budget-s 300" etc.
.PHONY: gpu-check
gpu-check:
	python3 kernels/gpu_check.py --out $${OUT:-bench/out/gpu} $(GPU_CHECK_ARGS)
