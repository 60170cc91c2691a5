# knobkeeper — `make test` from a fresh clone creates .venv, installs everything, runs the suite.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test demo stop bench system-deps clean

# Debian tools the tests run for real: shellcheck and systemd-analyze lint rendered files,
# openssh-server hosts the emulated fleet. Needs root (CI runs as root).
system-deps:
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends shellcheck systemd openssh-server

$(STAMP): pyproject.toml kernels/pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	# The CPU torch wheel first: a loose torch requirement would pull a multi-GB CUDA build.
	$(PY) -m pip install torch==2.13.0
	$(PY) -m pip install -e '.[test,bench]' -e ./kernels
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m knobkeeper.demo

stop: $(STAMP)
	$(PY) -m knobkeeper.demo --stop

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .knobkeeper-state
