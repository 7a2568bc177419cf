# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/labeldp demo --out demo-output

test: lint
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

bench: $(STAMP)
	$(PY) bench/lp_mesh.py
	$(PY) bench/sampling_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis demo-output bench-output
