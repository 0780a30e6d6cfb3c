# Quick start: `make demo` and `make test` each set up .venv on first use.
# Python 3.12 where the machine has one (PyMC 6 needs it: the pymc extra and its tests), on
# PATH or in pyenv's versions (its shim fails where no 3.12 is selected), else python3.
PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; print(sys.executable)' 2>/dev/null)) python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast demo docs bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,docs,demo,lint,pymc]"
	touch $(STAMP)

test: lint
	$(PY) -m synkhronos check
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --doctest-modules tests synkhronos

# What a change usually needs: the tests not marked slow (pyproject.toml's markers).
test-fast: lint
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile -m "not slow" tests

demo: $(STAMP)
	$(PY) demos/mnist.py

docs: $(STAMP)
	$(PY) -m sphinx -W -q -b html docs docs/_build/html

bench: $(STAMP)
	$(PY) bench/run.py

lint: $(STAMP)
	$(PY) -m ruff check synkhronos tests demos bench
	$(PY) -m ruff format --check synkhronos tests demos bench
	$(PY) -m mypy

clean:
	rm -rf $(VENV) docs/_build .pytest_cache
