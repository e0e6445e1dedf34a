"""Loading an exported DSpark draft (``Qwen3DSparkModel``: no ``model.`` prefix, the target's embeddings and
lm_head borrowed) and what its checkpoint's meta.json records. Writing is ``DSparkConfig.to_export`` plus
``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

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
    model = DSparkDraft(config_from_export(config))
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"weights do not fit a DSparkDraft: missing {missing[:4]}, unexpected {unexpected[:4]}; "
                         f"is this a {ARCH} checkpoint of this draftsmith (enable_confidence_head and markov_rank "
                         "as its weights say)?")
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items() if state[k].shape != v.shape]
    if bad:
        raise ValueError(f"weight shapes do not fit config.json: {'; '.join(bad[:3])}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    if target_embeddings is not None:
        model.attach_target(target_embeddings.float(), (target_lm_head if target_lm_head is not None
                                                        else target_embeddings).float())
    return model.eval()
