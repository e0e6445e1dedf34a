"""P-EAGLE (parallel drafting): an EAGLE-3 draft that proposes K tokens in ONE forward.

Layout as EAGLE-3's folder: ``config.py`` (torch-free), ``model.py`` (COD sampling, the parallel loss, the
draft composed of the EAGLE layout's modules), ``infer.py`` (one-forward proposals and the parallel
proposer), ``export.py``, ``serving.py`` (the EAGLE layout's engine fields plus the mask token),
``api.py``. What it shares with EAGLE-3 are modules of drafts/ (``eagle_config.py``, ``eagle_layers.py``,
``eagle_summary.py``, ``eagle_export.py``, ``eagle_serving.py``, ``eagle_supervision.py``), as the block
families share ``block*.py``. This file: the family's description, torch-free.
"""

from __future__ import annotations

from ..eagle_config import REQUIRED_KEYS, claimed_by_block_family
from ..family import Family, KRule, WeightRule
from . import serving
from .config import PEagleDraftConfig

__all__ = ["FAMILY"]


def recognises(config: dict) -> bool:
    """An EAGLE-layout config.json (one no block family recognises) with ``parallel_drafting``."""
    return bool(config.get("parallel_drafting")) and not claimed_by_block_family(config)


FAMILY = Family(
    supervision_module="draftsmith.drafts.eagle_supervision",
    name="peagle", display="P-EAGLE (parallel)", api="draftsmith.drafts.peagle.api", config=PEagleDraftConfig,
    supervision="eagle3", recognises=recognises, needs_mask_token=True,
    vllm_method="eagle3", vllm_arch="LlamaForCausalLMEagle3", parallel_drafting=True, speculators_type="peagle",
    vllm_writer=serving.vllm_config, speculators_writer=serving.speculators_fields,
    packing=True,  # doc_ids: attention, positions and COD draws per document (model.py, tests/drafts/test_peagle_packing.py)
    serve_k=KRule(("num_depths",), why="it is K for parallel drafting", bound=True),
    serve_k_missing="P-EAGLE draft has no num_depths in config.json; pass --num-speculative-tokens",
    sglang_refusal="P-EAGLE drafts (parallel_drafting: true) are not supported by SGLang; serve them with "
                   "`draftsmith serve vllm` (vLLM's parallel drafting)",
    required_keys=REQUIRED_KEYS,  # the EAGLE-layout config.json (drafts/eagle_config.py)
    weight_rules=(WeightRule("mask_hidden", present=True, problem=(
        "{where} (parallel_drafting: true) but 'mask_hidden' is missing from its weights, so they are not a "
        "P-EAGLE draft (vLLM's parallel drafting needs it); remove parallel_drafting from config.json, or pass "
        "the P-EAGLE checkpoint you meant")),),
)
