"""DFlash block draft: one forward drafts a whole block of ``block_size - 1`` tokens.

Model math only (no I/O, no engines). The backbone, anchors, visibility and metrics are the block
drafts' shared ones (drafts/block.py: ``Qwen3DFlashDraftModel``'s on-disk names, the target's embeddings
and lm_head borrowed); DFlash adds its loss and its export:
    logits = target lm_head(h)                            over the full target vocab
Block position k predicts the token at a_b + k, so position 0 (the anchor) is never supervised.

Loss: sum_{b, k>=1} w_k CE_k m / (sum w_k m + 1e-6), w_k = exp(-(k-1)/gamma) (uniform when gamma is
None), m = keep_b & (a_b + k < S) & loss_mask[a_b + k]. JetSpec (dflash/jetspec.py) swaps the CE for
a KD loss and Domino (dflash/domino.py) adds a GRU correction head. The (M, V) logits of the M
supervised rows are never whole when M x V exceeds ``max_logit_elements``: drafts/chunked.py runs them
a chunk of rows at a time (recomputed in backward).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..block import (PROGRESS, BlockAttention as DFlashAttention, BlockDraft, BlockLayer as DFlashLayer,  # noqa: F401
                     BlockOutput as DFlashOutput, NoValidAnchors, block_inputs, block_metrics, decay_weights,
                     describe, document_anchors, empty_sums, sample_anchors, scalars, summarize, visibility)
from ..chunked import chunked_soft_ce
from ..layers import LossParts
from .config import DFlashConfig  # noqa: F401 (the config this model reads)

__all__ = ["DFlashDraft", "DFlashOutput", "NoValidAnchors", "sample_anchors", "document_anchors", "block_inputs",
           "visibility", "decay_weights", "block_metrics"]


class DFlashDraft(BlockDraft):
    """DFlash draft (``Qwen3DFlashDraftModel``): the block backbone, CE against the data tokens."""

    label_offset = 0  # block slot k predicts token anchor + k (the anchor slot predicts nothing)
    draft_type = "dflash"  # the family its export names

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> DFlashOutput:
        """Decay-weighted CE against the data tokens: per-position CE on supervised rows only."""
        w = self.loss_weights.to(h.device).expand_as(lmask)[lmask]  # (M,)
        # (M, H) -> (M, V) logits -> CE, a chunk of rows at a time when M x V is large
        ce, hits = chunked_soft_ce(h[lmask], self.logits, labels[lmask], vocab_size=self.vocab_rows, weight=w,
                                   max_elements=self.max_logit_elements)
        parts = LossParts.of([ce], [w.sum()], [1.0])  # sum_m w_m CE_m / sum_m w_m
        correct = torch.zeros_like(lmask)
        correct[lmask] = hits
        return DFlashOutput(parts.loss(), block_metrics(correct.detach(), lmask, 1 - self.label_offset), parts)


# ---------------------------------------------------------------------------------- training contract
def attach_target(model: DFlashDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any, layer: Any = None) -> None:
    """Borrow the target's embeddings and lm_head (DFlash predicts the full target vocab)."""
    lm_head, _ = head()
    model.attach_target(embeddings, lm_head)

