"""Loading an exported DSpark draft (``Qwen3DSparkModel``: no ``model.`` prefix, the target's embeddings and
lm_head borrowed) and what its checkpoint's meta.json records. Writing is ``DSparkConfig.to_export`` plus
``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from ..block_infer import load_block_export
from .config import ARCH, config_from_export
from .model import DSparkDraft

__all__ = ["layer_ids_from_export", "checkpoint_meta", "load_exported"]


def layer_ids_from_export(config: dict) -> list[int]:
    """The ENGINE layer ids (our convention) a DSpark export reads: target_layer_ids + 1."""
    ids = config.get("target_layer_ids")
    if not ids:
        raise ValueError("config.json has no target_layer_ids; a DSpark draft needs the target layers it was "
                         "trained on")
    return [int(i) + 1 for i in ids]


def checkpoint_meta(model: DSparkDraft) -> dict:
    """What a DSpark checkpoint's meta.json records besides the trainer's fields."""
    c = model.cfg
    return {"block_size": c.block_size, "mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids),
            "markov_rank": c.markov_rank}


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  target_lm_head: Optional[torch.Tensor] = None) -> DSparkDraft:
    """An fp32 eval draft from an export (on-disk names); the target's embeddings and lm_head are borrowed
    (``target_lm_head`` None: the embeddings, as for a tied target)."""
    hint = f"is this a {ARCH} checkpoint of this draftsmith (enable_confidence_head and markov_rank as its weights say)?"
    return load_block_export(DSparkDraft(config_from_export(config)), state, target_embeddings, target_lm_head, hint)
