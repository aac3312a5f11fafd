# dracpu developer entry points. Every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint proto proto-check bench clean docs-check chaos

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dracpu demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

proto-check: $(STAMP)
	$(BIN)/python tools/gen_proto.py --check

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# Every command and example in docs/ (tests/docs; see docs/development.md).
docs-check: $(STAMP)
	$(BIN)/python -m pytest tests/docs -q

# Seeded chaos run of the real daemon on the simulated node (grouped, then individual mode);
# prints faults_injected, invariant_violations and settle_ms. The short run is in tests/chaos.
SEED     ?= 1
DURATION ?= 300
chaos: $(STAMP)
	$(BIN)/python -m dracpu.sim.chaos --seed $(SEED) --duration $(DURATION)
