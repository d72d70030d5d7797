# `make test` and `make demo` each set up .venv from pyproject.toml when it is missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
RANKS ?= 4
STAMP := $(VENV)/.ringcc-installed
# PyTorch, for the torch tests and the Gloo and DDP peers of `make bench`; any CPU build will do.
TORCH ?= torch==2.13.0
export OPENBLAS_NUM_THREADS := 1

.PHONY: test demo bench explain clean torch

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[mpich,test,train,bench]"
	touch $(STAMP)

# PyTorch is optional: where it cannot be installed, its tests skip and say why.
torch: $(STAMP)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)" \
		|| echo "PyTorch could not be installed: the torch tests and peers are skipped"

test: $(STAMP) torch
	$(PY) -m pytest -q

demo: $(STAMP)
	$(MPIEXEC) -n $(RANKS) $(PY) -m trainer

bench: $(STAMP) torch
	$(PY) -m benchmarks.sweep --mpiexec $(MPIEXEC) --out bench-results

explain: $(STAMP)
	$(PY) -m collectives.explain all_reduce --ranks 4 --count 8

clean:
	rm -rf $(VENV) bench-results .pytest_cache .hypothesis
