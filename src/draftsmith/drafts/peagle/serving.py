"""What vLLM and speculators read of a P-EAGLE draft: the EAGLE layout's fields (composed,
drafts/eagle_serving.py) plus the mask token of the parallel slots. Torch-free.

Facts (vLLM 0.32 ``v1/spec_decode/llm_base_proposer.py`` ``_init_parallel_drafting_params``): the mask
token is read from ``dflash_config.mask_token_id``, ``mask_token_id``, ``pard_token`` or ``ptd_token_id``,
in that order; 0.32 reads ``mask_token_id`` itself and ``pard_token`` is stamped as well for releases that
only read that. speculators' ``peagle`` algorithm reads ``mask_token_id``.
"""

from __future__ import annotations

from .. import eagle_serving
from ..family import mask_token

__all__ = ["vllm_config", "speculators_fields"]


def vllm_config(out: dict) -> None:
    """The EAGLE layout's stamps, then ``pard_token`` from ``mask_token_id`` unless a key vLLM reads holds it;
    ValueError when the config has no mask token at all."""
    eagle_serving.vllm_config(out)
    if any(k in out for k in ("pard_token", "ptd_token_id")) or (out.get("dflash_config") or {}).get("mask_token_id") is not None:
        return
    if out.get("mask_token_id") is None:
        raise ValueError("P-EAGLE draft (parallel_drafting: true) has no mask token: set mask_token_id in its "
                         "config.json to the reserved token it was trained with")
    out["pard_token"] = int(out["mask_token_id"])


def speculators_fields(config: dict, layer: dict, speculators_type: str) -> dict:
    """The EAGLE layout's speculators fields plus ``mask_token_id``."""
    return {**eagle_serving.speculators_fields(config, layer, speculators_type), "mask_token_id": mask_token(config)}
