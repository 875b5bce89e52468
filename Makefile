# Everything sets itself up from nothing: `make test` and `make demo` on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: setup lint typecheck test demo compare bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/pytest

demo: setup
	$(BIN)/python -m loadgen.demo -o $(OUT)/demo
	@echo "Longer runs and other GPUs, in the simulator (about 20 s): make compare"

compare: setup
	$(BIN)/python -m scheduler compare -o $(OUT)/compare

bench: setup
	$(BIN)/python -m loadgen.bench
	$(BIN)/python -m scheduler bench

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache *.egg-info
