"""JetSpec: the DFlash draft with causal attention inside the block, distilled from the target.

Model math only. Same modules and on-disk format as DFlash (``dflash_config.causal: true``; vLLM
then runs the block causally). Differences (docs/guides/families.md):
- visibility: in-block keys j' <= i (a drafted position never sees the MASK slots after it);
- loss: forward KL to the target's own next-token distribution. Block position k (k >= 1) predicts
  the token at anchor + k, whose target distribution is the target's logits at sequence position
  anchor + k - 1 (on the ground-truth prefix):
      loss = sum_m KL(softmax(t_m / T) || softmax(s_m / T)) * T^2 / #m    (no depth weighting)
  over the supervised positions m (DFlash's label mask), in fp32;
- accuracy and accept length compare the draft's argmax with the target's argmax, not the data token.
The teacher logits are the draft's to compute: ``dflash_kd`` supervision carries the target's
pre-norm state at layer id L (``last_hidden``, (B, S, H)) and the draft holds the target's final
norm (a non-persistent buffer: never in a checkpoint) beside its borrowed lm_head, so
    t = lm_head(final_norm(last_hidden[b, anchor + k - 1]))
row by row, in the chunks of drafts/chunked.py: no (B, S, V) tensor crosses an engine or the wire,
and no (M, V) one exists while V is large.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..chunked import chunked_soft_ce
from ..family import FamilyCode
from ..layers import LossParts
from . import api as dflash  # the DFlash contract this family reuses
from .config import DFlashConfig
from ..block import BlockDraft, teacher_positions
from .model import DFlashOutput, block_metrics

PROGRESS = dflash.PROGRESS


class JetSpecDraft(BlockDraft):
    """DFlash modules, causal blocks, KD loss against the target's logits, which it rebuilds from the
    target's last state (``dflash_kd`` supervision) with the target's final norm and lm_head."""

    draft_type = "jetspec"

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> DFlashOutput:
        b, n, bs, _ = h.shape
        pos = teacher_positions(anchor, bs)  # (B, N, bs)
        rows = torch.arange(b, device=h.device)[:, None, None].expand_as(pos)
        r, p = rows[lmask], pos[lmask]  # (M,) each: the teacher row of each supervised position
        last = sup.last_hidden  # (B, S, H) target states at id L
        v, budget = self.vocab_rows, self.max_logit_elements
        if last.shape[0] * last.shape[1] * v <= budget:
            # small: the whole (B, S, V) product, as the engine's lm_head ran it (one GEMM of that shape
            # rounds as the engine's did; rows gathered first could round differently), then its rows
            full = self.teacher_logits(last)  # (B, S, H) -> (B, S, V)

            def teacher(sl: slice) -> torch.Tensor:
                return full[r[sl], p[sl]]  # (c, V)
        else:
            def teacher(sl: slice) -> torch.Tensor:
                return self.teacher_logits(last[r[sl], p[sl]])  # (c, H) -> (c, V): one chunk's rows only

        temperature = float(self.cfg.extra.get("kd_temperature", 1.0))
        kl, hits = chunked_soft_ce(h[lmask], self.logits, teacher, vocab_size=v, temperature=temperature,
                                   max_elements=budget)
        parts = LossParts.of([kl], [lmask.sum()], [temperature ** 2])  # mean KL x T^2
        correct = torch.zeros_like(lmask)
        correct[lmask] = hits
        return DFlashOutput(parts.loss(), block_metrics(correct.detach(), lmask), parts)


# ---------------------------------------------------------------------------------- family contract
Model = JetSpecDraft
layer_rule = dflash.layer_rule
layer_ids_from_export = dflash.layer_ids_from_export
Proposer = dflash.Proposer
checkpoint_meta = dflash.checkpoint_meta
summarize, scalars, describe = dflash.summarize, dflash.scalars, dflash.describe


def attach_target(model: JetSpecDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any, layer: Any = None) -> None:
    """DFlash's (embeddings, lm_head) plus the target's final norm: the KD teacher's head."""
    lm_head, norm = head()
    model.attach_target(embeddings, lm_head)
    model.attach_teacher(norm, model.cfg.rms_norm_eps)  # config_from_target copies the target's eps


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


CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS, checkpoint_meta=checkpoint_meta)
