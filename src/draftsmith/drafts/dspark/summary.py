"""DSpark's metric summary: the block drafts' (drafts/block.py) plus the slots' mean total-variation
distance to the target and the confidence head's mean error."""

from __future__ import annotations

import torch

from ..block import PROGRESS, describe as block_describe, scalars as block_scalars, summarize as block_summarize

__all__ = ["PROGRESS", "summarize", "scalars", "describe"]


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """:func:`drafts.block.summarize` plus ``tv`` (mean TV over supervised slots: 1 - the acceptance rate of
    speculative sampling) and ``confidence_abs_error`` (mean |confidence - (1 - TV)|)."""
    out = block_summarize(sums)
    n = max(out["positions"], 1)
    out["tv"] = float(sums["tv_sum"].sum()) / n
    out["confidence_abs_error"] = float(sums["conf_err_sum"].sum()) / n
    return out


def scalars(summary: dict) -> dict[str, float]:
    return {**block_scalars(summary), "tv": summary["tv"], "confidence_abs_error": summary["confidence_abs_error"]}


def describe(summary: dict) -> str:
    return (f"{block_describe(summary)}  TV {summary['tv']:.3f}  confidence error "
            f"{summary['confidence_abs_error']:.3f}")
