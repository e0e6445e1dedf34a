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

import math
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..chunked import MAX_ELEMENTS
from ..layers import apply_rotary, repeat_kv

__all__ = ["SCORE_BLOCK_ELEMENTS", "LOGIT_BLOCK_ELEMENTS", "FrozenHead", "frozen_head", "attention_mask",
           "ttt_attention", "soft_ce_block", "soft_ce_rows", "same_document", "logits_fn", "ttt_step_rows", "step_kv",
           "step_rows"]

# Elements of one attention-score block ((B, h, rows, T) fp32, drafts/chunked.py's attention_rows) and of
# one block of draft-vocab logits ((rows, Vd) fp32). Below them a TTT step runs as one block, exactly as
# written; above them (long rows, big vocabularies) it runs in blocks of query rows under activation
# checkpointing, so memory grows linearly in T instead of (T^2 h) for the scores and (T Vd) per step for
# the logits. Smaller than the drafts' one budget (chunked.MAX_ELEMENTS, 64 MiB, which P-EAGLE uses): a
# block's transient is several such tensors at once (scores, masked, softmax, low-precision probs and
# their gradients; logits, log-softmax, gathered probs and theirs), which at 64 MiB each was most of what
# a 4k-token step held beyond its kept states. Half for the scores (64 query rows of a 4k row, 32 heads),
# a quarter for the logits (131 rows of a 32k draft vocab).
SCORE_BLOCK_ELEMENTS = MAX_ELEMENTS // 2
LOGIT_BLOCK_ELEMENTS = MAX_ELEMENTS // 4
# Rows of a frozen lm_head cast to the autocast dtype at a time in a blocked CE (:class:`FrozenHead`).
HEAD_SLICE_ROWS = 4096


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
    # Sliced to the rows this block reads before the GQA repeat (slicing and repeating commute): a block
    # never builds (B, h, T, d) copies of every step's K/V, only step 0's first `end` and r diagonal rows.
    k0, v0 = repeat_kv(keys[0][:, :, :end], n_rep), repeat_kv(values[0][:, :, :end], n_rep)
    keys = [k0] + [repeat_kv(kj[:, :, start:end], n_rep) for kj in keys[1:]]
    values = [v0] + [repeat_kv(vj[:, :, start:end], n_rep) for vj in values[1:]]
    if causal is None:
        causal = attention_mask(start, end, q.device, doc)
    s0 = (q @ k0.transpose(-1, -2)).float() * scale
    s0 = s0.masked_fill(~causal, float("-inf"))  # every row keeps its own key: no all -inf row
    diag = [((q * kj).sum(-1)).float() * scale for kj in keys[1:]]  # each (B, h, r)
    probs = torch.cat([s0] + [d[..., None] for d in diag], dim=-1).softmax(-1)  # (B, h, r, end + k)
    probs = probs.to(v0.dtype)
    out = probs[..., :end] @ v0  # (B, h, r, d)
    for j in range(1, len(keys)):
        out = out + probs[..., end + j - 1, None] * values[j]
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


