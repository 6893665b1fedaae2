# The project's interface. `make help` lists the targets; every target sets itself up.
SHELL := /bin/bash
# Every recipe line fails on its first failing command, a pipe's included (pipefail), so every
# failure reaches make's exit status.
.SHELLFLAGS := -e -o pipefail -c
.DEFAULT_GOAL := help

# A variable given on make's command line is exported to every recipe, and make expands a `$(...)`
# in its value as it exports it, even when no line of this file uses the variable: each one is kept
# verbatim here instead (`override X := $(value X)`), and still exported (`make run PROJECT_ID=...`
# reaches the program), so `make run TF_CPP_MIN_LOG_LEVEL='$(shell touch f)'` (or PY=, UV=, VENV=,
# UV_PYTHON=, any name) runs nothing and only exports that text.
# ARGS is the exception, on purpose (see below). UV and TF_CPP_MIN_LOG_LEVEL are also taken from
# the environment, and kept verbatim the same way.
$(foreach v,$(filter-out ARGS,$(.VARIABLES)),$(if $(filter command line,$(origin $(v))),$(eval override $(v) := $$(value $(v)))$(eval export $(v))))
ifeq ($(origin UV),undefined)
UV := $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
endif
override UV := $(value UV)
VENV := .venv
STAMP := $(VENV)/.setup-stamp
PY := $(VENV)/bin/python
export UV_PYTHON := 3.11
TF_CPP_MIN_LOG_LEVEL ?= 2
override TF_CPP_MIN_LOG_LEVEL := $(value TF_CPP_MIN_LOG_LEVEL)
export TF_CPP_MIN_LOG_LEVEL

.PHONY: help setup test test-fast test-conformance docs compile run schedule schedules schedule-pause schedule-resume schedule-delete e2e bench lint format clean

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_ -]+:.*## / {printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(UV):
	@echo "uv not found: installing it with pip (user site)"
	python3 -m pip install --quiet --user uv || python3 -m pip install --quiet --user --break-system-packages uv

# --compile-bytecode: every module of .venv compiled once, here. Where the environment says
# PYTHONDONTWRITEBYTECODE=1 (as on the machines this is developed on) nothing else ever writes
# bytecode, and each Python process would compile what it imports from source: `import tensorflow`
# took 17.5 s, 7.3 s compiled (2 cores); a local run starts about ten such processes. 38 s once.
$(STAMP): pyproject.toml uv.lock Makefile | $(UV)
	$(UV) sync --frozen --compile-bytecode
	@touch $@

setup: $(STAMP) ## Create .venv from uv.lock (installs uv first when missing); quick when nothing changed

# The tiers (docs/architecture.md#development): the tests that need no cores of their own run on
# every core (pytest-xdist; a module's tests on one worker, so its module fixtures are built
# once); the `serial` ones (multi-replica training, kills and resumes, the local end-to-end runs,
# deadlines) then two at a time: one alone left a core idle (120% CPU on 2 cores) through its
# imports, steps and collectives; worksteal keeps a long test from holding back the other worker's
# queue.
# The first part runs one worker more than there are cores: its tests wait on subprocesses, files
# and sockets for a third of their time (131% CPU with 2 workers on 2 cores; make test-fast took
# 3:36 with 2 workers, 3:16 with 3, 3:14 with 4), and the modules that train a model go first
# (tests/conftest.py, HEAVIEST_MODULES) so that none ends the run alone.
# Both parts always run; either failing fails. Each names its ten slowest.
# The tests write bytecode whatever the environment says: pytest caches its rewritten test modules
# only then, and every process of the suite would otherwise compile the project's modules again
# (__pycache__ is gitignored). Collecting the fast tier took 35 s, 14 s with .venv compiled, 10 s
# with this too.
PYTEST := PYTHONDONTWRITEBYTECODE= $(PY) -m pytest
ON_EVERY_CORE := -n $(shell echo $$(( $$(nproc) + 1 ))) --dist loadscope --no-loadscope-reorder

test: $(STAMP) lint ## Run make lint (about 25 s), then the whole test suite: every tier, on every core, then the serial tier two at a time
	@a=0; $(PYTEST) -m "not serial" $(ON_EVERY_CORE) --durations=10 || a=$$?; \
	b=0; $(PYTEST) -m serial -n 2 --dist worksteal --durations=10 || b=$$?; \
	if [ $$a -ne 0 ] || [ $$b -ne 0 ]; then echo "make test: failed (on every core: exit $$a; serial: exit $$b)" >&2; exit 1; fi

test-fast: $(STAMP) ## Run the edit-loop tier: the tests that start no TensorFlow process and no make, on every core
	$(PYTEST) -m "not process and not serial" $(ON_EVERY_CORE)

test-hardening: $(STAMP) ## Run the hardening tier: bad inputs and attacks at every entry point
	$(PYTEST) -m "hardening and not serial" $(ON_EVERY_CORE)

test-conformance: $(STAMP) ## Run the conformance tier: every option combination through the real GCPC launchers, or refused before any request (docs/guarantees.md#conformance-the-real-launchers-every-option)
	$(PYTEST) -m conformance tests/conformance

