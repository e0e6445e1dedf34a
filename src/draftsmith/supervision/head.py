"""The target's head as a function, and logits built from it in chunks of positions (pure torch).

Engines that return states only (vllm, sglang, the cache) rebuild logits from the pre-norm state at
layer id L with the target's final RMSNorm and lm_head (:func:`rebuild_logits`); supervision builds
them a chunk of positions at a time (:func:`draft_vocab_targets`), so no (B, S, V) tensor exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import Tensor


@dataclass(frozen=True)
class HeadForm:
    """How the target's head turns the pre-norm state at layer id L into logits, beyond norm + lm_head.

    ``norm_offset``: the final RMSNorm multiplies by ``w + norm_offset`` (1.0 where the norm is written
    ``(1 + w) * x``: Gemma 2/3, Qwen3-Next); ``logit_multiplier``: logits times this (Granite's
    ``1 / logits_scaling``, Cohere's ``logit_scale``); ``logit_softcap``: ``c * tanh(logits / c)``
    (Gemma 2/3's ``final_logit_softcapping``). The default is Llama/Qwen's plain head. Read once from the
    target's config (:func:`head_form_of`), carried by ``TargetInfo`` (so by the cache and the remote
    wire), used by every engine that rebuilds logits: supervision is the distribution the target serves.
    """

    norm_offset: float = 0.0
    logit_multiplier: float = 1.0
    logit_softcap: Optional[float] = None


# model_type -> the norm offset of its final norm (transformers' Gemma/Gemma2/Gemma3 RMSNorm: (1 + w) * x).
OFFSET_NORMS = {"gemma": 1.0, "gemma2": 1.0, "gemma3": 1.0, "gemma3_text": 1.0, "qwen3_next": 1.0}


def head_form_of(config: Any) -> HeadForm:
    """The :class:`HeadForm` of a target from its (text) config object or dict."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    mult = 1.0
    if get("logits_scaling"):  # Granite: logits / logits_scaling
        mult = 1.0 / float(get("logits_scaling"))
    elif get("logit_scale") is not None and str(get("model_type")).startswith("cohere"):  # Cohere: logits * scale
        mult = float(get("logit_scale"))
    cap = get("final_logit_softcapping")
    return HeadForm(norm_offset=OFFSET_NORMS.get(str(get("model_type")), 0.0), logit_multiplier=mult,
                    logit_softcap=float(cap) if cap else None)


def rebuild_logits(h_last: Tensor, norm_weight: Tensor, lm_head: Tensor, eps: float,
                   form: HeadForm = HeadForm()) -> Tensor:
    """Full-vocab logits from the pre-norm residual stream at layer id L (engines that only return states).

    The target's final RMSNorm then the lm_head, in the same op order as transformers so fp32 matches bitwise:
        x = h.float(); x = x * rsqrt(mean(x^2, -1) + eps)
        plain (Llama/Qwen):   y = w * x.to(h.dtype)
        offset (Gemma):       y = (x * (offset + w.float())).to(h.dtype)
        logits = y @ lm_head.T, then * multiplier, then c * tanh(logits / c) where a softcap is set
    h_last: (B, S, H), norm_weight: (H,), lm_head: (V, H) -> (B, S, V) in h_last's dtype.
    """
    x = h_last.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    if form.norm_offset:
        y = (x * (form.norm_offset + norm_weight.float())).to(h_last.dtype)
    else:
        y = norm_weight.to(h_last.dtype) * x.to(h_last.dtype)
    logits = torch.nn.functional.linear(y, lm_head.to(h_last.dtype))
    if form.logit_multiplier != 1.0:
        logits = logits * form.logit_multiplier
    if form.logit_softcap:
        logits = torch.tanh(logits / form.logit_softcap) * form.logit_softcap
    return logits


# Rows of full-vocab logits built at once: 2**24 elements is 64 MiB in fp32, i.e. 130 positions of a
# 128k vocabulary. A batch of T positions then never holds a (T, V) tensor; a tiny test target fits in
# one chunk, where the chunked path runs exactly the unchunked ops.
LOGITS_CHUNK_ELEMENTS = 1 << 24  # the drafts' budget too (drafts/chunked.py)


@dataclass(frozen=True)
class TargetHead:
    """The target's head as a function: the pre-norm state at layer id L -> full-vocab logits.

    ``project``: (N, H) -> (N, V) in the state's dtype (final norm, then the lm_head). Engines that
    return states only use :func:`rebuild_logits` over their weights; the hf engine applies the
    model's own norm and output modules, so its logits are the ones its forward would return.
    """

    project: Callable[[Tensor], Tensor]
    vocab_size: int

    @staticmethod
    def from_weights(norm_weight: Tensor, lm_head: Tensor, eps: float, form: HeadForm = HeadForm()) -> "TargetHead":
        return TargetHead(lambda h: rebuild_logits(h, norm_weight, lm_head, eps, form), int(lm_head.shape[0]))


def chunk_rows(vocab_size: int, max_elements: int = LOGITS_CHUNK_ELEMENTS) -> int:
    """Rows of (rows, vocab_size) logits that fit ``max_elements`` (at least one row)."""
    return max(1, int(max_elements) // max(int(vocab_size), 1))


def probs_dtype(logits_dtype: torch.dtype) -> torch.dtype:
    """The dtype target probabilities are stored in: bfloat16 for bf16 logits, else float32 (fp16 would
    flush probabilities below 6e-8 to zero; bf16 keeps fp32's range). See :func:`draft_vocab_targets`."""
    return torch.bfloat16 if logits_dtype == torch.bfloat16 else torch.float32


def draft_vocab_targets(h_last: Tensor, head: TargetHead, draft_ids: Optional[Tensor], *,
                        max_elements: int = LOGITS_CHUNK_ELEMENTS) -> tuple[Tensor, Tensor]:
    """The target's distribution over the draft vocab and whether its argmax lies there, by chunks of rows.

    h_last (B, S, H) pre-norm state at layer id L -> probs (B, S, Vd), in_draft (B, S) bool.
    Per chunk of positions: logits (c, V) = head(h); top = argmax_V; probs = softmax(logits[:, draft_ids]
    .float()); so at most one (c, V) logits tensor lives at a time, c = max_elements // V. Each row's
    result is what the unchunked formula gives for that row; with one chunk the ops are identical.
    ``draft_ids`` None: the full vocab (probs is then (B, S, V): a full-vocab draft needs it whole).

    probs are stored in bfloat16 when the logits are bf16 (a bf16 target), else in float32. The softmax is
    fp32 either way; the storage rounds each probability by at most 2^-8 of itself, while the bf16 logits
    it comes from were already rounded by up to 2^-8 of their size (a logit of 10 by 0.04, which moves its
    probability by ~4%). The (B, S, Vd) tensor is held from the features through backward: 0.49 GiB at
    4,096 x 32,000 in fp32, half that in bf16 (docs/benchmarks.md,
    "Memory scaling"). The loss reads rows back with ``.float()``.
    """
    B, S, H = h_last.shape
    flat = h_last.reshape(B * S, H)
    rows = chunk_rows(head.vocab_size, max_elements)
    ids = None if draft_ids is None else draft_ids.to(device=h_last.device, dtype=torch.long)
    t2d = None
    if ids is not None:
        t2d = torch.zeros(head.vocab_size, dtype=torch.bool, device=h_last.device)
        t2d[ids] = True
    width = head.vocab_size if ids is None else int(ids.numel())
    # Written chunk by chunk into one output: a list of chunks joined by cat would hold (N, Vd) twice.
    p = torch.empty(B * S, width, dtype=probs_dtype(h_last.dtype), device=h_last.device)
    m = torch.empty(B * S, dtype=torch.bool, device=h_last.device)
    for r in range(0, B * S, rows):
        logits = head.project(flat[r : r + rows])  # (c, V) in the target's dtype
        top = logits.argmax(dim=-1)  # (c,) full-vocab argmax
        if ids is not None:
            m[r : r + rows] = t2d[top]
            logits = logits.index_select(-1, ids)  # (c, Vd)
        else:
            m[r : r + rows] = True
        if p.dtype == torch.float32:
            torch.softmax(logits.float(), dim=-1, out=p[r : r + rows])
        else:  # fp32 softmax of one chunk, stored rounded
            p[r : r + rows] = torch.softmax(logits.float(), dim=-1)
        del logits
    return p.reshape(B, S, -1), m.reshape(B, S)
