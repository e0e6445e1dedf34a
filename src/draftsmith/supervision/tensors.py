"""Tensor helpers the families' supervision builders share (pure torch)."""

from __future__ import annotations

import torch
from torch import Tensor

from . import TargetError


def shift_left(x: Tensor, n: int = 1, dim: int = 1) -> Tensor:
    """``y[..., t, ...] = x[..., t + n, ...]`` along ``dim``; the last ``n`` slots are zero (False).

    Works for any dtype (bool tails are False). Returns a new tensor; ``x`` is untouched.
    """
    if n < 0:
        raise ValueError(f"shift_left: n={n} must be >= 0")
    out = torch.zeros_like(x)
    size = x.shape[dim]
    if n < size:
        out.narrow(dim, 0, size - n).copy_(x.narrow(dim, n, size - n))
    return out


def same_positions(kind: str, batch, name: str, t: Tensor) -> None:
    """Refuse features whose (B, S) does not match the batch's (an engine bug, not a setting)."""
    if tuple(t.shape[:2]) != tuple(batch.input_ids.shape):
        raise TargetError(f"{kind} supervision: {name} has shape {tuple(t.shape)}, the batch is "
                          f"{tuple(batch.input_ids.shape)}; the engine returned features for another batch")
