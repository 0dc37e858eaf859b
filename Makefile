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

.PHONY: install demo test test-all bench protos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	$(PY) -m pip install --quiet --upgrade pip "setuptools>=70.1"
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/rcswarm run $(RUN)

test: install
	$(PY) -m pytest -q

bench: install
	$(PY) -m pip install --quiet -e ".[dev,bench]"
	$(PY) benchmarks/sync_bench.py

protos: install
	$(PY) -m rcswarm.protos.generate

clean:
	rm -rf $(VENV) build dist *.egg-info runs
