# The project's interface. `make help` lists the targets; every target sets itself up.
SHELL := /bin/bash
.DEFAULT_GOAL := help

UV ?= $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
STAMP := $(VENV)/.setup-stamp
PY := $(VENV)/bin/python
export UV_PYTHON := 3.11
export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: help setup test test-fast compile run schedule schedules schedule-pause schedule-resume schedule-delete e2e bench lint format clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_ -]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(UV):
	@echo "uv not found: installing it with pip (user site)"
	python3 -m pip install --quiet --user uv || python3 -m pip install --quiet --user --break-system-packages uv

$(STAMP): pyproject.toml uv.lock | $(UV)
	$(UV) sync --frozen
	@touch $@

setup: $(STAMP) ## Create .venv from uv.lock (installs uv first when missing); quick when nothing changed

test: $(STAMP) ## Run the whole test suite (unit, multi-worker, resume, preparation)
	$(PY) -m pytest

test-fast: $(STAMP) ## Run the tests that start no extra TensorFlow processes
	$(PY) -m pytest -m "not slow"

compile: $(STAMP) ## Compile pipeline.py to compiled/pipeline.json and pipeline-notify.json (byte-identical on every run)
	$(PY) pipeline.py

TARGET ?= auto
ARGS ?=
WAIT ?=
run: $(STAMP) ## Run the pipeline: locally when no PROJECT_ID is configured (env or env.sh), else on Vertex (WAIT=1 follows it). ARGS="--epochs 5 --tune true"
	@WAIT=$(WAIT) $(PY) -m launch.cli run --target $(TARGET) $(ARGS)

CRON ?=
TIMEZONE ?=
MAX_CONCURRENT ?= 1
START ?=
END ?=
NAME ?=
schedule: $(STAMP) ## Schedule this commit's template on Vertex: CRON='0 6 * * 1' [TIMEZONE=Europe/Paris MAX_CONCURRENT=1 START=iso END=iso ARGS=...]
	@test -n "$(CRON)" || { echo "make schedule needs CRON='<minute> <hour> <day> <month> <weekday>'" >&2; exit 2; }
	$(PY) -m launch.submit schedule --cron "$(CRON)" --max_concurrent_runs $(MAX_CONCURRENT) $(if $(TIMEZONE),--timezone "$(TIMEZONE)") $(if $(START),--start_time "$(START)") $(if $(END),--end_time "$(END)") $(ARGS)

schedules: $(STAMP) ## List the project's pipeline schedules
	$(PY) -m launch.submit schedules

schedule-pause schedule-resume schedule-delete: $(STAMP) ## Pause, resume or delete a schedule: NAME=projects/.../schedules/ID
	@test -n "$(NAME)" || { echo "make $@ needs NAME=projects/<p>/locations/<r>/schedules/<id> (see make schedules)" >&2; exit 2; }
	$(PY) -m launch.submit $(subst schedule-,,$@) "$(NAME)"

e2e: $(STAMP) ## A real run on Vertex AI (needs a project in env.sh): submit, wait, check the model version
	$(PY) -m pytest -m e2e tests/e2e

BENCH ?=
bench: $(STAMP) ## Run the benchmarks (all, or BENCH=input|train|gpu|prepare); writes benchmarks/results/ and the BENCHMARKS.md table
	$(PY) -m benchmarks run $(if $(BENCH),--bench $(BENCH))

lint: $(STAMP) ## Check formatting, lint rules and types (ruff format --check, ruff, mypy)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: $(STAMP) ## Format the code and apply safe lint fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean: ## Remove the virtual environment and caches (and the serving-check environments in .cache/)
	rm -rf $(VENV) .mypy_cache .ruff_cache .cache
