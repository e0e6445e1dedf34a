"""Draft vocabulary: choose the Vd target tokens the draft predicts, and map between id spaces.

Pure tensor math (no I/O). Conventions shared with vLLM's EAGLE-3 loader:

- ``draft_ids`` (Vd,) int64: the selected TARGET ids sorted ascending; draft id i <-> target id
  ``draft_ids[i]``.
- ``d2t`` (Vd,) int64 offsets: ``target_id = draft_id + d2t[draft_id]``, i.e. ``d2t = draft_ids - arange(Vd)``.
- ``t2d`` (V,) bool: ``t2d[target_id]`` is True iff the target id is in the draft vocab.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import Tensor


def token_counts(examples_ids_and_masks: Iterable[tuple[Sequence[int], Sequence[int]]], vocab_size: int) -> Tensor:
    """Count supervised tokens: ``counts[v]`` = occurrences of id v where ``loss_mask == 1``.

    Takes an iterable of ``(input_ids, loss_mask)`` pairs; returns a (V,) int64 tensor.
    """
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for ids, mask in examples_ids_and_masks:
        ids_t = torch.as_tensor(ids, dtype=torch.long)
        mask_t = torch.as_tensor(mask, dtype=torch.long)
        if ids_t.shape != mask_t.shape:
            raise ValueError(f"token_counts: input_ids {tuple(ids_t.shape)} and loss_mask {tuple(mask_t.shape)} differ in length")
        picked = ids_t[mask_t == 1]
        if picked.numel() and (picked.min() < 0 or picked.max() >= vocab_size):
            raise ValueError(
                f"token_counts: token id {int(picked.max())} is outside the target vocab of {vocab_size}; "
                "the tokenizer does not match the target"
            )
        counts += torch.bincount(picked, minlength=vocab_size)
    return counts


def select_draft_vocab(counts: Tensor, special_ids: Sequence[int], draft_vocab_size: int) -> Tensor:
    """Pick the draft vocab; return the selected target ids sorted ascending, (Vd,) int64.

    Selection order: special ids first (ascending id), then the rest by count descending, ties by
    lower id; the first ``draft_vocab_size`` are kept. ``draft_vocab_size >= V`` keeps all V ids.
    """
    vocab_size = counts.shape[0]
    if draft_vocab_size <= 0:
        raise ValueError(f"draft_vocab_size: expected a positive size, got {draft_vocab_size}")
    if draft_vocab_size >= vocab_size:
        return torch.arange(vocab_size, dtype=torch.long)
    specials = sorted({int(i) for i in special_ids if 0 <= int(i) < vocab_size})
    is_special = torch.zeros(vocab_size, dtype=torch.bool)
    is_special[specials] = True
    # A stable descending sort of counts over ids 0..V-1 breaks ties by the lower id.
    by_count = torch.sort(counts, descending=True, stable=True).indices
    rest = by_count[~is_special[by_count]]
    order = torch.cat([torch.tensor(specials, dtype=torch.long), rest])
    return torch.sort(order[:draft_vocab_size]).values


def build_vocab_maps(draft_ids: Tensor, vocab_size: int) -> tuple[Tensor, Tensor]:
    """``(d2t, t2d)`` for sorted unique ``draft_ids`` (Vd,): d2t (Vd,) int64, t2d (V,) bool."""
    draft_ids = draft_ids.to(torch.long)
    if draft_ids.numel() and (draft_ids.min() < 0 or draft_ids.max() >= vocab_size):
        raise ValueError(f"build_vocab_maps: draft ids must lie in [0, {vocab_size}), got max {int(draft_ids.max())}")
    if draft_ids.numel() > 1 and not bool((draft_ids[1:] > draft_ids[:-1]).all()):
        raise ValueError("build_vocab_maps: draft_ids must be strictly increasing (sorted, unique)")
    d2t = draft_ids - torch.arange(draft_ids.numel(), dtype=torch.long)  # target = draft + d2t[draft]
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids] = True
    return d2t, t2d


def coverage(counts: Tensor, draft_ids: Tensor) -> float:
    """Fraction of supervised tokens whose id is in the draft vocab: sum(counts[draft_ids]) / sum(counts).

    Returns 0.0 when nothing is supervised (there is nothing to cover).
    """
    total = int(counts.sum())
    if total == 0:
        return 0.0
    return int(counts[draft_ids].sum()) / total
