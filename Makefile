# `make test` and `make demo` each set up .venv from pyproject.toml when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
RANKS ?= 4
STAMP := $(VENV)/.ringcc-installed
export OPENBLAS_NUM_THREADS := 1

.PHONY: test demo bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[mpich,test,train,bench]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(MPIEXEC) -n $(RANKS) $(PY) -m collectives.demo

clean:
	rm -rf $(VENV) bench-results .pytest_cache .hypothesis
