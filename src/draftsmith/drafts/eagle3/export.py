"""Loading an exported EAGLE-3 draft into an fp32 eval model (drafts/eagle_export.py reads every tool's
on-disk names). Writing is ``Eagle3Config.to_export`` plus ``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from ..eagle_export import aux_layer_ids, load_eagle_state
from .config import Eagle3Config
from .model import Eagle3Draft

__all__ = ["layer_ids_from_export", "load_exported"]


def layer_ids_from_export(config: dict) -> list[int]:
    """The engine layer ids an EAGLE-3 export reads (eagle_config.eagle_aux_hidden_state_layer_ids)."""
    return aux_layer_ids(config, "an EAGLE-3")


def load_exported(config: dict, state: dict[str, torch.Tensor],
                  target_embeddings: Optional[torch.Tensor] = None) -> Eagle3Draft:
    """An fp32 eval draft from an export. ``target_embeddings`` (V, H) fills ``embed_tokens`` for
    drafts saved without it (they share the target's, as vLLM does); ``t2d`` is rebuilt from
    ``d2t`` when an export dropped it."""
    return load_eagle_state(Eagle3Draft(Eagle3Config.from_export(config)), state, target_embeddings)
