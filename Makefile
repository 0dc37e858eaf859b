# Set-up and entry points. `make demo` and `make test` are the two commands a fresh machine needs.
#
# The virtual environment gets torch==2.13.0 unless it can already import a torch (for example a
# CUDA build, with VENV_FLAGS=--system-site-packages), which is kept. From PyPI that is the CUDA
# build on Linux (with NVIDIA's libraries and the triton it requires); on a machine without an
# NVIDIA GPU, TORCH_INDEX=https://download.pytorch.org/whl/cpu installs the CPU build instead.

PYTHON ?= python3
VENV ?= .venv
VENV_FLAGS ?=
TORCH_PIN ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.rcswarm-installed
DEV_STAMP := $(VENV)/.rcswarm-dev-installed
# triton (about 1 GB: a GPU compiler) joins the developer's install only where it can run, a machine whose
# nvidia-smi lists a GPU (TRITON=auto), or when asked: TRITON=1 (its kernels' interpreter tests then run on the
# CPU; without triton they skip). TRITON=0: never. `make install-triton` adds it to an existing venv.
TRITON ?= auto

.PHONY: install install-dev install-triton demo test test-all bench gpu-check wheelhouse protos clean

# The user's install: rcswarm and its run-time dependencies (no test tools, no triton).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=70.1"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

# The developer's install: the test tools, and triton where it can run (TRITON above).
$(DEV_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	@if [ "$(TRITON)" = 1 ] || { [ "$(TRITON)" = auto ] && nvidia-smi -L >/dev/null 2>&1; }; then \
		$(PY) -m pip install --quiet -e ".[triton]"; \
	else \
		echo "triton not installed (no NVIDIA GPU here; make install-triton adds it for its interpreter tests)"; \
	fi
	touch $(DEV_STAMP)

install: $(STAMP)

install-dev: $(DEV_STAMP)

install-triton: $(DEV_STAMP)
	$(PY) -m pip install --quiet -e ".[triton]"

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

# The GPU check on a box without a package index whose python3 already has a CUDA torch and triton (a CUDA
# image): rcswarm's wheel and the wheels such an image usually lacks, for its Python (WHEEL_PYTHON) on x86-64
# Linux, with benchmarks/gpu_check_offline.sh as gpu-check.sh and benchmarks/gpu_lease.sh as lease.sh. Copy
# wheelhouse/ there and run `sh wheelhouse/lease.sh 7` from the repository's root (the check within 7 minutes, then
# the CUDA-only tests), or `sh wheelhouse/gpu-check.sh --quick --budget-minutes 9` (any `rcswarm bench gpu` arguments).
WHEEL_PYTHON ?= 3.12
OFFLINE_WHEELS ?= grpcio==1.85.1 grpcio-health-checking==1.85.1 protobuf==7.35.1 blake3 cryptography cffi pycparser fla-core
MANYLINUX := $(foreach n,2_17 2_24 2_27 2_28 2_31 2_34,--platform manylinux_$(n)_x86_64) --platform manylinux2014_x86_64

wheelhouse: install
	rm -rf wheelhouse && mkdir wheelhouse
	$(PY) -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir wheelhouse .
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --python-version $(WHEEL_PYTHON) --implementation cp \
		$(MANYLINUX) --dest wheelhouse $(OFFLINE_WHEELS)
	cp benchmarks/gpu_check_offline.sh wheelhouse/gpu-check.sh
	cp benchmarks/gpu_lease.sh wheelhouse/lease.sh
	@du -sh wheelhouse

protos: install-dev
	$(PY) -m rcswarm.protos.generate

clean:
	rm -rf $(VENV) build dist *.egg-info runs wheelhouse
