# Two commands for a fresh machine: `make run` (the embedded default) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export FLWR_HOME := $(CURDIR)/.flwr
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export OMP_NUM_THREADS := 1

.PHONY: run test setup bench clean stop

# Dependencies come from pyproject.toml; the project itself is not installed (Flower ships it
# to the SuperLink as an app bundle, and pytest imports it from the repository root).
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/python scripts/print_requirements.py --dev > $(VENV)/requirements.txt
	$(BIN)/pip install -q -r $(VENV)/requirements.txt
	touch $@

setup: $(BIN)/.installed

run: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m app.launch $(if $(RUN_CONFIG),--run-config "$(RUN_CONFIG)")

test: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

bench: setup
	$(BIN)/python scripts/bench/per_sample_grads.py

stop:
	-pkill -f flower-superlink

clean: stop
	rm -rf .flwr outputs .pytest_cache
