"""JetSpec: the DFlash draft with causal attention inside the block, distilled from the target.

Model math only. Same modules and on-disk format as DFlash (``dflash_config.causal: true``; vLLM
then runs the block causally). Differences (DRAFT_FAMILIES 2.8):
- visibility: in-block keys j' <= i (a drafted position never sees the MASK slots after it);
- loss: forward KL to the target's own next-token distribution. Block position k (k >= 1) predicts
  the token at anchor + k, whose target distribution is the target's logits at sequence position
  anchor + k - 1 (on the ground-truth prefix):
      loss = sum_m KL(softmax(t_m / T) || softmax(s_m / T)) * T^2 / #m    (no depth weighting)
  over the supervised positions m (DFlash's label mask), in fp32;
- accuracy and accept length compare the draft's argmax with the target's argmax, not the data token.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from ..layers import LossParts
from . import api as dflash  # the DFlash contract this family reuses
from .config import DFlashConfig
from .model import DFlashDraft, DFlashOutput, block_metrics

PROGRESS = dflash.PROGRESS


def teacher_positions(anchor: torch.Tensor, block_size: int) -> torch.Tensor:
    """(B, N) anchors -> (B, N, bs) sequence position of each block position's teacher: anchor + k - 1
    (k = 0, the anchor itself, is never supervised; its entry, anchor - 1, is clamped at 0)."""
    k = torch.arange(block_size, device=anchor.device)
    return (anchor[..., None] + k - 1).clamp(min=0)


def kd_parts(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> LossParts:
    """Mean over rows of KL(softmax(t/T) || softmax(s/T)) * T^2 as loss parts; student/teacher (M, V), fp32."""
    t = F.log_softmax(teacher.float() / temperature, -1)
    s = F.log_softmax(student.float() / temperature, -1)
    kl = (t.exp() * (t - s)).sum(-1)  # (M,)
    return LossParts.of([kl.sum()], [kl.numel()], [temperature ** 2])


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """:func:`kd_parts` as a scalar."""
    return kd_parts(student, teacher, temperature).loss()


class JetSpecDraft(DFlashDraft):
    """DFlash modules, causal blocks, KD loss against the target's logits (``dflash_kd`` supervision)."""

    draft_type = "jetspec"

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> DFlashOutput:
        b, n, bs, _ = h.shape
        pos = teacher_positions(anchor, bs)  # (B, N, bs)
        rows = torch.arange(b, device=h.device)[:, None, None].expand_as(pos)
        teacher = sup.logits[rows[lmask], pos[lmask]]  # (M, V) gathered: the (B, S, V) tensor is never copied
        student = self.logits(h[lmask]).float()  # (M, V)
        parts = kd_parts(student, teacher, float(self.cfg.extra.get("kd_temperature", 1.0)))
        correct = torch.zeros_like(lmask)
        correct[lmask] = student.argmax(-1) == teacher.argmax(-1)
        return DFlashOutput(parts.loss(), block_metrics(correct.detach(), lmask), parts)


# ---------------------------------------------------------------------------------- family contract
Model = JetSpecDraft
layer_rule = dflash.layer_rule
layer_ids_from_export = dflash.layer_ids_from_export
attach_target = dflash.attach_target
Proposer = dflash.Proposer
checkpoint_meta = dflash.checkpoint_meta
summarize, scalars, describe = dflash.summarize, dflash.scalars, dflash.describe


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> DFlashConfig:
    cfg = dflash.config_from_target(info, draft, draft_vocab_size=draft_vocab_size, num_layer_ids=num_layer_ids,
                                    layer_ids=layer_ids)
    if not draft.kd_temperature > 0:
        raise ValueError(f"kd_temperature={draft.kd_temperature!r} must be > 0; 1.0 distils the plain distribution")
    cfg.causal, cfg.extra = True, {"kd_temperature": float(draft.kd_temperature)}
    return cfg


def config_from_export(config: dict) -> DFlashConfig:
    own = config.get("draftsmith") or {}
    cfg = dflash.config_from_export(config, extra={"kd_temperature": float(own.get("kd_temperature", 1.0))})
    if not cfg.causal:
        raise ValueError("config.json has no dflash_config.causal: true; this is a DFlash draft, not JetSpec")
    return cfg


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  target_lm_head: Optional[torch.Tensor] = None) -> JetSpecDraft:
    return dflash.load_exported(config, state, target_embeddings, target_lm_head, model_cls=JetSpecDraft,
                                cfg=config_from_export(config))
