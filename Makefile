# Two entry points that work on a fresh machine with only Python:
#   make demo   set up .venv, then run SparseDitto on a bundled example (expert policy; Triton
#               interpreter on a CPU-only machine)
#   make test   set up .venv, then run the test suite (GPU tests skip without a GPU) in one pytest
#               process per core (pytest-xdist; TEST_WORKERS=0 runs it in one process); each test
#               file stays in one process, so its module fixtures (the `langgraph dev` server) start once
# `make setup` runs scripts/install.py: the CPU build of torch where there is no NVIDIA GPU (from
# PyTorch's CPU index, or the default index when that one cannot be reached), the CUDA build and the
# matching CuPy extra (gpu-cuda12 / gpu for CUDA 13) where there is one. One line per step; pip's
# output goes to .venv/install.log.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= 2.13.0
TRITON ?= 3.6.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
EXTRAS ?= dev
# one test process per CPU (logical: CI's 2 vCPUs may be one physical core), at most 8
TEST_WORKERS ?= $(shell $(PY) -c "import os; print(min(os.cpu_count() or 1, 8))")

.PHONY: setup demo test test-gpu clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/install.py
	@$(PY) -m venv $(VENV)
	@$(BIN)/python scripts/install.py --torch $(TORCH) --triton $(TRITON) --cpu-index $(TORCH_CPU_INDEX) --extras $(EXTRAS)
	@touch $@

demo: setup
	@$(BIN)/sparseditto demo

test: setup
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
