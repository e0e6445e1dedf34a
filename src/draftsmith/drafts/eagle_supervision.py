"""The EAGLE families' supervision kind, ``eagle3`` (EAGLE-3's and P-EAGLE's; the kind keeps the name of the
family that introduced it, a registry and wire name), and its default layer-id rule (pure torch).

Registered with the engines when either family is (``Family.supervision_module``; draftsmith/supervision).

EAGLE-3 shift (one position): draft slot ``t`` reads ``(aux_t, embed(token_{t+1}))`` and learns the
target's distribution for ``token_{t+2}``, which is the target's logits at position ``t+1``. So aux
hidden states stay unshifted while ``input_ids``, ``loss_mask`` and logits shift left by one, with a
zero tail for the last slot (it has no next token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

from draftsmith.supervision import SupervisionKind, TargetError
from draftsmith.supervision.head import LOGITS_CHUNK_ELEMENTS, TargetHead, draft_vocab_targets
from draftsmith.supervision.layers import default_aux_layer_ids
from draftsmith.supervision.tensors import shift_left


@dataclass
class Eagle3Supervision:
    """EAGLE-3 training inputs and targets for one batch (slot t predicts token_{t+2}).

    aux_hidden:    (B, T, n, H) target states at the aux layers, UNSHIFTED (state after token t)
    input_ids:     (B, T) int64, token_{t+1} (zero tail)
    loss_mask:     (B, T) loss mask of token_{t+1} (zero tail)
    target_probs:  (B, T, Vd) float32 (bfloat16 for a bf16 target: head.probs_dtype), target distribution
                   for token_{t+2} over the draft vocab
    position_mask: (B, T) bool, loss_mask and the target's full-vocab argmax lies in the draft vocab
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor
    target_probs: Tensor
    position_mask: Tensor


def eagle3_supervision(batch, features, draft_ids: Optional[Tensor], *,
                       last_hidden: Optional[Tensor] = None, head: Optional[TargetHead] = None,
                       max_elements: int = LOGITS_CHUNK_ELEMENTS) -> Eagle3Supervision:
    """Turn a batch and its features into EAGLE-3 supervision.

    ``draft_ids`` (Vd,) int64 lists the target-vocab id of each draft-vocab entry (``t = d + d2t[d]``);
    ``None`` means the draft predicts the full vocab. The target's logits come either from
    ``last_hidden`` (B, S, H), the pre-norm state at layer id L, through ``head`` in chunks of positions
    (:func:`draft_vocab_targets`: no (B, S, V) tensor is ever built), or from ``features.logits``
    (B, S, V) when an engine returned them whole. Either way:
        target_probs = softmax(logits_shifted[..., draft_ids].float())          # renormalised over Vd
        position_mask = loss_mask_shifted & t2d[argmax_V logits_shifted]
    """
    if last_hidden is not None:
        if head is None:
            raise TargetError("eagle3 supervision: last_hidden given without the target head; pass head=TargetHead")
        probs, in_draft = draft_vocab_targets(last_hidden, head, draft_ids, max_elements=max_elements)
        device = last_hidden.device
    elif features.logits is not None:
        logits = features.logits  # (B, S, V), any float dtype
        flat = TargetHead(lambda x: x, int(logits.shape[-1]))  # rows are already logits
        probs, in_draft = draft_vocab_targets(logits, flat, draft_ids, max_elements=logits.numel())
        device = logits.device
    else:
        raise TargetError("eagle3 supervision needs the target's logits: features.logits is None and no layer-L "
                          "state was given; call features(..., logits=True) or targets.supervision_for")
    # Shifting the (B, S, Vd) probs and the small masks rather than the logits: they commute.
    loss_mask = shift_left(batch.loss_mask.to(device))
    return Eagle3Supervision(
        aux_hidden=features.aux_hidden,
        input_ids=shift_left(batch.input_ids.to(device)),
        loss_mask=loss_mask,
        target_probs=shift_left(probs),
        position_mask=loss_mask.bool() & shift_left(in_draft),
    )


KINDS = (SupervisionKind("eagle3", Eagle3Supervision, eagle3_supervision, logits=True, vocab=True, last=True),)
# EAGLE-3's rule always gives 3 ids, so it ignores the count
LAYER_RULES = {"eagle3": lambda L, n: default_aux_layer_ids(L)}
