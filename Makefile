# `make demo`: set up and tune the bundled image pipeline. `make test`: set up, lint, type-check,
# build the docs, test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint docs bench bench-compare bench-quick clean

PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

$(STAMP): pyproject.toml requirements/dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) -r requirements/dev.txt -e '.[dev]'
	touch $(STAMP)

# For the tests only: the trainers and data libraries the integration tests run against, beside
# the torch pin (requirements/libraries.txt says why two go in without their dependencies).
EXTRAS := $(VENV)/.installed-extras
$(EXTRAS): $(STAMP) requirements/trainers.txt requirements/libraries.txt
	$(PIP) -c requirements/dev.txt -r requirements/trainers.txt -r requirements/libraries.txt
	$(PIP) --no-deps -c requirements/dev.txt litdata==0.2.76 mosaicml-streaming==0.13.0
	touch $(EXTRAS)

demo: $(STAMP)
	mkdir -p demo
	$(BIN)/feedrate tune examples/images.py:loader --plot demo/images.png --html demo/images.html --json demo/images.json

lint: $(STAMP)
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks
	$(BIN)/mypy

# The user guide (docs/, mkdocs.yml), built with warnings as errors: a broken link or a
# docstring the API pages cannot read fails the tests. Not --quiet: with it, mkdocs 1.6's
# --strict no longer counts warnings (a link to a missing page or anchor passed); its output
# is shown only when the build fails.
docs: $(STAMP)
	@out=$$(NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict 2>&1) || { echo "$$out"; exit 1; }

test: lint docs $(EXTRAS)
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

# feedrate against the grid, the folklore rules and the other tuners (their own environment,
# .venv-peers, is made on first use): `make bench-quick` in about 10 minutes, `bench-compare` in hours.
bench-quick: $(STAMP)
	$(BIN)/python benchmarks/compare.py --quick

bench-compare: $(STAMP)
	$(BIN)/python benchmarks/compare.py

clean:
	rm -rf $(VENV) .venv-peers .mypy_cache .ruff_cache .pytest_cache
