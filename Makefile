# The commands of the README. Each creates .venv when missing and installs hamq into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint browser pipeline clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hamq dev

test: lint browser
	$(BIN)/python -m pytest -q --durations=40

# The console tests drive Debian's chromium through Playwright (a browser Playwright downloads
# itself cannot run here); installed once, as root, when missing.
browser:
	test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive \
		apt-get install -y -q chromium chromium-driver)

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
