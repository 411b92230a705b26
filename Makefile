# Two commands: `make app` (serve the demo model) and `make test` (the whole suite).
# Each bootstraps .venv from scratch when it is missing or pyproject.toml changed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: app test install browser clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the pinned wheels (a bare `torch` would pull a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Debian's chromium for the browser test (test tools cannot download browsers here); skipped when apt is
# unavailable, and the browser test then skips saying so.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "note: chromium not installed (needs root + apt); the browser test will skip"; fi; }

app: $(STAMP)
	$(BIN)/vl app $(ARGS)

# One process: timing-sensitive browser tests flaked with two workers on 2 cores. `make test ARGS="-n 2 --dist
# loadfile"` runs two test files at a time (pytest-xdist; about 10 min against 14, with that risk).
test: $(STAMP) browser
	$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=900 --durations=15 $(ARGS)

bench: $(STAMP)
	$(BIN)/vl bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
