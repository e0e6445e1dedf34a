"""Loading an exported EAGLE-layout draft (EAGLE-3, P-EAGLE), whichever tool wrote it: the on-disk names
(draftsmith's `model.`-prefixed ones, vLLM's stripped ones, SGLang's `midlayer.*`) mapped to the state
names of a draft built by eagle_layers.add_eagle_modules, and its aux layer ids. Each family's export.py
builds its own fresh model from its config and fills it here. Writing is the family's ``to_export`` plus
``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .eagle_config import refuse_other_family

__all__ = ["aux_layer_ids", "state_key", "load_eagle_state"]


def aux_layer_ids(config: dict, expected: str) -> list[int]:
    """The engine layer ids an EAGLE-layout export reads (eagle_config.eagle_aux_hidden_state_layer_ids);
    a block family's config.json is refused naming ``expected`` (the loader's draft: "an EAGLE-3")."""
    refuse_other_family(config, expected)
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError("eagle_config.eagle_aux_hidden_state_layer_ids is missing; "
                         "add the target layer ids the draft was trained on")
    return [int(i) for i in ids]


def state_key(name: str) -> str:
    """On-disk name (draftsmith `model.`-prefixed or vLLM-stripped) -> the draft's state_dict name."""
    if name in ("lm_head.weight", "d2t", "t2d", "mask_hidden") or name.startswith("model."):
        return name
    if name.startswith("midlayer."):
        return "model.layers.0." + name[len("midlayer."):]
    return "model." + name


def load_eagle_state(draft: nn.Module, state: dict[str, torch.Tensor],
                     target_embeddings: Optional[torch.Tensor] = None) -> nn.Module:
    """``draft`` (a fresh model of the export's config) filled from ``state`` (on-disk names), as an fp32
    eval model. ``target_embeddings`` (V, H) fills ``embed_tokens`` for drafts saved without it (they
    share the target's, as vLLM does); ``t2d`` is rebuilt from ``d2t`` when an export dropped it."""
    state = {state_key(k): v for k, v in state.items()}
    if draft.cfg.pruned and "d2t" in state and "t2d" not in state:
        t2d = torch.zeros(draft.cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(draft.cfg.draft_vocab_size) + state["d2t"].long()] = True
        state["t2d"] = t2d
    if "model.embed_tokens.weight" not in state:
        if target_embeddings is None:
            raise ValueError("the draft has no embed_tokens; pass the target's embeddings to share them")
        state["model.embed_tokens.weight"] = target_embeddings.detach().float().cpu()
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the config (missing {missing[:4]}, unexpected {unexpected[:4]}); "
                         "re-export the draft")
    return draft.float().eval().requires_grad_(False)
