# Two entry points that work on a fresh machine with only Python:
#   make demo   set up .venv, then run SparseDitto on a bundled example (expert policy; Triton
#               interpreter on a CPU-only machine)
#   make test   set up .venv, then run the test suite (GPU tests skip without a GPU)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# CPU-only machines take the CPU build of torch first so the multi-GB CUDA build is never pulled.
TORCH_CPU ?= torch==2.13.0
TRITON ?= triton==3.6.0

.PHONY: setup demo test test-gpu bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU found: installing the default torch build"; \
	else \
		echo "No GPU: installing the CPU build of torch ($(TORCH_CPU))"; \
		$(BIN)/python -m pip install -q "$(TORCH_CPU)"; \
	fi
	$(BIN)/python -m pip install -q "$(TRITON)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

demo: setup
	$(BIN)/sparseditto demo

test: setup
	$(BIN)/python -m pytest -q

test-gpu: setup
	$(BIN)/python -m pytest -q -m gpu

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
