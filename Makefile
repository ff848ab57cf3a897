# xworkmate-bridge: the two commands a new machine needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: run test bench soak agents llmwiki profile-tools browser install lint clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	rm -f $(VENV)/.installed-* && touch $@

## run: install the Python dependencies and start the bridge on 127.0.0.1:8787
run: install
	$(BIN)/xworkmate-bridge serve

## agents: install the pinned real agents into the cache outside the work tree (reused when current)
agents:
	bash scripts/install-agents.sh

## llmwiki: install the pinned llmwiki-serve used by the knowledge-source tests (cached the same way)
llmwiki:
	bash scripts/install-llmwiki.sh >/dev/null

## profile-tools: the pinned tsx (for .ts profiles) and the agentproc SDK the profile tests use
profile-tools:
	bash scripts/install-profile-tools.sh >/dev/null

## browser: the system Chromium the settings-page test drives with Playwright (apt-get when missing)
browser:
	bash scripts/install-chromium.sh >/dev/null

## test: install everything and run every test (inside a loopback-only network namespace when root)
test: install agents llmwiki profile-tools browser
	bash scripts/run-tests.sh $(PYTEST_ARGS)

## lint: install the pinned linters and check the tree (ruff lint and format, pyright, the import layers)
lint: install
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[lint]'
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/pyright
	$(BIN)/lint-imports

## bench: the benchmark suite against minimal baselines (ratios, table + bench/results/latest.json; ~20 min)
bench: install
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[bench]'
	bash scripts/bench.sh $(BENCH_ARGS)

soak: install
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[bench]'
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