def soft_ce_rows(head: Callable[[torch.Tensor], torch.Tensor], states: torch.Tensor,
                 norm: Optional[Callable[[torch.Tensor], torch.Tensor]], target_probs: torch.Tensor,
                 rows: torch.Tensor, cols: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`soft_ce_block` of the N positions (rows, cols) of step k's ``states`` (B, T, H), gathered
    here and passed through ``norm`` (the draft's final norm; None when the states are normed already):
    under checkpoint only the step's own (B, T, H) state and the indices are kept, no (N, H) copy.
    Row (b, t) learns target_probs[b, t + k]. The norm acts per row, so its values are the whole step's."""
    x = states[rows, cols]  # (N, H)
    return soft_ce_block(head, x if norm is None else norm(x), target_probs, rows, cols + k)


class FrozenHead(torch.autograd.Function):
    """logits = x @ W.T in ``dtype`` (fp32 out) for a frozen W (Vd, H), W cast a slice of rows at a time.

    What autocast does for ``lm_head(x)`` (both operands cast to bf16, one GEMM), without a whole
    (Vd, H) low-precision copy of W: 250 MiB for a 32k x 4096 head, made again for every CE block in
    forward and in its recompute. Each logit is the same dot product (the GEMM kernel of a slice may
    add it in another order). Backward (x's gradient only, W is frozen): sum over slices of
    grad[:, slice] @ W[slice], accumulated in fp32 and rounded to ``dtype`` once, as the one GEMM's
    output is: autocast's up to the summation order before that rounding.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, rows: int) -> torch.Tensor:
        ctx.save_for_backward(weight)  # the parameter itself: no copy
        ctx.dtype, ctx.rows, ctx.x_dtype = dtype, rows, x.dtype
        xl = x.to(dtype)
        out = torch.empty(x.shape[0], weight.shape[0], dtype=dtype, device=x.device)  # (N, Vd)
        for a in range(0, weight.shape[0], rows):
            out[:, a : a + rows] = xl @ weight[a : a + rows].to(dtype).T
        return out.float()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (weight,) = ctx.saved_tensors
        # autocast's GEMM output is low precision, so its gradient arrives rounded to it; the slices'
        # products of low-precision values are exact in fp32 and add there, as inside the one GEMM
        g = grad.to(ctx.dtype).float()
        gx = torch.zeros(grad.shape[0], weight.shape[1], dtype=torch.float32, device=grad.device)  # (N, H)
        for a in range(0, weight.shape[0], ctx.rows):
            gx += g[:, a : a + ctx.rows] @ weight[a : a + ctx.rows].to(ctx.dtype).float()
        return gx.to(ctx.dtype).to(ctx.x_dtype), None, None, None


def frozen_head(self: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The blocked CE's logits: :class:`FrozenHead` for a frozen lm_head under autocast (no whole
    low-precision copy of it per block), else :meth:`compute_logits`."""
    w = self.lm_head.weight
    dev = w.device.type
    if w.requires_grad or not torch.is_autocast_enabled(dev):
        return self.compute_logits
    dtype = torch.get_autocast_dtype(dev)
    return lambda x: FrozenHead.apply(x, w, dtype, HEAD_SLICE_ROWS)


def same_document(doc: torch.Tensor, k: int) -> torch.Tensor:
    """doc (B, T) -> (B, T) bool: slot t is a real document's (doc >= 0) and slot t + k exists in the
    same one. Step k of slot t learns the target at t + k; past its document's end the unpacked row
    has its zero tail (nothing to learn), the packed row the next document's start."""
    t = doc.shape[1]
    out = torch.zeros_like(doc, dtype=torch.bool)
    if k < t:
        out[:, : t - k] = (doc[:, k:] == doc[:, : t - k]) & (doc[:, : t - k] >= 0)
    return out


# ---- methods of the draft (``self``: an Eagle3Draft), installed there


def logits_fn(self: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """:meth:`compute_logits` for one training forward, with a frozen lm_head cast to the autocast dtype once.

    Autocast caches its weight casts only for weights that require grad, so a frozen (Vd, H) lm_head
    is cast again at every use, and autograd keeps each use's bf16 copy for its backward: one per TTT
    step (3 x 250 MiB for a 32k x 4096 head). Cast here once, the matmul sees the same bf16 operands
    autocast gives it (both cast, fp32 out): the same values and gradients. Outside autocast, or with
    a trainable lm_head (autocast caches that one), it is compute_logits.
    """
    w = self.lm_head.weight
    dev = w.device.type
    if w.requires_grad or not torch.is_autocast_enabled(dev):
        return self.compute_logits
    low = w.to(torch.get_autocast_dtype(dev))  # (Vd, H), shared by every step and block of this forward
    return lambda normed: F.linear(normed.to(low.dtype), low).float()


def ttt_step_rows(self: Any, h: torch.Tensor, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...],
                  doc: Optional[torch.Tensor] = None, *, rows: int):
    """:meth:`ttt_step` under activation checkpointing, in blocks of ``rows`` positions (the attention
    budget's query rows): this step's K/V a block at a time, then per block of queries q, attention,
    o_proj, MLP, each block recomputed in backward on its own. Autograd keeps the step's input h,
    K/V (B, h_kv, T, d) and h_pre (B, T, H), as the whole-step checkpoint does, and a recompute in
    backward holds one block's activations instead of the whole step's (T, 2H) input, q, attention
    output, MLP and norms. Each position's values are the whole step's; weight gradients add block by
    block (equal up to rounding)."""
    t = ids.shape[1]
    spans = [(a, min(a + rows, t)) for a in range(0, t, rows)]
    kv = [checkpoint(self.step_kv, h[:, a:e], ids[:, a:e], cos[:, a:e], sin[:, a:e], use_reentrant=False)
          for a, e in spans]
    key, value = torch.cat([k for k, _ in kv], 2), torch.cat([v for _, v in kv], 2)  # (B, h_kv, T, d)
    del kv
    kv = ((*keys, key), (*values, value))
    h_pre = torch.cat([checkpoint(self.step_rows, h, ids, cos, sin, *kv, doc, a, e, use_reentrant=False)
                       for a, e in spans], 1)  # (B, T, H)
    return h_pre, checkpoint(self.model.norm, h_pre, use_reentrant=False), key, value


def step_kv(self: Any, h: torch.Tensor, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rows of one step: state h (B, r, H), ids (B, r), cos/sin (B, r, d) -> rotated key, value (B, h_kv, r, d)."""
    layer = self.model.layers[0]
    attn, (b, r) = layer.self_attn, ids.shape
    x = layer.fuse(self.model.embed_tokens(ids), h)  # (B, r, 2H)
    k = attn.k_proj(x).view(b, r, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(b, r, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
    return apply_rotary(k, cos, sin), v


def step_rows(self: Any, h: torch.Tensor, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...], doc: Optional[torch.Tensor],
              start: int, end: int) -> torch.Tensor:
    """h_pre (B, end - start, H) of positions start..end-1 of one step, from the whole step's state h
    (B, T, H), ids (B, T), cos/sin (B, T, d) and the K/V of steps 0..k (B, h_kv, T, d)."""
    cfg, layer = self.cfg, self.model.layers[0]
    attn, b, r = layer.self_attn, ids.shape[0], end - start
    hr = h[:, start:end]
    x = layer.fuse(self.model.embed_tokens(ids[:, start:end]), hr)  # (B, r, 2H)
    q = attn.q_proj(x).view(b, r, attn.num_heads, attn.head_dim).transpose(1, 2)
    q = apply_rotary(q, cos[:, start:end], sin[:, start:end])  # (B, h, r, d)
    out = ttt_attention(q, keys, values, 1.0 / math.sqrt(cfg.head_dim), None, start,
                        cfg.num_attention_heads // cfg.num_key_value_heads, doc)
    return layer.finish(out, residual=layer.residual(hr))
