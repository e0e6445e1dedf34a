"""EAGLE-3 / EAGLE-3.1: one fused decoder layer over (token embedding, fused target state), trained
with the training-time-test unroll; a chain draft (K steps, one draft forward each).

Layout: ``config.py`` (the ``draft`` section, the model config and its config.json both ways; torch-free),
``model.py`` (TTT, loss, metrics), ``ttt.py`` (the TTT attention and loss in blocks of rows, and the
document rules of packed rows), ``infer.py`` (KV-cached steps and the chain proposer), ``export.py``
(loading an export), ``api.py`` (the family contract). What it shares with P-EAGLE are modules of
drafts/: ``eagle_config.py`` (shape, shared knobs, config.json keys), ``eagle_layers.py`` (the modules
and head), ``eagle_summary.py`` (metrics), ``eagle_export.py`` (on-disk names), ``eagle_serving.py``
(what vLLM and speculators read of its config.json; torch-free) and ``eagle_supervision.py`` (the
``eagle3`` kind). This file: the family's description, torch-free, which ``drafts/__init__.py`` registers.
"""

from __future__ import annotations

from .. import eagle_serving
from ..eagle_config import REQUIRED_KEYS
from ..family import Family, KRule, WeightRule
from .config import Eagle3DraftConfig

__all__ = ["FAMILY", "EAGLE3_ARCHS"]

# config.json architectures the offline evaluator loads as EAGLE-3 (vLLM / NeMo AutoModel / SGLang names)
EAGLE3_ARCHS = ("LlamaEagle3DraftModel", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM")


def recognises(config: dict) -> bool:
    """An EAGLE-layout config.json without parallel drafting. EAGLE-3 is also the registry's fallback:
    it takes any config.json no family recognises (plain third-party EAGLE-3 configs)."""
    return not isinstance(config.get("dflash_config"), dict) and not config.get("parallel_drafting")


FAMILY = Family(
    supervision_module="draftsmith.drafts.eagle_supervision",
    name="eagle3", display="EAGLE-3 (chain)", article="an", api="draftsmith.drafts.eagle3.api",
    config=Eagle3DraftConfig, supervision="eagle3", recognises=recognises, fallback=True, packing=True,
    eval_archs=EAGLE3_ARCHS, vllm_method="eagle3", vllm_method_aliases=("eagle",),
    vllm_arch="LlamaForCausalLMEagle3", speculators_type="eagle3",
    vllm_writer=eagle_serving.vllm_config, speculators_writer=eagle_serving.speculators_fields,
    serve_k_missing="EAGLE-3 drafts need --num-speculative-tokens K (the tokens drafted per step; 3 is a good "
                    "start, at most the ttt_steps it was trained with)",
    trained_depth=KRule(("draftsmith.ttt_steps",), why="the training-time-test unroll it was trained with"),
    required_keys=REQUIRED_KEYS,
    weight_rules=(WeightRule("mask_hidden", present=False, problem=(
        "{where} (no parallel_drafting) but its weights hold P-EAGLE's 'mask_hidden'; restore parallel_drafting: "
        "true, mask_token_id and num_depths in config.json, or pass the EAGLE-3 checkpoint you meant")),),
)
