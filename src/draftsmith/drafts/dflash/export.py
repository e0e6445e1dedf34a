"""Loading an exported DFlash-family draft (``Qwen3DFlashDraftModel``, no ``model.`` prefix, the
target's embeddings and lm_head borrowed) and what its checkpoint's meta.json records. Writing is
``DFlashConfig.to_export`` plus ``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from .config import ARCH, DFlashConfig, config_from_export
from .model import DFlashDraft

__all__ = ["layer_ids_from_export", "checkpoint_meta", "load_exported"]


def layer_ids_from_export(config: dict) -> list[int]:
    """The ENGINE layer ids (our convention) a DFlash export reads: dflash_config.target_layer_ids + 1."""
    ids = (config.get("dflash_config") or {}).get("target_layer_ids")
    if not ids:
        raise ValueError("config.json has no dflash_config.target_layer_ids; a DFlash draft needs the target "
                         "layers it was trained on")
    return [int(i) + 1 for i in ids]


def checkpoint_meta(model: DFlashDraft) -> dict:
    """What a DFlash checkpoint's meta.json records besides the trainer's fields (docs/guides/families.md):
    block_size, mask_token_id and target_layer_ids (on-disk convention: engine id - 1)."""
    c = model.cfg
    return {"block_size": c.block_size, "mask_token_id": c.mask_token_id, "target_layer_ids": list(c.target_layer_ids)}


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  target_lm_head: Optional[torch.Tensor] = None, model_cls: Optional[type] = None,
                  cfg: Optional[DFlashConfig] = None) -> DFlashDraft:
    """An fp32 eval draft from an export (on-disk names); the target's embeddings and lm_head are borrowed
    (``target_lm_head`` None: the embeddings, as for a tied target)."""
    cfg = cfg or config_from_export(config)
    model = (model_cls or DFlashDraft)(cfg)
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"weights do not fit a {type(model).__name__}: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}; is this a {ARCH} checkpoint of this draftsmith?")
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items() if state[k].shape != v.shape]
    if bad:
        raise ValueError(f"weight shapes do not fit config.json: {'; '.join(bad[:3])}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    if target_embeddings is not None:
        model.attach_target(target_embeddings.float(), (target_lm_head if target_lm_head is not None
                                                        else target_embeddings).float())
    return model.eval()