docs: $(STAMP) ## Write the doc tables the code holds: flags, parameters, GPU tables, layout, each extra's files, the suites' case counts, the conformance matrix, env.sh.example (make test fails while one is stale)
	$(PY) -m tests.doctables
	$(PY) -m tests.conformance.test_conformance

compile: $(STAMP) ## Compile pipeline.py to compiled/pipeline.json and pipeline-notify.json (byte-identical on every run)
	$(PY) pipeline.py

# The variables a person gives make (CRON='0 6 * * 1', NAME=projects/...) reach the programs in
# their environment, never through a recipe line: `export` hands each value over verbatim and
# launch.submit and launch.schedules read and validate them there (CRON, TIMEZONE, START, END, MAX_CONCURRENT, NAME;
# WAIT when `make run` submits to Vertex; RUN, launch.vertexreport's), so the shell never parses them (TIMEZONE='x"; touch f'
# is only a bad time zone). `override X := $(value X)` keeps make itself from expanding a `$(...)` inside a value:
# make expands a variable from the command line or the environment whenever it exports it.
# TARGET and BENCH are read by the shell from the environment, inside double quotes ("$$TARGET"),
# which passes them as one argument, unparsed. ARGS is the exception, on purpose: flags for the
# program, split and unquoted by the shell like any command line (quote inside it accordingly).
TARGET ?= auto
WAIT ?=
CRON ?=
TIMEZONE ?=
MAX_CONCURRENT ?= 1
START ?=
END ?=
NAME ?=
RUN ?=
BENCH ?=
ARGS ?=
override TARGET := $(value TARGET)
override WAIT := $(value WAIT)
override CRON := $(value CRON)
override TIMEZONE := $(value TIMEZONE)
override MAX_CONCURRENT := $(value MAX_CONCURRENT)
override START := $(value START)
override END := $(value END)
override NAME := $(value NAME)
override RUN := $(value RUN)
override BENCH := $(value BENCH)
export TARGET WAIT CRON TIMEZONE MAX_CONCURRENT START END NAME RUN BENCH

# Ends the recipe lines that run launch.cli or launch.schedules: when the program fails, one last line
# names its exit code and what the code means (make itself exits 2 for any failed recipe; see
# README "Exit codes"), then the recipe fails with that code (make's "Error N" repeats it).
EXPLAIN = || { code=$$?; case $$code in 1) why="failed: the run failed, or a request to Google Cloud did";; 2) why="usage or settings error: nothing was started";; 130) why="interrupted";; *) why="failed";; esac; echo "make $@: exit code $$code, $$why" >&2; exit $$code; }

run: $(STAMP) ## Run the pipeline: locally when no PROJECT_ID is configured (env or env.sh), else on Vertex (WAIT=1 follows it). ARGS="--epochs 5 --tune true"
	@$(PY) -m launch.cli run --target="$$TARGET" $(ARGS) $(EXPLAIN)

schedule: $(STAMP) ## Schedule this commit's template on Vertex: CRON='0 6 * * 1' [TIMEZONE=Europe/Paris MAX_CONCURRENT=1 START=iso END=iso ARGS=...]
	@$(PY) -m launch.schedules schedule $(ARGS) $(EXPLAIN)

schedules: $(STAMP) ## List the project's pipeline schedules
	@$(PY) -m launch.schedules schedules $(ARGS) $(EXPLAIN)

schedule-pause schedule-resume schedule-delete: $(STAMP) ## Pause, resume or delete a schedule: NAME=projects/.../schedules/ID
	@$(PY) -m launch.schedules $(subst schedule-,,$@) $(ARGS) $(EXPLAIN)

.PHONY: models
models: $(STAMP) ## List the local registry's models: each version's figures, the dataset it was evaluated on, the gate's decision and the champion (ARGS="--registry_dir DIR")
	@$(PY) -m launch.models $(ARGS)

.PHONY: report
report: $(STAMP) ## Write local_runs/<job id>/summary.json and report.html for a Vertex run: RUN=<job id> or RUN=projects/<p>/locations/<region>/pipelineJobs/<id>
	@$(PY) -m launch.vertexreport $(ARGS) $(EXPLAIN)

.PHONY: gpu-check
gpu-check: $(STAMP) ## One Vertex job on this checkout's trainer image: the GPUs it sees, one NCCL all-reduce (the chief's machine; ARGS="--chief_machine_type g2-standard-8 --chief_accelerator_type NVIDIA_L4")
	@$(PY) -m launch.gpucheck $(ARGS) $(EXPLAIN)

e2e: $(STAMP) ## A real run on Vertex AI (needs a project in env.sh): submit, wait, check the model version
	$(PYTEST) -m e2e tests/e2e

bench: $(STAMP) ## Run the benchmarks (all, or BENCH=input|train|gpu|prepare|memory|e2e|tuning|folder); writes benchmarks/results/ and the BENCHMARKS.md table
	$(PY) -m benchmarks run $${BENCH:+--bench="$$BENCH"}

lint: $(STAMP) ## Check formatting, lint rules and types (ruff format --check, ruff, mypy)
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

format: $(STAMP) ## Format the code and apply safe lint fixes
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean: ## Remove the virtual environment and caches (and the serving-check environments in .cache/)
	rm -rf $(VENV) .mypy_cache .ruff_cache .cache
