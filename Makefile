# Two commands: `make app` (serve the demo model) and `make test` (the whole suite).
# Each bootstraps .venv from scratch when it is missing or pyproject.toml changed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: app test install clean bench

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, from the pinned local wheels (a bare `torch` would pull a multi-GB CUDA build)
	$(BIN)/pip install -q torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

app: $(STAMP)
	$(BIN)/vl app $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(ARGS)

bench: $(STAMP)
	$(BIN)/vl bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
