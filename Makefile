# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and installs what it needs.

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test test-all bench check-java clean

check-java:
	@sh scripts/check_java.sh

$(VENV)/bin/python:
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "error: $(PYTHON) not found; beam_ext needs Python 3.11" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

# Stamps re-run the install whenever setup.py changes.
$(VENV)/.installed: setup.py | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	@touch $@

$(VENV)/.installed-test: setup.py | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[test,bench]'
	@touch $@ $(VENV)/.installed

demo: check-java $(VENV)/.installed
	$(PY) examples/payments_features.py

# Two pytest workers, each with its own local[2] SparkSession, a test file
# each at a time: one worker alone leaves a third of two cores idle, as
# small Spark jobs wait on their Python workers and on py4j.
PYTEST_WORKERS := -n 2 --dist loadfile

test: check-java $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_WORKERS)

# Everything, including the Beam suites' long tails that pytest.ini deselects
# (slow_streaming, slow_portable, slow_dataframe): several times the time of `make test`.
test-all: check-java $(VENV)/.installed-test
	$(PY) -m ruff check .
	$(PY) -m pytest $(PYTEST_WORKERS) -o addopts="-ra -p no:cacheprovider"

bench: check-java $(VENV)/.installed-test
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache out
