# Quick start: `make demo` and `make test` each set up .venv on first use.
# .venv is made with Python 3.12 where the machine has one (on PATH, or in pyenv's versions,
# whose shim fails where no 3.12 is selected), else with python3 (3.11). PyMC 6 needs 3.12:
# there the `pymc` extra brings PyMC and PyTensor 3.3 and `make test` runs tests/test_pymc.py;
# on 3.11 the extra installs nothing and the file skips (PyTensor 3.0).
PYTHON312 := $(firstword $(foreach p,python3.12 $(wildcard $(HOME)/.pyenv/versions/3.12*/bin/python3.12),\
	$(shell $(p) -c 'import sys; print(sys.executable)' 2>/dev/null)))
PYTHON ?= $(or $(PYTHON312),python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test test-fast demo docs bench lint clean

# A .venv of another Python version than PYTHON's (one made before 3.12 was there) is made anew.
$(STAMP): pyproject.toml
	v='import sys; print(sys.version_info[:2])'; \
	  test -x $(PY) && test "$$($(PY) -c "$$v")" = "$$($(PYTHON) -c "$$v")" \
	  || $(PYTHON) -m venv --clear $(VENV)
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
