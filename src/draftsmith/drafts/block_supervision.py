"""The block families' supervision kinds (DFlash, JetSpec, Domino, DSpark) and their layer ids (pure torch).

Registered with the engines when one of those families is (``Family.supervision_module``).

    dflash     unshifted aux states, ids and loss mask (offsets such as Domino's shift_label are
               applied by the draft, never here)
    dflash_kd  dflash plus the target's state at id L (B, S, H), unshifted (the target's distribution
               that JetSpec and DSpark distil)

DFlash has no shift at all: it uses same-position alignment (block position ``k`` after an anchor
predicts the token at ``anchor + k``) and its block mask handles anchors, so everything stays at the
position it came from. Logits row ``t`` is the target's distribution for token ``t+1``.

Layer ids: engines use engine ids (draftsmith/supervision/layers.py: id ``i`` = the residual stream after
``i`` decoder layers). DFlash checkpoints (``dflash_config.target_layer_ids``) use the HF-hook convention
instead: id ``j`` is the output of decoder layer ``j`` (0-based), i.e. HF ``hidden_states[j + 1]``, i.e.
engine id ``j + 1``. vLLM reads those files the same way (``i + 1 for i in dflash_config.target_layer_ids``).
So DFlash hook ids ``0..L-1`` are engine ids ``1..L``; the embeddings (engine id 0) have no DFlash id.
:func:`dflash_layer_ids` returns engine ids; :func:`dflash_ids_to_engine` and
:func:`engine_ids_to_dflash` convert at the checkpoint boundary. Qwen3-8B (L = 36), 5 ids: hook ids
``[1, 9, 17, 25, 33]`` = engine ids ``[2, 10, 18, 26, 34]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

from draftsmith.supervision import SupervisionKind, TargetError
from draftsmith.supervision.head import TargetHead
from draftsmith.supervision.layers import validate_layer_ids
from draftsmith.supervision.tensors import same_positions


def dflash_layer_ids(num_layers: int, n: int) -> list[int]:
    """DFlash's default ``n`` context layers of an ``L``-layer target, as ENGINE ids (``1..L``).

    The reference rule (``build_target_layer_ids(L, n)`` of DFlash / SpecForge / speculators) picks
    HF-hook ids (output of decoder layer ``j``): ``[L // 2]`` when n == 1, else
    ``round(1 + i * (L - 4) / (n - 1))`` for i = 0..n-1 with Python's round (half to even), evenly
    spaced over hook ids ``1..L-3``. Hook id ``j`` is engine id ``j + 1``, so this returns those plus
    one: L = 36, n = 5 -> hook ``[1, 9, 17, 25, 33]`` -> ``[2, 10, 18, 26, 34]``. Write them back to
    a checkpoint with :func:`engine_ids_to_dflash`.
    """
    L = int(num_layers)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TargetError(f"DFlash target layers: the count {n!r} must be an integer >= 1 "
                          f"(one id per context layer the draft reads)")
    if n == 1:
        if L < 1:
            raise TargetError(f"target.aux_layer_ids: a {L}-layer target has no decoder layer for DFlash to read")
        hook = [L // 2]
    else:
        start, end = 1, L - 3
        if end - start + 1 < n:  # a step below 1 would repeat ids
            raise TargetError(
                f"target.aux_layer_ids: a {L}-layer target has only {max(end, 0)} DFlash default layers "
                f"(decoder outputs 1..{end}) for {n} ids; set target.aux_layer_ids explicitly "
                f"({n} distinct engine ids in 1..{L})"
            )
        span = end - start
        hook = [int(round(start + (i * span) / (n - 1))) for i in range(n)]
    return dflash_ids_to_engine(hook)


def dflash_ids_to_engine(ids: Sequence[int]) -> list[int]:
    """DFlash ``dflash_config.target_layer_ids`` (output of decoder layer ``j``) -> engine ids ``j + 1``."""
    out = []
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TargetError(f"dflash_config.target_layer_ids: {v!r} is not a decoder-layer index; "
                              f"use integers >= 0 (output of decoder layer j, 0-based)")
        out.append(v + 1)
    return out


def engine_ids_to_dflash(ids: Sequence[int], num_layers: int) -> list[int]:
    """Engine ids ``1..L`` -> DFlash ``dflash_config.target_layer_ids`` ``i - 1`` (for checkpoints).

    Engine id 0 is the embedding output, which no decoder layer produces, so it is refused.
    """
    L = int(num_layers)
    ids = validate_layer_ids(ids, L)
    if 0 in ids:
        raise TargetError(
            f"target.aux_layer_ids: layer id 0 (the embeddings) in {ids} has no DFlash target_layer_ids "
            f"equivalent; DFlash reads decoder-layer outputs, ids 1..{L}: replace 0 with an id in 1..{L}"
        )
    return [i - 1 for i in ids]


@dataclass
class DFlashSupervision:
    """DFlash training inputs for one batch, all UNSHIFTED (block position k predicts token anchor+k).

    aux_hidden: (B, S, n, H) target states at the requested engine ids, UNSHIFTED (state after token t)
    input_ids:  (B, S) int64, token t, UNSHIFTED
    loss_mask:  (B, S) loss mask of token t (1 on assistant tokens), UNSHIFTED, the batch's dtype
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor


@dataclass
class DFlashKDSupervision:
    """JetSpec (DFlash with knowledge distillation) training inputs for one batch, all UNSHIFTED.

    aux_hidden:  (B, S, n, H) as in :class:`DFlashSupervision`
    input_ids:   (B, S) int64, token t
    loss_mask:   (B, S) loss mask of token t
    last_hidden: (B, S, H) the target's pre-norm state at id L, engine dtype: lm_head(final_norm(row t))
                 is its distribution for token t+1 (the teacher of block position k: row anchor+k-1)
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor
    last_hidden: Tensor


def dflash_supervision(batch, features) -> DFlashSupervision:
    """DFlash supervision: aux states, ids and loss mask exactly as they are, with NO shift.

    DFlash uses same-position alignment (block position k predicts the token at anchor + k; the
    draft's block mask handles anchors), so nothing moves. SpecForge once applied an EAGLE-style
    shift here, which was a bug (SpecForge PR #472). ``features.logits`` is ignored. The tensors are
    the batch's and the features' own (moved to the aux states' device; no copy when already there).
    """
    aux = features.aux_hidden  # (B, S, n, H)
    same_positions("dflash", batch, "features.aux_hidden", aux)
    return DFlashSupervision(
        aux_hidden=aux,
        input_ids=batch.input_ids.to(device=aux.device, dtype=torch.int64),  # (B, S)
        loss_mask=batch.loss_mask.to(aux.device),  # (B, S)
    )


def dflash_kd_supervision(batch, features, last_hidden: Optional[Tensor] = None,
                          head: Optional[TargetHead] = None) -> DFlashKDSupervision:
    """JetSpec KD supervision: :func:`dflash_supervision` plus the target's state at id L, all UNSHIFTED.

    ``last_hidden`` (B, S, H): the pre-norm state at id L (:func:`draftsmith.targets.supervision_for`),
    engine dtype; ``features.logits`` and ``head`` are unused: the draft holds the target's final norm
    and lm_head and builds the logits of just the rows its blocks need. loss_mask is 0 on pads.
    """
    if last_hidden is None:
        raise TargetError("dflash_kd supervision needs last_hidden, the target's (B, S, H) state at layer id L, not "
                          "features.logits; build it with targets.supervision_for (its engine needs its head weights)")
    base, dev = dflash_supervision(batch, features), last_hidden.device
    same_positions("dflash_kd", batch, "last_hidden", last_hidden)
    return DFlashKDSupervision(aux_hidden=base.aux_hidden, input_ids=base.input_ids.to(dev),
                               loss_mask=base.loss_mask.to(dev), last_hidden=last_hidden)


KINDS = (
    SupervisionKind("dflash", DFlashSupervision, dflash_supervision, logits=False, vocab=False),
    SupervisionKind("dflash_kd", DFlashKDSupervision, dflash_kd_supervision, logits=True, vocab=False, last=True),
)
LAYER_RULES = {"dflash": lambda L, n: dflash_layer_ids(L, n if n is not None else 1)}
