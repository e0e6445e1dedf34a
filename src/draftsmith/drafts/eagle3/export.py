"""Loading an exported EAGLE-3 draft (on-disk names: draftsmith's `model.`-prefixed ones, vLLM's
stripped ones, SGLang's `midlayer.*`) into an fp32 eval model. Writing is ``Eagle3Config.to_export``
plus ``state_dict()``."""

from __future__ import annotations

from typing import Optional

import torch

from ..eagle_config import refuse_other_family
from .config import Eagle3Config
from .model import Eagle3Draft

__all__ = ["layer_ids_from_export", "load_exported", "state_key"]


def layer_ids_from_export(config: dict) -> list[int]:
    """The engine layer ids an EAGLE-layout export reads (eagle_config.eagle_aux_hidden_state_layer_ids)."""
    refuse_other_family(config, "an EAGLE-3")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError("eagle_config.eagle_aux_hidden_state_layer_ids is missing; "
                         "add the target layer ids the draft was trained on")
    return [int(i) for i in ids]


def state_key(name: str) -> str:
    """On-disk name (draftsmith `model.`-prefixed or vLLM-stripped) -> Eagle3Draft state_dict name."""
    if name in ("lm_head.weight", "d2t", "t2d", "mask_hidden") or name.startswith("model."):
        return name
    if name.startswith("midlayer."):
        return "model.layers.0." + name[len("midlayer."):]
    return "model." + name


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  draft: Optional[Eagle3Draft] = None) -> Eagle3Draft:
    """An fp32 eval draft from an export. ``target_embeddings`` (V, H) fills ``embed_tokens`` for
    drafts saved without it (they share the target's, as vLLM does); ``t2d`` is rebuilt from
    ``d2t`` when an export dropped it. ``draft``: a fresh model to fill (P-EAGLE passes its own)."""
    draft = Eagle3Draft(Eagle3Config.from_export(config)) if draft is None else draft
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
