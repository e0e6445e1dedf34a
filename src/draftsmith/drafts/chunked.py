"""Losses over a large vocabulary in bounded memory: rows of logits a chunk at a time.

Model math only. A draft that predicts V = 128k tokens at N supervised rows would hold an (N, V)
float32 logits tensor, its log-softmax and (for distillation) the teacher's, and autograd would save
them all for backward: N = 4096 rows are 2 GiB each. Here the rows go through
``logits -> log_softmax -> loss`` in chunks of at most ``max_elements // V`` rows, and each chunk runs
under ``torch.utils.checkpoint`` (non-reentrant), so autograd keeps only the chunk's inputs (its
(c, H) states) and recomputes the (c, V) tensors in backward, one chunk at a time.

When all N rows fit in one chunk the function runs once on the whole tensors with no checkpoint:
the same ops in the same order as an unchunked loss, so small models give bitwise the same results
(tests/train/test_golden.py). Sums over several chunks add chunk by chunk (equal up to rounding).

- :func:`chunked_rows`: the loop itself, for any per-row function (Domino's two CEs use it);
- :func:`chunked_soft_ce`: the loss every full-vocab draft needs: weighted CE against hard labels,
  or KL to a teacher's distribution at a temperature, plus argmax hits from the same chunks;
- :func:`attention_rows`: the same budget for attention scores, (B * h, rows, keys) per block of query
  rows (EAGLE-3's TTT steps, P-EAGLE's element attention).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

__all__ = ["MAX_ELEMENTS", "rows_per_chunk", "attention_rows", "chunked_rows", "chunked_soft_ce"]

# 2**24 fp32 elements = 64 MiB per (c, V) tensor: 128 rows of a 128k vocab. A chunk holds a few such
# tensors at once (logits, log-softmax, the teacher's), which stays well under a GPU's headroom.
MAX_ELEMENTS = 2 ** 24


def rows_per_chunk(width: int, max_elements: int = MAX_ELEMENTS) -> int:
    """Rows of ``width`` values (V) that fit in ``max_elements``: at least 1."""
    if max_elements < 1 or width < 1:
        raise ValueError(f"max_elements={max_elements} and width={width} must be >= 1 (elements per chunk, V)")
    return max(1, max_elements // width)


def attention_rows(heads: int, keys: int, max_elements: int) -> int:
    """Query rows per attention block: ``heads`` (B * h) x rows x ``keys`` scores within ``max_elements``."""
    return max(1, int(max_elements) // max(int(heads) * int(keys), 1))


def chunked_rows(fn: Callable[..., Sequence[torch.Tensor]], rows: Sequence[torch.Tensor], width: int,
                 max_elements: int = MAX_ELEMENTS) -> tuple[torch.Tensor, ...]:
    """``fn(start, *row_chunks) -> outputs`` over chunks of the (N, ...) tensors ``rows``.

    Each chunk is rows ``start .. start + c`` of every tensor in ``rows`` (c = :func:`rows_per_chunk`
    of ``width``). ``fn`` returns a tuple of 0-d tensors (sums over its rows: added over chunks) and
    (c, ...) tensors (per-row values: concatenated). One chunk: ``fn(0, *rows)`` as is. Several, with
    grad enabled: each under ``checkpoint(use_reentrant=False)`` (only the chunk's inputs are saved,
    its (c, V) intermediates are recomputed in backward); without grad (eval) they just run in turn.
    """
    n = rows[0].shape[0]
    step = rows_per_chunk(width, max_elements)
    if n <= step:
        return tuple(fn(0, *rows))
    outs = []
    for i in range(0, n, step):
        chunk = [r[i : i + step] for r in rows]
        if torch.is_grad_enabled():
            outs.append(checkpoint(fn, i, *chunk, use_reentrant=False))
        else:
            outs.append(fn(i, *chunk))
    return tuple(torch.stack(list(parts)).sum(0) if parts[0].dim() == 0 else torch.cat(list(parts))
                 for parts in zip(*outs))


def chunked_soft_ce(hidden: torch.Tensor, project: Callable[[torch.Tensor], torch.Tensor],
                    target: Union[torch.Tensor, Callable[[slice], torch.Tensor]], *, vocab_size: int,
                    weight: Optional[torch.Tensor] = None, temperature: float = 1.0,
                    max_elements: int = MAX_ELEMENTS) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed loss and argmax hits of N rows over a V-token vocab, (c, V) rows at a time.

    hidden (N, H) states with grad; ``project`` maps (c, H) -> (c, V) student logits (any dtype: the
    loss is fp32). ``target`` is either
      - (N,) int64 labels: loss_i = CE(logits_i, label_i), hit_i = argmax logits_i == label_i; or
      - a teacher, ``target(rows: slice) -> (c, V)`` teacher logits of those rows (computed per chunk,
        so no (N, V) teacher exists either): loss_i = KL(softmax(t_i / T) || softmax(s_i / T)) in fp32
        (T = ``temperature``; the caller scales by T^2), hit_i = argmax s_i == argmax t_i.
    Logits rather than probabilities from the teacher: the KL needs its log-softmax, which is exact
    from logits and not from probabilities that underflowed.
    Returns (sum_i w_i loss_i: 0-d fp32 with grad (w = ``weight`` (N,), or 1), hits (N,) bool).
    """
    soft = callable(target)
    if not soft and tuple(target.shape) != (hidden.shape[0],):
        raise ValueError(f"target labels have shape {tuple(target.shape)}; expected ({hidden.shape[0]},), one per row")
    rows = [hidden] + ([] if soft else [target]) + ([] if weight is None else [weight])

    def chunk(start: int, h: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = project(h).float()  # (c, H) -> (c, V)
        if soft:
            teacher = target(slice(start, start + h.shape[0]))  # (c, V) in the teacher's dtype
            t = F.log_softmax(teacher.float() / temperature, -1)
            s = F.log_softmax(logits / temperature, -1)
            loss = (t.exp() * (t - s)).sum(-1)  # (c,) KL per row
            hits = logits.argmax(-1) == teacher.argmax(-1)
        else:
            labels = rest[0]
            loss = F.cross_entropy(logits, labels, reduction="none")  # (c,)
            hits = logits.argmax(-1) == labels
        w = rest[-1] if weight is not None else None
        return ((loss if w is None else w * loss).sum(), hits)

    return chunked_rows(chunk, rows, vocab_size, max_elements)
