# One-command set-up for a fresh machine: `make demo` and `make test` create .venv, install
# flowkit with its dev extras, then run. CI runs `make test` (see .ci/run).
#
# torch: if the venv has no torch yet, $(TORCH) is installed first. On PyPI `torch==2.13.0` is the
# regular (CUDA-enabled on Linux) build; on machines that keep a CPU wheel on local disk, pip
# takes that instead of a multi-GB download. A GPU user who already has a torch build in the venv
# keeps it; choose another with `make TORCH='torch==2.x.y' test`.

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.flowkit-installed

.PHONY: setup test test-slow demo lint docs doctest clean

# The documentation site (warnings are errors; -E: fresh build, so no warning hides in a cache)
# and the examples of the docstrings and docs pages, run as doctests.
DOCS_BUILD := $(BIN)/sphinx-build -E -W --keep-going -q -b html docs docs/_build/html
DOCTEST := $(BIN)/pytest -q --doctest-modules flowkit --doctest-glob='*.md' docs --ignore=docs/gallery --ignore=docs/_build

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check flowkit tests demos
	$(BIN)/lint-imports

test: setup lint
	$(BIN)/pytest -m "not slow" -q
	$(DOCTEST)
	$(DOCS_BUILD)

test-slow: setup
	$(BIN)/pytest -m slow -q

docs: setup
	$(DOCS_BUILD)
	@echo "open docs/_build/html/index.html"

doctest: setup
	$(DOCTEST)

demo: setup  # the demo's own folder, replaced on every run (flowkit refuses to replace results)
	rm -rf runs/demo
	$(BIN)/flowkit toy --datasets moons --flows maf --out runs/demo

clean:
	rm -rf $(VENV) runs docs/_build
