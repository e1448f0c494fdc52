# The commands of the README. Each creates .venv when missing and installs hamq into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test pipeline clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev,spark]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/hamq dev

test: $(STAMP)
	$(BIN)/python -m pytest -q

# The Spark example (examples/pipeline): a throwaway hamq dev cluster, orders in,
# per-minute aggregates out to Parquet and to the topic order-aggregates.
pipeline: $(STAMP)
	$(BIN)/python examples/pipeline/run.py

clean:
	rm -rf $(VENV) .hamq-dev .pytest_cache
