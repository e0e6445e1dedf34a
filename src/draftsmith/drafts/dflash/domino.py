"""Domino: a DFlash draft plus a GRU correction head over the tokens already in the block.

Model math only. docs/guides/families.md (SpecForge #571), ``dflash_config.projector_type: domino``:
    prefix_gru = GRU(H -> G, 1 layer, no bias)                     keys prefix_gru.{weight_ih_l0,weight_hh_l0}
    embed_proj = Linear(H + G -> E) -> SiLU -> Linear(E -> V)       keys embed_proj.{0,2}.weight
With ``shift_label`` (o = 1) block slot k predicts token anchor + k + 1, so all bs slots draft;
without it (o = 0) slot k predicts anchor + k and slot 0 predicts nothing. The slot predicting token
anchor + m reads g_{m-1}, the GRU state after the tokens anchor .. anchor + m - 1 (ground truth
while training, the drafted ones at inference: a short sequential walk over the block).
    base_k  = lm_head(h_k)
    final_k = base_k                              for drafted rows r < pure_draft_prefix_len
            = base_k + embed_proj([h_k | g_k])    otherwise
    loss    = (1 - lam) * CE_w(final) + lam * CE_w(base)      (same decay-weighted normalisation)
    lam     = clamp(start * (1 - min(step / max(1, int(total * decay_ratio)), 1)), 0, 1)
at the trainer's optimizer step (``set_progress``), so resume restores it with the step.
vLLM has no Domino model: serve refuses it; ``draftsmith eval`` runs it (greedy).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..chunked import chunked_rows
from ..family import FamilyCode
from ..layers import LossParts
from . import api as dflash  # the DFlash contract this family reuses
from .config import DFlashConfig
from ..block import BlockDraft
from .model import DFlashOutput, block_metrics

PROGRESS = dflash.PROGRESS


def lambda_at(step: int, total: int, start: float, decay_ratio: float) -> float:
    """The base-loss weight at optimizer ``step`` of ``total``: linear from ``start`` to 0 over the
    first int(total * decay_ratio) steps (at least 1), then 0."""
    span = max(1, int(total * decay_ratio))
    return min(1.0, max(0.0, start * (1.0 - min(step / span, 1.0))))


class DominoDraft(BlockDraft):
    """DFlash modules + ``prefix_gru`` + ``embed_proj``; cfg.extra holds the head's knobs."""

    draft_type = "domino"
    greedy_only = "Domino drafts are evaluated greedily (its GRU walks its own argmax)"

    def __init__(self, cfg: DFlashConfig):
        super().__init__(cfg)
        x, h = cfg.extra, cfg.hidden_size
        self.prefix_gru = nn.GRU(h, x["gru_hidden_dim"], num_layers=1, batch_first=True, bias=False)
        self.embed_proj = nn.Sequential(nn.Linear(h + x["gru_hidden_dim"], x["emb_dim"], bias=False), nn.SiLU(),
                                        nn.Linear(x["emb_dim"], cfg.vocab_size, bias=False))
        nn.init.zeros_(self.embed_proj[2].weight)  # start as plain DFlash: the correction is learned from 0
        self.step, self.total = 0, 1

    @property
    def label_offset(self) -> int:
        return 1 if self.cfg.extra.get("shift_label", True) else 0

    def set_progress(self, step: int, total: int) -> None:
        """The trainer's optimizer step and total steps (the lambda schedule reads them)."""
        self.step, self.total = int(step), int(total)

    @property
    def lam(self) -> float:
        x = self.cfg.extra
        return lambda_at(self.step, self.total, x["lambda_start"], x["lambda_decay_ratio"])

    def correct_rows(self, base: torch.Tensor, h: torch.Tensor, g: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        """base (M, V) + embed_proj([h | g]) where drafted row index >= pure_draft_prefix_len."""
        fix = self.embed_proj(torch.cat([h, g.to(h.dtype)], -1)).float()
        return base + fix * (row >= self.cfg.extra["pure_draft_prefix_len"])[:, None]

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> DFlashOutput:
        b, n, bs, _ = h.shape
        o, s = self.label_offset, sup.input_ids.shape[1]
        # GRU over the ground-truth tokens anchor .. anchor + bs - 2 + o: state j has read anchor..anchor+j
        steps = bs - 1 + o
        tok_pos = (anchor[..., None] + torch.arange(steps, device=h.device)).clamp(max=s - 1)  # (B, N, steps)
        toks = sup.input_ids.gather(1, tok_pos.flatten(1)).view(b * n, steps)
        g, _ = self.prefix_gru(self.embed(toks))  # (B*N, steps, G)
        # slot k predicts anchor + k + o and reads state k + o - 1; slots with k + o - 1 < 0 are unsupervised
        g = torch.cat([g.new_zeros(b * n, 1 - o, g.shape[-1]), g], 1).view(b, n, bs, -1)
        w = self.loss_weights.to(h.device).expand_as(lmask)[lmask]
        row = torch.arange(bs, device=h.device).expand_as(lmask)[lmask] - (1 - o)  # drafted row index

        def ce_sums(start, h, g, row, y, w):  # one chunk of the M supervised rows
            base = self.logits(h).float()  # (c, H) -> (c, V)
            final = self.correct_rows(base, h, g, row)

            def ce_sum(logits):
                return (w * F.cross_entropy(logits, y, reduction="none")).sum()

            return ce_sum(final), ce_sum(base), final.argmax(-1) == y

        # (M, V) logits twice (final and base) a chunk of rows at a time when M x V is large
        ce_final, ce_base, hits = chunked_rows(ce_sums, [h[lmask], g[lmask], row, labels[lmask], w],
                                               self.vocab_rows, self.max_logit_elements)
        lam = self.lam  # (1 - lam) * CE_w(final) + lam * CE_w(base), both over the same weight sum
        parts = LossParts.of([ce_final, ce_base], [w.sum(), w.sum()], [1 - lam, lam])
        correct = torch.zeros_like(lmask)
        correct[lmask] = hits
        return DFlashOutput(parts.loss(), block_metrics(correct.detach(), lmask, 1 - o), parts)

    def head_logits(self, h: torch.Tensor, anchor_token: int) -> torch.Tensor:
        """Greedy walk: row r reads the GRU after the anchor and drafted rows 0..r-1 -> (k, V)."""
        out, state = [], None
        tok = torch.tensor([[anchor_token]], device=h.device)
        for r in range(h.shape[0]):
            g, state = self.prefix_gru(self.embed(tok), state)  # (1, 1, G)
            base = self.logits(h[r : r + 1]).float()
            logits = self.correct_rows(base, h[r : r + 1], g[0], torch.tensor([r], device=h.device))
            out.append(logits[0])
            tok = logits.argmax(-1)[None]
        return torch.stack(out)


# ---------------------------------------------------------------------------------- family contract
Model = DominoDraft
layer_rule = dflash.layer_rule
layer_ids_from_export = dflash.layer_ids_from_export
attach_target = dflash.attach_target
Proposer = dflash.Proposer
checkpoint_meta = dflash.checkpoint_meta
summarize, scalars, describe = dflash.summarize, dflash.scalars, dflash.describe
KNOBS = ("emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label", "lambda_start", "lambda_decay_ratio")


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> DFlashConfig:
    cfg = dflash.config_from_target(info, draft, draft_vocab_size=draft_vocab_size, num_layer_ids=num_layer_ids,
                                    layer_ids=layer_ids)
    cfg.extra = {"projector_type": "domino", **{k: getattr(draft, k) for k in KNOBS}}
    check_knobs(cfg.extra)
    return cfg


def check_knobs(x: dict) -> None:
    for key in ("emb_dim", "gru_hidden_dim"):
        if not isinstance(x.get(key), int) or x[key] < 1:
            raise ValueError(f"{key}={x.get(key)!r} must be an int >= 1 (the Domino head's width)")
    if not isinstance(x.get("pure_draft_prefix_len"), int) or x["pure_draft_prefix_len"] < 0:
        raise ValueError(f"pure_draft_prefix_len={x.get('pure_draft_prefix_len')!r} must be an int >= 0")
    if not 0 <= x["lambda_start"] <= 1 or not x["lambda_decay_ratio"] >= 0:
        raise ValueError(f"lambda_start={x['lambda_start']!r} must be in [0, 1] and lambda_decay_ratio="
                         f"{x['lambda_decay_ratio']!r} >= 0")


def config_from_export(config: dict) -> DFlashConfig:
    d, own = config.get("dflash_config") or {}, config.get("draftsmith") or {}
    if str(d.get("projector_type", "")).lower() != "domino":
        raise ValueError("config.json has no dflash_config.projector_type: domino; this is not a Domino draft")
    extra = {"projector_type": "domino", "emb_dim": d.get("emb_dim"), "gru_hidden_dim": d.get("gru_hidden_dim"),
             "pure_draft_prefix_len": d.get("pure_draft_prefix_len", 0), "shift_label": d.get("shift_label", True),
             "lambda_start": own.get("lambda_start", 1.0), "lambda_decay_ratio": own.get("lambda_decay_ratio", 0.5)}
    check_knobs(extra)
    return dflash.config_from_export(config, extra=extra)


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  target_lm_head: Optional[torch.Tensor] = None) -> DominoDraft:
    return dflash.load_exported(config, state, target_embeddings, target_lm_head, model_cls=DominoDraft,
                                cfg=config_from_export(config))


CODE = FamilyCode(layer_rule=layer_rule, config_from_target=config_from_target, config_from_export=config_from_export,
                  Model=Model, Proposer=Proposer, attach_target=attach_target, load_exported=load_exported,
                  layer_ids_from_export=layer_ids_from_export, summarize=summarize, scalars=scalars, describe=describe,
                  PROGRESS=PROGRESS, checkpoint_meta=checkpoint_meta)
