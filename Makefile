# Quick start: `make demo` and `make test` each set up .venv on first use.
PYTHON ?= python3
# PyMC 6 needs Python 3.12: where the machine has one (on PATH, or in pyenv's versions,
# whose shim fails where no 3.12 is selected), `make test` also runs tests/test_pymc.py in
# .venv-pymc, on it. The main environment stays on PYTHON: on PyTensor 3.3 (which PyMC 6
# needs) Lasagne's gradient clipping in a scan fails its tests.
PYMC_PYTHON ?= $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; print(sys.executable)' 2>/dev/null)))
PYMC_VENV := .venv-pymc
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast test-pymc demo docs bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,docs,demo,lint]"
	touch $(STAMP)

$(PYMC_VENV)/.installed: pyproject.toml
	test -x $(PYMC_VENV)/bin/python || $(PYMC_PYTHON) -m venv $(PYMC_VENV)
	$(PYMC_VENV)/bin/python -m pip install -q --upgrade pip
	$(PYMC_VENV)/bin/python -m pip install -q -e ".[test,pymc]"
	touch $@

test: lint
	$(PY) -m synkhronos check
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile --doctest-modules tests synkhronos
	$(if $(PYMC_PYTHON),$(MAKE) test-pymc,@echo "no Python 3.12 here: tests/test_pymc.py skipped")

# The PyMC extension's tests, on Python 3.12 with PyMC 6 (and PyTensor 3.3).
test-pymc: $(PYMC_VENV)/.installed
	$(PYMC_VENV)/bin/python -m pytest -q -p no:xdist tests/test_pymc.py

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
	rm -rf $(VENV) $(PYMC_VENV) docs/_build .pytest_cache
