# The two set-up commands of the README: `make serve` and `make test`. Both create .venv if needed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# CPU build of torch for tests and the demo; a CUDA machine installs its own torch first.
TORCH   ?= torch==2.13.0
PUBLIC_PROTOS   := $(wildcard protos/radixserve/v1/*.proto)
INTERNAL_PROTOS := $(shell find protos/radixserve/internal -name '*.proto' 2>/dev/null)

.PHONY: serve test install protos check-protos lint lint-protos lint-size clean

$(STAMP): pyproject.toml setup.py clients/python/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e clients/python
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/radixserve serve --model demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Regenerate the protobuf / gRPC stubs (committed; `check-protos` proves they are current).
protos:
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=clients/python --pyi_out=clients/python \
	  --grpc_python_out=clients/python $(PUBLIC_PROTOS)
	test -z "$(INTERNAL_PROTOS)" || $(BIN)/python -m grpc_tools.protoc -I protos --python_out=protos/gen \
	  --pyi_out=protos/gen --grpc_python_out=protos/gen $(INTERNAL_PROTOS)

check-protos: protos
	git diff --exit-code -- clients/python/radixserve/v1 protos/gen

clean:
	rm -rf $(VENV) build *.egg-info clients/python/build clients/python/*.egg-info

# Ruff over the Python sources (rules and exclusions in pyproject.toml; E501 at 100 columns).
lint: $(STAMP)
	$(BIN)/ruff check .

# Line budgets (docs/conventions.md #3, tools/line_budget.py): 300 code lines a file; servers, entry
# points, client libraries and bench/ 450. tests/services/test_services_hygiene.py runs the same checker.
lint-size:
	$(BIN)/python tools/line_budget.py

# buf lint (STANDARD rules) over every contract, with a pinned buf from npm.
lint-protos:
	cd tools/buf && npm ci --silent
	tools/buf/node_modules/.bin/buf lint protos
