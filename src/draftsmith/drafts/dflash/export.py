"""Loading an exported DFlash-family draft (``Qwen3DFlashDraftModel``, no ``model.`` prefix, the
target's embeddings and lm_head borrowed) and what its checkpoint's meta.json records. Writing is
``DFlashConfig.to_export`` plus ``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from ..block_infer import load_block_export
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
    return load_block_export((model_cls or DFlashDraft)(cfg), state, target_embeddings, target_lm_head,
                             f"is this a {ARCH} checkpoint of this draftsmith?")
