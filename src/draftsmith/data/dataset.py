"""Tokenized training examples: building, hold-out split, resumable epoch order, collation.

Nothing here imports an engine (``python -c "import draftsmith.data.dataset"`` never loads vllm).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

import torch

from draftsmith.data.formats import DataError
from draftsmith.data.template import render
from draftsmith.targets import Batch


@dataclass
class Example:
    """One rendered conversation: token ids and the 0/1 assistant mask, same length."""

    input_ids: list[int]
    loss_mask: list[int]


def build_examples(
    convs: Sequence[list[dict]],
    tokenizer: Any,
    max_length: Optional[int],
    chat_template: Optional[str] = None,
    template_kwargs: Optional[dict] = None,
) -> tuple[list[Example], int]:
    """Render every conversation; return ``(examples, dropped)``.

    An example whose assistant tokens were all cut by truncation (or that the template rendered
    without assistant content) supervises nothing, so it is dropped and counted in ``dropped``.
    """
    examples: list[Example] = []
    dropped = 0
    for messages in convs:
        ids, mask = render(messages, tokenizer, max_length, chat_template, template_kwargs)
        if any(mask):
            examples.append(Example(ids, mask))
        else:
            dropped += 1
    return examples, dropped


def split_holdout(
    examples: Sequence[Example], eval_size: Union[float, int], seed: int
) -> tuple[list[Example], list[Example]]:
    """Split into ``(train, eval)`` deterministically from ``seed``.

    ``eval_size`` is a fraction in ``[0, 1)`` (a float; at least one example when positive) or a
    count (an int). Both parts keep the input order. Raises :class:`DataError` when no training
    example would remain.
    """
    n = len(examples)
    if isinstance(eval_size, bool) or not isinstance(eval_size, (int, float)):
        raise DataError(f"data.eval_size: expected a fraction in [0, 1) or a count, got {eval_size!r}")
    if isinstance(eval_size, float):
        if not 0.0 <= eval_size < 1.0:
            raise DataError(
                f"data.eval_size: fraction {eval_size} is outside [0, 1); use e.g. 0.05, or an int for a count"
            )
        n_eval = max(1, int(eval_size * n + 0.5)) if eval_size > 0 else 0
    else:
        if eval_size < 0:
            raise DataError(f"data.eval_size: count {eval_size} is negative; use 0 for no hold-out")
        n_eval = eval_size
    if n - n_eval < 1:
        raise DataError(
            f"data.eval_size={eval_size!r} holds out {n_eval} of {n} examples and leaves none to train on; "
            "lower data.eval_size or add data"
        )
    held = set(random.Random(seed).sample(range(n), n_eval))
    train = [ex for i, ex in enumerate(examples) if i not in held]
    held_out = [ex for i, ex in enumerate(examples) if i in held]
    return train, held_out


def holdout_from_sources(
    train: Sequence[Example], held: Sequence[Example]
) -> tuple[list[Example], list[Example], int]:
    """``data.eval_sources``: every ``train`` example trains and ``held`` is the held-out split, less
    the rows that are also training rows (token for token: a shared prompt regenerated greedily by the
    same target is the same row), which would score the draft on text it learned. Returns
    ``(train, held-out, rows left out for being in train)``."""
    seen = {tuple(ex.input_ids) for ex in train}
    kept = [ex for ex in held if tuple(ex.input_ids) not in seen]
    if not kept:
        raise DataError(f"data.eval_sources: all {len(held)} held-out conversations are also in data.sources; hold out "
                        "rows from another source")
    return list(train), kept, len(held) - len(kept)


def epoch_order(n: int, epoch: int, seed: int) -> list[int]:
    """The visiting order of ``n`` examples in ``epoch``: a permutation that depends only on
    ``(seed, epoch)``, so a resumed run recomputes exactly the order it was interrupted in."""
    g = torch.Generator()
    # Mix (seed, epoch) into one 63-bit seed (golden-ratio multiplier keeps nearby pairs apart).
    g.manual_seed((seed * 0x9E3779B97F4A7C15 + epoch) % (1 << 63))
    return torch.randperm(n, generator=g).tolist()


def length_grouped(order: list[int], lengths: Sequence[int], batch_size: int, window: int = 32) -> list[int]:
    """``order`` with each span of ``window * batch_size`` examples sorted by length (longest first),
    so a batch's rows have similar lengths and little padding, while the epoch's shuffle still decides
    which examples share a span. Deterministic in ``order``, so resume recomputes it exactly."""
    span = max(1, window * batch_size)
    out: list[int] = []
    for i in range(0, len(order), span):
        out += sorted(order[i : i + span], key=lambda j: -lengths[j])  # stable: ties keep the shuffle
    return out


def collate(examples: Sequence[Example], pad_id: int) -> Batch:
    """Right-pad examples into a :class:`~draftsmith.targets.Batch` of int64 (B, S) tensors.

    ``input_ids`` is padded with ``pad_id``; ``attention_mask`` and ``loss_mask`` with 0.
    """
    if not examples:
        raise ValueError("collate: got an empty list of examples; a batch needs at least one")
    width = max(len(ex.input_ids) for ex in examples)  # S
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for b, ex in enumerate(examples):
        t = len(ex.input_ids)
        input_ids[b, :t] = torch.tensor(ex.input_ids, dtype=torch.long)
        attention_mask[b, :t] = 1
        loss_mask[b, :t] = torch.tensor(ex.loss_mask, dtype=torch.long)
    return Batch(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
