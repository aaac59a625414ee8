# The two commands (see README.md): `make demo` and `make test`. Both set up .venv first (idempotent): `make demo` the
# runtime (`setup`: the dependencies and DeepSpeed), `make test`, `make lint` and `make docs` the dev extras on top
# (`setup-dev`: pytest, ruff, mypy, MkDocs, the tracking extras, ...), each with a stamp of its own in .venv.
PY := .venv/bin/python
# Local state (Prefect's database, the demo's storage) stays inside the checkout.
export PREFECT_HOME := $(CURDIR)/.tandem/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.tandem/torch_extensions
# Material for MkDocs prints a banner about its successor on every build; the builds here need no advice.
export NO_MKDOCS_2_WARNING := 1

.PHONY: setup setup-dev demo lint docs test test-suites test-durations bench test-bench chaos clean
setup:
	@bash tools/install.sh
	@mkdir -p $(PREFECT_HOME)

setup-dev:
	@bash tools/install.sh --dev
	@mkdir -p $(PREFECT_HOME)

demo: setup
	$(PY) -m flows.finetune $(ARGS)

# Lint and types: ruff's rules and its formatting (pyproject.toml), mypy over every production package; then the
# documentation: the configuration reference against the schema, and the site's strict build (a broken link or anchor,
# or a page the nav does not list, fails it). CI runs this before the tests and fails on any finding.
lint: setup-dev
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m config.reference --check
	$(PY) -m mkdocs build --strict

# The documentation site (mkdocs.yml, the pages under docs/) into site/: open site/index.html. Nothing is fetched.
# After changing a config field or a preset: $(PY) -m config.reference --write (make lint checks it).
docs: setup-dev
	$(PY) -m mkdocs build --strict

# Two pytest-xdist workers, work spread by tests/scheduling.py (TEST_WORKERS=0: one process, no xdist).
TEST_WORKERS ?= 2
space := $(subst ,, )
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadscope)

test: setup-dev
	@bash tools/install-test-services.sh
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The suites that do not fit the default run's budget (CI runs them after `make test`; tests/README.md lists their
# times): netns alone first (its hosts are network namespaces of this machine), then the others together on two
# workers as in the default run (the multi-run proofs, models at their published sizes, the secrets canary,
# cancelling, the kubernetes backend's pods, the pins on Python 3.12 and 3.13). No test collected (pytest's exit code
# 5) is not a failure. The benchmark scripts' toy runs are `make test-bench`, outside CI but for the GPU benchmark's CPU
# dry run (.ci/run): about 29 minutes of a worker that prove no figure, which CI's 90-minute limit could not keep.
SERIAL_SUITES ?= netns
PARALLEL_SUITES ?= elastic multirun published secrets cancel orphans kubernetes pythons
test-suites: setup-dev
	@for marker in $(SERIAL_SUITES); do \
		$(PY) -m pytest -m $$marker $(PYTEST_ARGS); code=$$?; \
		if [ $$code -eq 5 ]; then echo "test-suites: no test is marked $$marker"; \
		elif [ $$code -ne 0 ]; then exit $$code; fi; \
	done
	@if [ -n "$(strip $(PARALLEL_SUITES))" ]; then \
		$(PY) -m pytest $(XDIST) -m "$(subst $(space), or ,$(strip $(PARALLEL_SUITES)))" $(PYTEST_ARGS); code=$$?; \
		if [ $$code -ne 0 ] && [ $$code -ne 5 ]; then exit $$code; fi; \
	fi

# The default run with the 20 slowest tests (setup and teardown included) at the end.
test-durations: setup-dev
	@bash tools/install-test-services.sh
	$(PY) -m pytest $(XDIST) --durations=20 $(PYTEST_ARGS)

# The benchmarks at full size, printing their figures.
bench: setup-dev
	$(PY) -m pytest tests/benchmarks/bench_*.py -s

# Every benchmark script end to end at toy size (marker `bench`, tests/benchmarks/test_toy_runs.py): run it after
# changing a benchmark or what one drives; about 15 minutes on two workers. The default run checks that each script
# imports and parses its options.
test-bench: setup-dev
	$(PY) -m pytest $(XDIST) -m bench tests/benchmarks $(PYTEST_ARGS)

# The reliability suite: every fault scenario CHAOS_RUNS times, then the summary table of this run's rows; it fails
# when a run failed (the table is printed either way). CI runs it at one run a scenario (.ci/run).
CHAOS_RUNS ?= 5
chaos: setup-dev
	@bash tools/install-test-services.sh
	@date -u +%Y-%m-%dT%H:%M:%S > .tandem/chaos-started
	@echo "TANDEM_CHAOS_RUNS=$(CHAOS_RUNS) $(PY) -m pytest -m chaos $(PYTEST_ARGS)"; \
		TANDEM_CHAOS_RUNS=$(CHAOS_RUNS) $(PY) -m pytest -m chaos $(PYTEST_ARGS); code=$$?; \
		$(PY) -m tests.chaos.summary --since "$$(cat .tandem/chaos-started)"; exit $$code

clean:
	rm -rf .tandem

# A local cluster (PostgreSQL, Prefect server + UI, S3 endpoint, one worker per node) and prefect.yaml's
# deployments; see docs/docker.md ("Deployments and a local cluster").
.PHONY: cluster-up cluster-down cluster-status deploy
cluster-up: setup-dev
	@bash tools/cluster.sh up

cluster-down:
	@bash tools/cluster.sh down

cluster-status:
	@bash tools/cluster.sh status

deploy: setup
	$(PY) tools/deploy.py
