# Two commands on a fresh machine with Python 3.11: `make demo`, `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   := $(VENV)/.installed-demo

.PHONY: demo drill test test-fast bench docs docs-serve gpu-check lint clean

# Everything: the suite, benchmarks and lint (the dev servers, plots, torch, Hugging Face).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,bench,torch,hf,stack,report,docs,trackers]'
	@touch $(STAMP) $(DEMO)

# What the demo and the drill need: the dev servers, plots, torch (the digits CNN).
$(DEMO): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[stack,report,torch]'
	@touch $(DEMO)

demo: $(DEMO)
	$(PY) -m workers.demo

drill: $(DEMO)
	$(PY) -m workers.cli drill --seed 1 --kills 5 --out cairn-report-drill

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not drill"

bench: $(STAMP)
	$(PY) -m bench.run_all

# The documentation site, into site/ (the Reference pages are generated from the code).
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
docs: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict --site-dir site

docs-serve: $(STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

# On a machine with a CUDA GPU (and torch's CUDA build): the gpu-marked tests, then the
# save/restore-from-device benchmark (bench/results/gpu.json, section 12 of BENCHMARKS.md).
gpu-check: $(STAMP)
	$(PY) -m pytest -m gpu tests/gpu -rs -p no:cacheprovider
	$(PY) -m bench.suites.gpu
	$(PY) -m bench.report

lint: $(STAMP)
	$(VENV)/bin/ruff check cairn workflows activities workers tests bench
	$(VENV)/bin/mypy cairn

clean:
	rm -rf $(VENV) .cairn .pytest_cache .hypothesis cairn-report-drill site
