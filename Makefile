# The commands of the README. Each creates .venv when missing and installs hamq into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint browser chaos-deps chaos pipeline clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hamq dev

# Two workers (pytest-xdist): the suite mostly waits on real processes, so two halves fit
# the CI budget; tests/conftest.py keeps each module (and tests/web, tests/spark) on one worker.
test: lint browser chaos-deps
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=40

# The console tests drive Debian's chromium through Playwright (a browser Playwright downloads
# itself cannot run here); installed once, as root, when missing.
browser:
	test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q chromium chromium-driver)

# The chaos suite's clock nemesis steps a server's wall clock with libfaketime (LD_PRELOAD);
# installed once, as root, when missing.
chaos-deps:
	test -e /usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1 || (apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q faketime)

# The long chaos matrix: every mode x nemesis (about 40 s a run); regenerates
# docs/RELIABILITY.md. Longer: make chaos CHAOS_REPEAT=3 CHAOS_DURATION=60
CHAOS_REPEAT ?= 1
CHAOS_DURATION ?= 15
chaos: $(STAMP) chaos-deps
	$(BIN)/hamq chaos matrix --repeat $(CHAOS_REPEAT) --duration $(CHAOS_DURATION) \
		--out docs/RELIABILITY.md

# Lint, format and types as pyproject.toml configures them; make test runs this first,
# so CI fails on a finding before it spends minutes on the suite.
lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy

# The Spark example (examples/pipeline): a throwaway hamq dev cluster, orders in,
# per-minute aggregates out to Parquet and to the topic order-aggregates.
pipeline: $(STAMP)
	$(BIN)/python examples/pipeline/run.py

clean:
	rm -rf $(VENV) .hamq-dev .pytest_cache .ruff_cache .mypy_cache
