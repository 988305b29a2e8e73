# jaxinfer: `make serve` and `make test` each do all the set-up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
WEIGHTS := weights/smollm2-135m-instruct/.complete
PYTEST_ARGS ?=
# Test processes (pytest-xdist): 2 on the 2-core CI machine, where compiles (single-threaded) of
# one overlap the other's steps; --dist loadfile keeps each module's shared engine in one process.
TEST_WORKERS ?= 2
N ?= 3

.PHONY: setup serve cluster test test-all test-fast bench bench-quick roofline offline-bench soak weights clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $(STAMP)

$(WEIGHTS): $(STAMP)
	$(PY) -m jaxinfer.convert

weights: $(WEIGHTS)

setup: $(STAMP) $(WEIGHTS)

serve: setup
	$(PY) server.py $(ARGS)

# N servers behind HAProxy on 127.0.0.1:8000 (docs/deploy.md); installs haproxy if it is missing.
cluster: setup
	$(PY) -m jaxinfer.cluster --instances $(N) $(ARGS)

# `make test` (what CI runs) leaves out the tests marked `slow` (each 30 s to 3 min on 2 busy
# cores: more server starts, the quickstart notebook, second real-model runs of what a cheaper
# test covers); `make test-all` runs them too. tests/test_api_fuzz.py runs on its own: its
# schemathesis cases share one node id, and under pytest-xdist only one of the nine ran.
TEST_MARKS ?= not slow
test: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --ignore=tests/test_api_fuzz.py -m "$(TEST_MARKS)" $(PYTEST_ARGS)
	$(PY) -m pytest -q -p no:cacheprovider tests/test_api_fuzz.py

test-all: setup
	$(MAKE) test TEST_MARKS="slow or not slow"

test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not real_model and not slow" $(PYTEST_ARGS)

# The serving comparison (benchmarks/compare.py): jaxinfer continuous and static batching and
# llama.cpp's server in one run. The first run also builds llama.cpp (benchmarks/llamacpp_peer.py,
# cached in $LLAMACPP_HOME or ~/.cache/jaxinfer/llamacpp, ~10 min on 2 cores); if that is not
# possible it says why and the comparison goes on without it.
bench: setup
	$(PY) benchmarks/compare.py $(ARGS)

bench-quick: setup
	$(PY) benchmarks/compare.py --quick $(ARGS)

roofline: setup
	$(PY) benchmarks/roofline.py $(ARGS)

offline-bench: setup
	$(PY) benchmarks/offline_throughput.py

# A long mixed workload against a fresh server (benchmarks/soak.py): RSS, fds, threads, KV blocks
# free and TTFT over time, judged against the acceptance checks; e.g. make soak ARGS="--minutes 20".
soak: setup
	$(PY) benchmarks/soak.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
