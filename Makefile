# specgym: `make demo` runs the main job on the shipped data, `make test` runs the tests.
# Both create .venv and install everything on a fresh machine (torch pinned to the CPU build 2.13.0).

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.specgym-installed
PYTEST_ARGS ?=
# The editable install is setuptools' strict mode: a link tree under build/ that static tools (mypy, pyright) follow.
# It lists files, so a new or removed file needs a reinstall: the stamp depends on the list of package files.
PKG_FILES := $(shell find specgym envs agents baselines training eval data -type f -not -path '*/__pycache__/*' \
               -not -name '*.pyc' 2>/dev/null | LC_ALL=C sort)

.PHONY: install demo test test-fast lint bench results models profile record clean FORCE

$(VENV)/.files: FORCE
	@mkdir -p $(VENV)
	@echo "$(PKG_FILES)" | cmp -s - $@ || echo "$(PKG_FILES)" > $@

$(STAMP): pyproject.toml $(VENV)/.files
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	@# PYTHONWARNINGS: setuptools prints a notice about the strict link tree (under build/) on every install
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -e ".[hf,train,test]" "$(TORCH)" \
		--config-settings editable_mode=strict
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/specgym demo

# ruff on the checkout; mypy on the installed package (run outside the checkout root, where only the front door
# folder would be visible); then the whole test suite, the wheel smoke test included.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	cd $(VENV) && ./bin/mypy -p specgym --config-file ../pyproject.toml

test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/specgym bench

# --- the README's results table: PPO (K and token mode) on every shipped workload vs all baselines (~20 min) ---
RESULT_WORKLOADS ?= speclane-mix assc-regimes tinypair-greedy tinypair-t08

results: $(STAMP)
	for wl in $(RESULT_WORKLOADS); do \
	  for mode in k token; do \
	    $(VENV)/bin/specgym train --workload $$wl --mode $$mode --out runs/ppo-$$wl-$$mode --force && \
	    $(VENV)/bin/specgym export runs/ppo-$$wl-$$mode --out runs/ppo-$$wl-$$mode/policy --force || exit 1; \
	  done; \
	  $(VENV)/bin/specgym eval --workload $$wl --force --out out/results-$$wl \
	    --controllers all,ppo:runs/ppo-$$wl-k/policy,ppo:runs/ppo-$$wl-token/policy || exit 1; \
	done

# --- rebuilding the shipped model pair and its traces (long; one thread each, offline) -----------------------
LIVE_ENV := HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
SPECGYM  := $(LIVE_ENV) $(VENV)/bin/specgym
PROMPTS  := data/workloads/tinypair-prompts.jsonl
PROFILE  := data/profiles/cpu-tinypair.json

models: $(STAMP)   # ~90 min: corpus, tokenizer, target (78 min), draft (7 min), export, prompts, model card
	$(SPECGYM) train-lm-pair --stages corpus,tokenizer,tokens,target
	$(SPECGYM) train-lm-pair --stages draft --draft 1,128,2 --draft-role draft_ce --no-distill --draft-budget-min 7
	$(SPECGYM) train-lm-pair --stages export,prompts,card --draft-role draft_ce

profile: $(STAMP)  # ~1 min: measured cost profile of the shipped pair on this machine
	$(SPECGYM) profile --out $(PROFILE) --name cpu-tinypair --clock cpu --force

record: $(STAMP)   # ~12 min: the two shipped recorded workloads (greedy and T=0.8)
	$(SPECGYM) record --prompts $(PROMPTS) --max-new-tokens 128-256 --temperature 0 --name tinypair-greedy \
		--profile $(PROFILE) --gen-k 1 --quiet --force --out data/workloads/tinypair-greedy.parquet
	$(SPECGYM) record --prompts $(PROMPTS) --max-new-tokens 128-256 --temperature 0.8 --name tinypair-t08 \
		--profile $(PROFILE) --gen-k 1 --seed 1 --quiet --force --out data/workloads/tinypair-t08.parquet

clean:
	rm -rf $(VENV) build runs out .pytest_cache .hypothesis
