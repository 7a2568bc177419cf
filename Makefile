# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv and install what they need.
PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: demo compose-demo test test-fast lint browser java bench clean docs docs-serve

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $@

demo: $(STAMP)
	$(VENV)/bin/labeldp demo --out demo-output

# The docker-compose deployment, built and run for real (labeldp/compose_stack.py): a Docker engine (Debian's dockerd,
# started as root with its own data root when none runs), images built without a registry when none is reachable
# (deploy/images/build.sh), PostgreSQL, two labels replicas behind a gateway, the trainer and a Spark cluster, the
# demo against them, then teardown (volumes kept). COMPOSE_DEMO_ARGS="--quick" for a short run, "--remove-volumes"
# to delete the databases and keys too.
compose-demo: $(STAMP)
	$(VENV)/bin/labeldp compose-demo $(COMPOSE_DEMO_ARGS)

# PYTEST_WORKERS=2 runs two pytest workers, each test file on one of them (pytest-xdist): on this 2-core machine
# the whole suite took 59 min that way against 60 in one process, and three tests that bound threads, time limits or
# an export's lag failed under the doubled load — so one process by default.
PYTEST_WORKERS ?= 0
test: lint browser java
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --durations=25

# The documentation site (mkdocs.yml; docs/): its reference pages regenerated from the code, then built offline into
# site/ — strict, so a broken link or any warning fails. docs-serve serves the built site on 127.0.0.1:8000.
docs: $(STAMP)
	$(PY) -m labeldp.docs_reference docs/reference
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: docs
	$(PY) -m http.server 8000 --bind 127.0.0.1 --directory site

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

# The browser tests (the console's, tests/labels_party/console/test_browser.py, and the API docs' offline,
# tests/shared/service/test_docs_browser.py) drive Debian's chromium through Playwright (tests/support/browser.py);
# installed here when missing (as root, or with sudo), never downloaded by Playwright.
SUDO := $(shell test "$$(id -u)" -eq 0 || echo sudo)
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium for the browser tests"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { echo "chromium is still missing" >&2; exit 1; }

# Spark (labels_party.spark and its tests) runs on a Java 17 runtime: Debian's, installed here when `java` is missing.
java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "installing Debian's openjdk-17-jre-headless for the Spark release jobs and their tests"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    openjdk-17-jre-headless >/dev/null; }
	@command -v java >/dev/null 2>&1 || { echo "java is still missing" >&2; exit 1; }

bench: $(STAMP)
	$(PY) bench/lp_mesh.py
	$(PY) bench/sampling_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis demo-output compose-demo-output bench-output
