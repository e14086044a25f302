# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast demo bench clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# requirements.lock pins every transitive version seen working together here
	$(BIN)/pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

# everything but the model-loading tests, for a quick loop while editing
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow"

demo: $(STAMP)
	$(BIN)/python -m infra.demo

bench: $(STAMP)
	$(BIN)/python bench/registry.py
	$(BIN)/python bench/validation.py

clean:
	rm -rf .loragate demo-out bench/out
