# specgym: `make demo` runs the main job on the shipped data, `make test` runs the tests.
# Both create .venv and install everything on a fresh machine (torch pinned to the CPU build 2.13.0).

VENV    ?= .venv
PYTHON  ?= python3
PY      := $(VENV)/bin/python
TORCH   := torch==2.13.0
STAMP   := $(VENV)/.specgym-installed
PYTEST_ARGS ?=

.PHONY: install demo test test-fast bench results models profile record clean

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
	rm -rf $(VENV) runs out .pytest_cache .hypothesis
