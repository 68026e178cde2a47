# Ferry's two commands: `make demo` runs the whole loop on embedded defaults,
# `make test` runs the whole suite (and is what .ci/run calls).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint proto bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Exact pins of everything, transitive included; a stamp re-installs when a lock changes.
# requirements.lock (control plane and converter) includes requirements-agent.lock (the
# device set); requirements-test.lock adds the engine's JIT tier and the test tools.
# The editable install tries the venv's own setuptools first (no download); a fresh venv's
# cannot build (no wheel command), so that error is silenced and the isolated build runs.
$(VENV)/.runtime: requirements.lock requirements-agent.lock requirements-llm.lock pyproject.toml | $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.lock
	$(BIN)/pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e . 2>/dev/null \
		|| $(BIN)/pip install --disable-pip-version-check -q --no-deps -e .
	touch $@

$(VENV)/.test: requirements-test.lock requirements-jit.lock $(VENV)/.runtime
	$(BIN)/pip install --disable-pip-version-check -q -r requirements-test.lock
	touch $@

demo: $(VENV)/.runtime
	$(BIN)/python manage.py demo

# The browser tests drive Debian's chromium; install it once if it is missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; }

# The whole suite with the engine's JIT tier, then the engine's suite again as a device without
# numba runs it (numpy kernels only); both share one compile cache.
test: $(VENV)/.test chromium
	$(BIN)/ruff check .
	FERRY_JIT_CACHE=$(CURDIR)/var/jit-cache $(BIN)/python -m pytest
	FERRY_JIT=0 FERRY_JIT_CACHE=$(CURDIR)/var/jit-cache $(BIN)/python -m pytest -q -p no:cacheprovider tests/engine

lint: $(VENV)/.test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Regenerate the committed gRPC stubs from deploy/proto/agent.proto (tests fail when they are stale).
proto: $(VENV)/.test
	$(BIN)/python -m deploy.proto.generate

# Benchmarks print figures (Ferry beside its peer, in one run); they are not tests.
# torch (bench/requirements.txt, an exact CPU pin) builds the benchmark models.
bench: $(VENV)/.test
	$(BIN)/pip install --disable-pip-version-check -q -r bench/requirements.txt
	@for script in engine engine_breakdown convert rollout_decide rollout_sim agent_stream agent_footprint; do \
		echo "== bench/$$script.py"; $(BIN)/python bench/$$script.py || exit 1; done

clean:
	rm -rf $(VENV) var
