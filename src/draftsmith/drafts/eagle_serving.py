"""What vLLM and speculators read of an EAGLE-layout draft's config.json, EAGLE-3's writers and the base
of P-EAGLE's (peagle/serving.py adds the mask token). Torch-free; serve/vllm.py calls these through the
family description, ``Family.vllm_writer`` / ``Family.speculators_writer``.

Facts (vLLM 0.32 ``model_executor/models/llama_eagle3.py``, ``transformers_utils/configs/speculators``):
vLLM reads ``eagle_config.use_aux_hidden_state`` (the fused target states, on for EAGLE-3) and the aux
layer ids from ``eagle_config.eagle_aux_hidden_state_layer_ids``; speculators' ``eagle3`` algorithm reads
``draft_vocab_size``, ``target_hidden_size``, the norm switches and the layer ids at the top level, and
defaults ``norm_before_residual`` to TRUE, so the draft's own value is always written.
"""

from __future__ import annotations

from .eagle_config import QWEN3_ARCHS, is_qwen3_shaped

__all__ = ["vllm_config", "speculators_fields"]


def vllm_config(out: dict) -> None:
    """Stamp what vLLM needs onto ``out`` (a deep copy of the draft's config.json, architectures already
    set to the family's Llama-shaped class): a Qwen3-shaped draft (``qk_norm``) is vLLM's
    Eagle3Qwen3ForCausalLM, the class that has the q_norm/k_norm its weights hold."""
    out.setdefault("eagle_config", {}).setdefault("use_aux_hidden_state", True)
    if is_qwen3_shaped(out):
        out["architectures"] = [QWEN3_ARCHS[0]]  # P-EAGLE too: vLLM registers PeagleQwen3ForCausalLM as this class
        out["model_type"] = "qwen3"


def speculators_fields(config: dict, layer: dict, speculators_type: str) -> dict:
    """The top-level fields of a speculators-format export (``speculators_model_type`` = the family's
    ``speculators_type``); sets ``layer`` (the transformer_layer_config) ``model_type`` to llama if unset."""
    layer.setdefault("model_type", "llama")
    eagle = config.get("eagle_config") or {}
    return {"architectures": ["Eagle3Speculator"], "draft_vocab_size": config.get("draft_vocab_size"),
            "target_hidden_size": config.get("target_hidden_size"), "speculators_model_type": speculators_type,
            "norm_before_residual": bool(config.get("norm_before_residual", False)),
            "norm_before_fc": bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
            "fc_norm": bool(config.get("fc_norm", False)), "norm_output": bool(config.get("norm_output", False)),
            "eagle_aux_hidden_state_layer_ids": eagle.get("eagle_aux_hidden_state_layer_ids")}
