# jupyter-podman-hpc: the commands a developer and CI run.
# Run as root on a fresh machine: the stack installs and starts what it needs
# and the tests run as its unprivileged user. Run as that user, the stack
# must already be up.

SHELL := /bin/bash
STACK := ./dev/stack
AS_USER := ./dev/as-user
PYTEST_ARGS ?=

.PHONY: help stack-up stack-down stack-status test test-unit lint docs demo bench bench-smoke

help:
	@echo "make demo    bring the stack up and start JupyterLab on 127.0.0.1 (port: DEMO_PORT=8888)"
	@echo "make test    bring the stack up, build the docs and run the whole test suite"
	@echo "make lint    ruff (lint and format), mypy, and the JupyterLab extension's eslint, prettier and jest"
	@echo "make docs    the docs site into docs/build/html (warnings are errors; the stack must be up)"
	@echo "make bench   the benchmarks (bench/README.md); make bench-smoke: one quick run"
	@echo "make stack-up | stack-down | stack-status"

stack-up:
	@if [ "$$(id -u)" = 0 ]; then $(STACK) up; else $(STACK) status >/dev/null || { $(STACK) status; echo "the stack is down: run 'make stack-up' as root" >&2; exit 1; }; fi

stack-down:
	$(STACK) down

stack-status:
	$(STACK) status

# STACK_REQUIRED: a test that needs the stack fails instead of skipping.
# pytest's exit code 5 (nothing collected) fails like any other non-zero code.
# `make lint` runs first (30 s: its findings come before the long suite), and pytest runs whatever
# its outcome: a lint finding never hides a test's, and either one fails the target.
test: stack-up
	$(MAKE) --no-print-directory docs
	$(MAKE) --no-print-directory lint; lint=$$?; \
	STACK_REQUIRED=1 $(AS_USER) python -m pytest $(PYTEST_ARGS); \
	status=$$?; [ $$status -ne 5 ] || echo "pytest collected no tests" >&2; \
	[ $$lint -eq 0 ] || { echo "make lint failed" >&2; [ $$status -ne 0 ] || status=1; }; \
	exit $$status

# The checks (CONTRIBUTING.md, "Checks"), as the stack's user with the stack's venv (the `lint`
# extra) and the extension's node_modules (installed by its build). .pre-commit-config.yaml runs
# the same tools on the files a commit changes.
lint:
	@$(AS_USER) python -c 'import ruff, mypy' 2>/dev/null || { echo "the stack's venv has no ruff or mypy: run 'make stack-up' as root" >&2; exit 1; }
	$(AS_USER) python -m ruff check --no-cache .
	$(AS_USER) python -m ruff format --check --no-cache .
	$(AS_USER) python -m mypy
	$(AS_USER) npm --prefix labextension run --silent lint
	$(AS_USER) npm --prefix labextension test -- --ci --silent

# The docs site (docs/), built as the stack's user with the stack's venv, which has the `docs`
# extra: warnings are errors (-W), every reference must resolve (-n), all of them are reported, and
# every page is read again (-E: a warning of an unchanged page is never skipped).
DOCS_BUILD := docs/build
docs:
	@$(AS_USER) python -c 'import sphinx, myst_parser' 2>/dev/null || { echo "the stack's venv has no sphinx: run 'make stack-up' as root" >&2; exit 1; }
	$(AS_USER) python -m sphinx -E -W --keep-going -n -q -b html -d $(DOCS_BUILD)/doctrees docs $(DOCS_BUILD)/html
	@echo "docs: $(DOCS_BUILD)/html/index.html"

test-unit:
	$(AS_USER) python -m pytest tests/unit $(PYTEST_ARGS)

demo: stack-up
	$(AS_USER) ./dev/demo

# Benchmarks (bench/README.md): not part of `make test`, except the smoke run (tests/bench).
# As root, `make bench` starts BENCH_NODES Slurm nodes for the scale benchmark (bench/scale.py);
# `make test` and `make stack-up` go back to 4.
BENCH_NODES ?= 16
bench:
	@if [ "$$(id -u)" = 0 ]; then STACK_NODES=$(BENCH_NODES) $(STACK) up; else $(MAKE) --no-print-directory stack-up; fi
	$(AS_USER) python bench/run.py

bench-smoke: stack-up
	$(AS_USER) python bench/run.py --smoke --output /tmp/jph-bench-smoke
