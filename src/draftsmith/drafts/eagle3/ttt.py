"""The training-time-test unroll's pieces that run in blocks of rows, and the document rules of packed rows.

Model math only (``model.py`` composes them). A TTT step's attention runs as one block while its
(B, h, T, T) scores fit a budget, else in checkpointed blocks of query rows; the draft-vocab CE likewise
in blocks of supervised rows. A packed row (``data.packing``) holds several conversations, told apart
by ``doc_ids`` (B, T) int (one contiguous run per conversation, -1 on padding): attention stays inside a
document, RoPE positions restart at each document's first slot, and step k scores slot t only when
slot t + k lies in the same document (the unpacked row has its zero tail there), so a packed row gives
the loss of its conversations trained one per row.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..chunked import MAX_ELEMENTS
from ..layers import document_positions, repeat_kv  # noqa: F401 (document_positions: this module's name for it too)

__all__ = ["MAX_BLOCK_ELEMENTS", "attention_rows", "attention_mask", "ttt_attention", "soft_ce_block",
           "document_positions", "same_document"]

# Elements of one attention-score block ((B, h, rows, T) fp32) and of one block of draft-vocab logits
# ((rows, Vd) fp32): the drafts' one budget (drafts/chunked.py, 64 MiB). Below it a TTT step runs as one
# block, exactly as written; above it (long rows, big vocabularies) it runs in blocks of query rows under
# activation checkpointing, so memory grows linearly in T instead of (T^2 h) for the scores and (T Vd)
# per step for the logits.
MAX_BLOCK_ELEMENTS = MAX_ELEMENTS


def attention_rows(heads: int, keys: int, max_elements: int) -> int:
    """Query rows per attention block: ``heads`` (B * h) x rows x ``keys`` scores within ``max_elements``."""
    return max(1, int(max_elements) // max(int(heads) * int(keys), 1))


def attention_mask(start: int, end: int, device: torch.device, doc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Which step-0 keys query rows ``start .. end - 1`` may attend: key <= query, an index rule from
    aranges, (r, end) bool. With ``doc`` (B, T) also key and query in the same document: (B, 1, r, end),
    built for these rows only, so a blocked step never holds a (T, T) mask."""
    rows = torch.arange(start, end, device=device)[:, None]
    mask = torch.arange(end, device=device)[None, :] <= rows  # (r, end)
    if doc is not None:
        mask = mask & (doc[:, start:end, None] == doc[:, None, :end])[:, None]  # (B, 1, r, end)
    return mask


def ttt_attention(q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], scale: float,
                  causal: Optional[torch.Tensor] = None, start: int = 0, n_rep: int = 1,
                  doc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Step-k TTT attention for query rows ``start .. start + r`` (all rows when q has T of them).

    q (B, h, r, d); keys/values: k + 1 tensors (B, h_kv, T, d), step 0's and the diagonal ones of steps
    1..k, repeated to h = h_kv * n_rep heads here (GQA), so only the h_kv-head tensors are kept. Query t
    attends over step-0 keys 0..t (``causal`` (T, T) or (B, 1, T, T) when given, else
    :func:`attention_mask` for these rows, within ``doc`` (B, T) when given) and over keys[j][t] for
    j = 1..k (the same slot, so always the same document), in one softmax:
        s0 (B, h, r, t') | diag_j (B, h, r) -> probs (B, h, r, t' + k) -> out (B, h, r, d)
    Only keys 0 .. start + r - 1 can be attended, so a block reads no more of step 0 than it needs.
    """
    r = q.shape[2]
    end = start + r
    keys = [repeat_kv(kj, n_rep) for kj in keys]
    values = [repeat_kv(vj, n_rep) for vj in values]
    k0, v0 = keys[0][:, :, :end], values[0][:, :, :end]
    if causal is None:
        causal = attention_mask(start, end, q.device, doc)
    s0 = (q @ k0.transpose(-1, -2)).float() * scale
    s0 = s0.masked_fill(~causal, float("-inf"))  # every row keeps its own key: no all -inf row
    diag = [((q * kj[:, :, start:end]).sum(-1)).float() * scale for kj in keys[1:]]  # each (B, h, r)
    probs = torch.cat([s0] + [d[..., None] for d in diag], dim=-1).softmax(-1)  # (B, h, r, end + k)
    probs = probs.to(v0.dtype)
    out = probs[..., :end] @ v0  # (B, h, r, d)
    for j in range(1, len(keys)):
        out = out + probs[..., end + j - 1, None] * values[j][:, :, start:end]
    return out


def soft_ce_block(head: Callable[[torch.Tensor], torch.Tensor], normed: torch.Tensor, target_probs: torch.Tensor,
                  rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy sum and top-1 hits of rows ``normed`` (N, H) against ``target_probs[rows, cols]``.

    probs (N, Vd) are gathered here, so under checkpoint no gathered copy outlives the block;
    logits = head(normed) (N, Vd) fp32; ce = -sum_v probs * log_softmax(logits); hit = argmax agrees.
    """
    probs = target_probs[rows, cols].float()  # (N, Vd)
    logits = head(normed)
    ce = -(probs * logits.log_softmax(-1)).sum(-1).sum()  # (N,) -> (), the unblocked reduction order
    return ce, (logits.detach().argmax(-1) == probs.argmax(-1))


def same_document(doc: torch.Tensor, k: int) -> torch.Tensor:
    """doc (B, T) -> (B, T) bool: slot t is a real document's (doc >= 0) and slot t + k exists in the
    same one. Step k of slot t learns the target at t + k; past its document's end the unpacked row
    has its zero tail (nothing to learn), the packed row the next document's start."""
    t = doc.shape[1]
    out = torch.zeros_like(doc, dtype=torch.bool)
    if k < t:
        out[:, : t - k] = (doc[:, k:] == doc[:, : t - k]) & (doc[:, : t - k] >= 0)
    return out
