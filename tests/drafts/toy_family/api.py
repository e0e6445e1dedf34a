"""The toy family's contract (drafts/__init__.py), built from EAGLE-3's public pieces by composition:
its model is an EAGLE-3 draft whose export names the toy architecture and family."""

from __future__ import annotations

from typing import Any, Optional

import torch

from draftsmith.drafts.eagle3 import api as eagle3
from draftsmith.drafts.eagle3.config import Eagle3Config, eagle_fields
from draftsmith.drafts.eagle3.export import load_exported as load_eagle3
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.drafts.family import FamilyCode

from . import ARCH

PROGRESS = eagle3.PROGRESS
layer_rule = eagle3.layer_rule
attach_target = eagle3.attach_target
summarize, scalars, describe = eagle3.summarize, eagle3.scalars, eagle3.describe
layer_ids_from_export = eagle3.layer_ids_from_export
Proposer = eagle3.Proposer  # the chain proposer runs any Eagle3Draft


class ToyDraft(Eagle3Draft):
    """EAGLE-3's modules, loss and TTT as they are; only the export names the toy."""

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        out = self.cfg.to_export(aux_layer_ids, torch_dtype)
        out["architectures"] = [ARCH]
        out["draftsmith"]["draft_type"] = "toy"
        return out


Model = ToyDraft


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> Eagle3Config:
    return Eagle3Config(**eagle_fields(info, draft, draft_vocab_size=draft_vocab_size, num_layer_ids=num_layer_ids),
                        ttt_steps=draft.ttt_steps, step_weight=draft.toy_weight)


def config_from_export(config: dict) -> Eagle3Config:
    return Eagle3Config(**Eagle3Config.export_fields(config))


def load_exported(config: dict, state: dict[str, torch.Tensor],
                  target_embeddings: Optional[torch.Tensor] = None) -> ToyDraft:
    return load_eagle3(config, state, target_embeddings, draft=ToyDraft(config_from_export(config)))


CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS)
