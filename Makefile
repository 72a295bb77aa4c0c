# specgym: `make demo` runs the main job on the shipped data, `make test` runs the tests.
# Both create .venv and install everything on a fresh machine (torch pinned to the CPU build 2.13.0).

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.specgym-installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[hf,train,test]" "$(TORCH)"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specgym demo

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/specgym bench

clean:
	rm -rf $(VENV) runs out .pytest_cache .hypothesis
