"""Loading an exported P-EAGLE draft into a PEagleDraft, after checking its learned ``mask_hidden``
(drafts/eagle_export.py reads the EAGLE layout's on-disk names). Writing is ``PEagleConfig.to_export``
plus ``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from ..eagle_export import aux_layer_ids, load_eagle_state
from .config import PEagleConfig
from .model import PEagleDraft

__all__ = ["load_exported", "layer_ids_from_export"]


def layer_ids_from_export(config: dict) -> list[int]:
    """The engine layer ids a P-EAGLE export reads (eagle_config.eagle_aux_hidden_state_layer_ids)."""
    return aux_layer_ids(config, "a P-EAGLE")


def load_exported(config: dict, state: dict[str, torch.Tensor],
                  target_embeddings: Optional[torch.Tensor] = None) -> PEagleDraft:
    """An fp32 eval P-EAGLE draft from an export (``state``: on-disk names, ``mask_hidden`` top level)."""
    cfg = PEagleConfig.from_export(config)
    width = cfg.num_aux * cfg.target_hidden_size
    mask = state.get("mask_hidden")
    if mask is None or mask.numel() != width:
        got = "is missing" if mask is None else f"has shape {tuple(mask.shape)}"
        raise ValueError(f"mask_hidden {got}; a P-EAGLE draft needs its learned mask_hidden of {width} values "
                         f"(num_aux {cfg.num_aux} x target_hidden_size {cfg.target_hidden_size}); re-export it")
    # vLLM reshapes mask_hidden to (1, n*Ht) whatever its saved shape; ours is (1, 1, n*Ht)
    state = {**state, "mask_hidden": mask.reshape(1, 1, width)}
    return load_eagle_state(PEagleDraft(cfg), state, target_embeddings)
