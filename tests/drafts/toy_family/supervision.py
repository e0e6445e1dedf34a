"""The toy family's own supervision kind, ``toy_next``: slot t reads the aux states at t and token t+1 and
learns token t+2. Pure torch over the engines' Batch and Features; the family's description names this
module, so registering the family declares KINDS to draftsmith.supervision and every engine builds it."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from draftsmith.supervision import SupervisionKind
from draftsmith.supervision.tensors import shift_left


@dataclass
class ToySupervision:
    """aux_hidden (B, S, n, H) unshifted; next_ids (B, S) token t+1; labels (B, S) token t+2; label_mask (B, S)
    the loss mask of token t+2 (zero tails)."""

    aux_hidden: Tensor
    next_ids: Tensor
    labels: Tensor
    label_mask: Tensor


def build(batch, features) -> ToySupervision:
    aux = features.aux_hidden
    ids = batch.input_ids.to(device=aux.device, dtype=torch.int64)
    return ToySupervision(aux_hidden=aux, next_ids=shift_left(ids, 1), labels=shift_left(ids, 2),
                          label_mask=shift_left(batch.loss_mask.to(aux.device), 2))


KINDS = (SupervisionKind("toy_next", ToySupervision, build, logits=False, vocab=False),)
