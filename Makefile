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

.PHONY: install install-dev demo test test-all bench gpu-check protos clean

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

# The GPU check (issue #32, docs/PERFORMANCE.md): the Triton kernels compiled and checked, their timings beside
# flash-linear-attention (the gpu extra) and SDPA, streaming BPTT at 10^6 frames, a 2-worker swarm on the GPU.
# Without CUDA it says so and exits 0. A CUDA torch already installed is kept (VENV_FLAGS=--system-site-packages).
gpu-check: install
	$(PY) -m pip install --quiet -e ".[gpu]"
	$(VENV)/bin/rcswarm bench gpu

protos: install-dev
	$(PY) -m rcswarm.protos.generate

clean:
	rm -rf $(VENV) build dist *.egg-info runs
