"""Engine-ready copies of a trained draft.

vLLM's EAGLE-3 loader (``llama_eagle3.py``, vLLM 0.32) prefixes every non-``lm_head`` weight with
``model.`` itself, so the ``model.``-prefixed names draftsmith saves (the NeMo AutoModel layout)
would become ``model.model.*`` and be dropped. The vLLM copy therefore strips that prefix, keeps
``lm_head.weight`` and ``d2t`` (vLLM maps draft id -> target id as ``id + d2t[id]``), drops ``t2d``
(vLLM skips it) and renames the architecture to ``LlamaForCausalLMEagle3``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

VLLM_EAGLE3_ARCH = "LlamaForCausalLMEagle3"

# Explicit key map: on-disk draftsmith name -> vLLM name. Only the `model.` prefix changes;
# top-level tensors (lm_head.weight, d2t, mask_hidden) keep their names, t2d is dropped.
TOP_LEVEL_KEYS = ("lm_head.weight", "d2t", "mask_hidden")
DROPPED_KEYS = ("t2d",)


def vllm_key(name: str) -> str | None:
    """Map one draftsmith weight name to vLLM's, or None when vLLM does not read it."""
    if name in DROPPED_KEYS:
        return None
    if name in TOP_LEVEL_KEYS:
        return name
    return name[len("model."):] if name.startswith("model.") else name


def export_vllm(src: str | Path, dst: str | Path) -> Path:
    """Write a vLLM-loadable copy of the consolidated draft in ``src`` to ``dst`` (atomic)."""
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    state = load_file(str(src / "model.safetensors"))
    out = {}
    for name, tensor in state.items():
        new = vllm_key(name)
        if new is not None:
            out[new] = tensor
    config["architectures"] = [VLLM_EAGLE3_ARCH]
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file(out, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if dst.exists():
        shutil.rmtree(dst)
    os.replace(tmp, dst)
    return dst
