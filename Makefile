# dracpu developer entry points. Every target creates .venv when it is missing (`make .venv`
# does only that).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: .venv demo test lint proto proto-check fixtures-check bench clean docs-check chaos

# A venv built by another Python than $(PYTHON) (another version or installation), or one
# whose interpreter no longer runs, is removed before any rule looks at it, so the stamp rule
# below builds it again instead of failing the same way on every run.
# (`make -n` only says so.)
PY_ID := import sys; print(sys.version.split()[0], sys.base_prefix)
DRY_RUN := $(findstring n,$(firstword -$(MAKEFLAGS)))
ifneq ($(wildcard $(BIN)/python),)
WANT_ID := $(shell $(PYTHON) -c '$(PY_ID)' 2>/dev/null)
ifneq ($(WANT_ID),)
ifneq ($(shell $(BIN)/python -c '$(PY_ID)' 2>/dev/null),$(WANT_ID))
$(info $(VENV) was not built by $(PYTHON) ($(WANT_ID)): building it again)
ifeq ($(DRY_RUN),)
$(shell rm -rf $(VENV))
endif
endif
endif
endif

.venv: $(STAMP)

$(STAMP): pyproject.toml sim/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "dracpu needs Python 3.11 or newer; $(PYTHON) is" \
	    "$$($(PYTHON) -V 2>/dev/null || echo 'not found')." \
	    "Run make PYTHON=python3.11 (or newer) $(MAKECMDGOALS)" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# Through the resolved path: scripts pip writes name their interpreter in their first
	@# line, which must not be a symlinked view of the checkout (the docs tests use one).
	"$$(cd $(BIN) && pwd -P)/python" -m pip install -q --upgrade pip
	@# The daemon with its test tools, and the simulated node (its own distribution, sim/).
	"$$(cd $(BIN) && pwd -P)/python" -m pip install -q -e '.[test]' -e ./sim
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/dracpu demo

test: $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check src sim/src tests bench
	$(BIN)/ruff format --check src sim/src tests bench
	$(BIN)/mypy

proto: $(STAMP)
	$(BIN)/python tools/gen_proto.py

proto-check: $(STAMP)
	$(BIN)/python tools/gen_proto.py --check

# The sysfs trees under tests/fake_sysfs/ against a fresh run of tools/gen_fake_sysfs.py
# (written to a temp dir); exit 1 on any drift. See tests/fake_sysfs/README.md.
fixtures-check: $(STAMP)
	$(BIN)/python tools/gen_fake_sysfs.py --check

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist src/*.egg-info sim/src/*.egg-info .pytest_cache .mypy_cache .ruff_cache

# Every command and example in docs/ (tests/docs; see docs/development.md).
docs-check: $(STAMP)
	$(BIN)/python -m pytest tests/docs -q

# Seeded chaos run of the real daemon on the simulated node (grouped, then individual mode);
# prints faults_injected, invariant_violations and settle_ms. The short run is in tests/chaos.
SEED     ?= 1
DURATION ?= 300
chaos: $(STAMP)
	$(BIN)/python -m dracpu_sim.chaos --seed $(SEED) --duration $(DURATION)

# dracpu end to end on a kind cluster: create it from deploy/kind/kind-$(K8S_VERSION).yaml
# (NRI, CDI, the DRA feature gates), build and load the image, `kubectl apply -k`, run every
# docs/examples file and check each container's cpuset, delete the cluster. Needs docker,
# kind and kubectl (docs/installation.md#trying-it-on-kind); K8S_VERSION is 1.34, 1.35 or
# 1.36.
K8S_VERSION ?= 1.34
.PHONY: kind-e2e
kind-e2e:
	K8S_VERSION=$(K8S_VERSION) deploy/kind/e2e.sh
