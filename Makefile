# cdcd developer entry points. Everything installs what it needs; every target is safe to re-run.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STACK := deploy/local/stack
# PostgreSQL majors the integration suite runs on (15 from Debian, the others from npm), and the ones that run
# all of it: the others run the version-sensitive tests (marked every_pg), which keeps `make test` under 30 min.
# The failover tests run on 17 and 18 on a primary/standby pair of their own (`stack up pg-ha`).
PG_VERSIONS ?= 14 15 16 17 18
PG_FULL ?= 17

.PHONY: demo test soak lint unit unit-native unit-python integration stack venv clean avroread wheel wheel-test stops-kafka

venv: $(VENV)/.installed
# `pip install -e` builds cdcd._native (native/, Rust) with maturin and cargo; a change of the Rust rebuilds it.
$(VENV)/.installed: pyproject.toml native/Cargo.toml native/Cargo.lock $(wildcard native/src/*.rs)
	@command -v cargo >/dev/null || { echo "make venv: cargo not found: cdcd's compiled row stage (native/) needs Rust: install it with rustup"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# kustomize renders deploy/kubernetes in the tests (from the Go module proxy)
	GOBIN=$(abspath $(BIN)) go install sigs.k8s.io/kustomize/kustomize/v5@v5.5.0
	touch $@

# tools/avroread: the independent Go reader of cdcd's topics (tests/integration/test_avroread.py), built from
# the pinned modules in its go.mod/go.sum (fetched through the Go module proxy into Go's module cache).
GO ?= $(or $(shell command -v go),/usr/local/go/bin/go)
AVROREAD := build/avroread
avroread: $(AVROREAD)
$(AVROREAD): tools/avroread/go.mod tools/avroread/go.sum $(wildcard tools/avroread/*.go)
	mkdir -p $(dir $@)
	cd tools/avroread && GOFLAGS=-mod=readonly $(GO) vet ./... && GOFLAGS=-mod=readonly $(GO) build -trimpath -o $(abspath $@) .

# A wheel to publish: manylinux_2_17 (manylinux2014), for any x86_64 Linux with glibc >= 2.17 and this Python
# (cp311). maturin links the compiled row stage with zig (PyPI's ziglang, in the dev extra) against glibc 2.17's
# symbols and checks the result with its auditwheel; `pip wheel .` would give a linux_x86_64 wheel for this
# machine only. Its own cargo target dir: no lock or rebuild shared with lint's cargo; ~2 s when nothing changed.
WHEEL_DIR := build/wheel
WHEEL_TARGET_DIR ?= build/cargo-wheel
wheel: venv
	rm -rf $(WHEEL_DIR)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/maturin build --release --locked --quiet --zig --compatibility manylinux2014 \
		--interpreter $(BIN)/python --target-dir $(WHEEL_TARGET_DIR) --out $(WHEEL_DIR)

# tests/packaging: `make wheel` from the sources as they are, its tags, installed in a fresh venv
wheel-test: venv
	$(call LIMIT,1200) $(BIN)/pytest tests/packaging -q -p no:cacheprovider --durations=5

# debezium: Kafka Connect with Debezium's PostgreSQL connector (tests/integration/test_debezium.py): ~5 s to start.
# toxiproxy: fault proxies (tests/integration/test_faults.py): ~0.1 s to start; built once with go (~6 s warm).
stack:
	$(STACK) up all debezium toxiproxy
	for v in $(PG_VERSIONS); do PG_VERSION=$$v $(STACK) up pg; done

# Bring up the local stack and show changes flowing through the daemon on a demo workload.
demo: venv
	$(STACK) up all
	$(BIN)/python deploy/local/demo.py

# cargo test in the dev profile: overflow checks and debug assertions on, and none of the release profile's fat LTO
# (53 against 32 CPU-s from cold, 214 against 57 s under load); the release build is what tests/unit checks.
lint: venv
	$(BIN)/ruff check cdcd tests benchmarks deploy
	$(BIN)/ruff format --check cdcd tests benchmarks deploy
	$(BIN)/mypy
	cd native && cargo fmt --check && cargo clippy --release --locked -- -D warnings && cargo test --locked

unit: venv
	$(BIN)/pytest tests/unit -q

integration: venv stack avroread
	CDCD_TEST_PG_VERSIONS="$(PG_VERSIONS)" CDCD_TEST_PG_FULL="$(PG_FULL)" $(BIN)/pytest tests/integration -q

# The whole suite: lint, types, unit tests, integration tests on every PG major in PG_VERSIONS, with the compiled
# row stage (cdcd._native); on the Python reference alone (CDCD_IMPL=python), the unit tests (bar the parity
# tests, the lane's and early encoding's, which need the compiled module) and the integration tests of the row path (Kafka, snapshots, streaming,
# the Go reader) on PG_FULL. What needs no stack runs while the stack starts (-O: each part's output in one piece).
# Integration tests run on two workers (pytest-xdist; what shares a service stays on one: tests/integration/conftest.py),
# except those marked alone: the ones that stop Kafka (stops_kafka) run beside the unit tests, once the stack is up
# (nothing else there uses a service; mostly they wait for Kafka), the others by themselves after the two workers.
# The Python row stage's pass runs on one: on two it gained 10-40 s of 166 and its timing races surfaced (see the
# notes of 2026-11-27). It leaves out what the row stage does not do (beyond_row_stage: resuming after a kill, 100 of
# its 320 s; the same snapshot paths are read in its other tests).
PARALLEL := -q -p no:cacheprovider -n 2 --dist loadgroup
# Each pytest of `make test` within a limit of its own (seconds; about twice what it takes on CI): a run that
# hangs where no test's watchdog reaches (tests/conftest.py) ends with SIGTERM, its summary and a failure, long
# before CI's time limit, instead of taking the whole run with it.
LIMIT = timeout --signal=TERM --kill-after=60 $(1)
ROW_PATH_TESTS := tests/integration/test_kafka.py tests/integration/test_snapshot.py \
	tests/integration/test_tail_streaming.py tests/integration/test_avroread.py tests/integration/test_columns.py
test: venv
	$(MAKE) --no-print-directory -j6 -O lint stack avroread unit-native unit-python wheel-test stops-kafka
	CDCD_TEST_PG_VERSIONS="$(PG_VERSIONS)" CDCD_TEST_PG_FULL="$(PG_FULL)" \
		$(call LIMIT,2700) $(BIN)/pytest tests/integration $(PARALLEL) -m "not alone" --durations=25
	CDCD_TEST_PG_VERSIONS="$(PG_VERSIONS)" CDCD_TEST_PG_FULL="$(PG_FULL)" \
		$(call LIMIT,600) $(BIN)/pytest tests/integration -q -p no:cacheprovider -m "alone and not stops_kafka"
	CDCD_IMPL=python CDCD_TEST_PG_VERSIONS="$(PG_FULL)" CDCD_TEST_PG_FULL="$(PG_FULL)" \
		$(call LIMIT,1200) $(BIN)/pytest $(ROW_PATH_TESTS) -q -p no:cacheprovider \
		-m "not alone and not beyond_row_stage" --durations=5

# make test's integration tests that stop Kafka (part of its first, parallel group: see above)
stops-kafka: venv stack
	CDCD_TEST_PG_VERSIONS="$(PG_VERSIONS)" CDCD_TEST_PG_FULL="$(PG_FULL)" \
		$(call LIMIT,1200) $(BIN)/pytest tests/integration -q -p no:cacheprovider -m stops_kafka --durations=5

# The nemesis for longer (tests/integration/test_nemesis.py): both delivery modes, one after the other, MINUTES of
# faults each from SEED, 100,000-row streamed transactions every ~90 s; the report lines go to build/soak.jsonl.
SEED ?= $(shell date +%s)
MINUTES ?= 30
soak: venv
	$(STACK) up kafka registry toxiproxy
	PG_VERSION=15 $(STACK) up pg
	mkdir -p build
	TEST_LIMIT_S=$$(( $(MINUTES) * 60 + 1200 )) NEMESIS_SEED=$(SEED) NEMESIS_SECONDS=$$(( $(MINUTES) * 60 )) \
		NEMESIS_BIG_ROWS=100000 NEMESIS_STREAMED_EVERY_S=90 \
		NEMESIS_REPORT=$(abspath build/soak.jsonl) $(BIN)/pytest tests/integration/test_nemesis.py -k lose_nothing -s -q \
		-p no:cacheprovider

unit-native: venv
	CDCD_IMPL=native $(call LIMIT,1500) $(BIN)/pytest tests/unit -q -p no:cacheprovider -n 2 --durations=10

unit-python: venv
	CDCD_IMPL=python $(call LIMIT,1500) $(BIN)/pytest tests/unit -q -p no:cacheprovider --ignore tests/unit/test_native.py \
		--ignore tests/unit/test_lane.py --ignore tests/unit/test_encoded.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis cdcd.egg-info
