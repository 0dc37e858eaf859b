# Set-up and entry points. `make demo` and `make test` are the two commands a fresh machine needs.
#
# The virtual environment gets the CPU build torch==2.13.0 unless it can already import a
# torch (for example a CUDA build, with VENV_FLAGS=--system-site-packages), which is kept.

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_PIN ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rcswarm-installed
DEV_STAMP := $(VENV)/.rcswarm-dev-installed

.PHONY: install install-dev demo test test-all bench protos clean

# The user's install: rcswarm and its run-time dependencies (no test tools, no triton).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=70.1"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

# The developer's install: the test tools and triton (its kernels are tested under the interpreter).
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

demo: install
	$(VENV)/bin/rcswarm run $(RUN)

# The default suite (slow-marked multi-process tests included): what CI runs.
test: install-dev
	$(PY) -m pytest -q

# The default suite plus the wide one (tests marked `wide`: longer scenarios).
test-all: install-dev
	$(PY) -m pytest -q --wide

bench: install-dev
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	$(PY) benchmarks/sync_bench.py

protos: install-dev
	$(PY) -m rcswarm.protos.generate

clean:
	rm -rf $(VENV) build dist *.egg-info runs
