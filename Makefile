# Everything sets itself up from nothing: `make test` and `make demo` on a fresh machine.
PYTHON ?= $(shell command -v python3.11 || command -v python3.12 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
OUT    := out

.PHONY: setup lint typecheck test fuzz demo compare compare-steady compare-varying bench monitor gpu-check clean

# $(call apt_install,WHAT,PACKAGE): Debian's PACKAGE, installed with sudo unless root.
define apt_install
	@command -v apt-get >/dev/null || { echo "$(1) is needed: install it (Debian: apt-get install $(2))"; exit 1; }
	SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $(2) >/dev/null
endef

# Debian's Prometheus (promtool too): the monitoring tests and `make monitor` need it.
PROMETHEUS := /usr/bin/prometheus

$(PROMETHEUS):
	$(call apt_install,Prometheus,prometheus)

# Debian's strace: `make bench` counts the system calls per request with it.
STRACE := /usr/bin/strace

$(STRACE):
	$(call apt_install,strace,strace)

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] in ((3, 11), (3, 12)), "Python 3.11 or 3.12 is required (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	SIDECAR_PURE_PYTHON=1 $(BIN)/pip install -q -e '.[embedded,plot,dev]'
	touch $@

# The request path compiled with mypyc (setup.py), in place beside its source, built again
# whenever a module of it changes. Built in the venv, where numpy's types are there to check
# against; without a C compiler the pure Python runs and setup.py says so. The last build's
# extensions go first: one left beside a source that no longer compiles would run in its place.
NATIVE := $(VENV)/.native
CORE   := $(shell sed -n 's/^    "\([a-z0-9_/]*\.py\)",$$/\1/p' setup.py)

$(NATIVE): $(STAMP) setup.py $(CORE)
	rm -f sidecar_native__mypyc.*.so $(CORE:.py=.cpython-*.so)
	$(BIN)/pip install -q --upgrade 'setuptools>=77' wheel
	$(BIN)/pip install -q --no-build-isolation --no-deps -e .
	touch $@

setup: $(STAMP) $(NATIVE)

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

test: lint typecheck $(PROMETHEUS)
	$(BIN)/pytest

# 3 properties × 3,400 seeded cases = 10,200 fuzzed requests on the real embedded stack.
fuzz: setup
	FUZZ_EXAMPLES=3400 $(BIN)/pytest tests/api/test_fuzz.py --timeout 3600

demo: setup
	$(BIN)/python -m benchmarks.demo -o $(OUT)/demo
	@echo "Longer runs and other GPUs, in the simulator (about 20 s): make compare"

compare: setup
	$(BIN)/python -m scheduler compare -o $(OUT)/compare

# The matrices of docs/simulator.md, five seeds each; each writes results/compare-<name>/
# (compare.md and .json with the commit and the machine, compare.csv, compare.png).
compare-steady: setup
	$(BIN)/python -m scheduler compare --matrix steady --full -o results/compare-steady

compare-varying: setup
	$(BIN)/python -m scheduler compare --matrix varying --full -o results/compare-varying

# The sidecar's cost now against results/bench-before.json (the code before the cheaper data
# path, measured side by side with it: python -m benchmarks.bench --before-tree DIR --name
# bench-before); the same code's Python alone, without sockets; an idle sidecar's CPU; gRPC's
# own floor and its second hop; then batching and the core (compiled, and against its own
# Python).
bench: setup $(STRACE)
	$(BIN)/python -m benchmarks.bench --before results/bench-before.json
	$(BIN)/python -m benchmarks.pathbench
	$(BIN)/python -m benchmarks.idle
	$(BIN)/python -m benchmarks.syscalls
	$(BIN)/python -m benchmarks.grpcfloor
	$(BIN)/python -m benchmarks.grpchop
	$(BIN)/python -m benchmarks.clientcost
	$(BIN)/python -m benchmarks.batchbench
	$(BIN)/python -m scheduler bench
	$(BIN)/python -m benchmarks.compiled

monitor: setup $(PROMETHEUS)
	grafana/monitor.sh $(SIDECAR) $(TRITON_METRICS)

# Read-only check on a machine with an NVIDIA GPU (never changes a GPU setting); without a GPU
# it says so and fails. Offline GPU machines: see docs/operations.md, "Checking on a real GPU".
gpu-check:
	scripts/gpu-check $(ARGS)

clean:
	rm -rf $(VENV) $(OUT) .mypy_cache .ruff_cache .pytest_cache *.egg-info build *.so scheduler/*.so
