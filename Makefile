# The two commands (see README.md): `make demo` and `make test`. Both set up .venv first (idempotent).
PY := .venv/bin/python
# Local state (Prefect's database, the demo's storage) stays inside the checkout.
export PREFECT_HOME := $(CURDIR)/.tandem/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.tandem/torch_extensions

.PHONY: setup demo test bench clean
setup:
	@bash tools/install.sh
	@mkdir -p $(PREFECT_HOME)

demo: setup
	$(PY) -m flows.finetune $(ARGS)

test: setup
	$(PY) -m pytest $(PYTEST_ARGS)

bench: setup
	$(PY) -m pytest tests/benchmarks/bench_*.py -s

clean:
	rm -rf .tandem
