"""The block drafts on packed rows (``data.packing``): anchors drawn per document, as its own row would.

Model math only (drafts/block.py composes it). A packed row holds several conversations told apart by
``doc_ids`` (B', T') int (one contiguous run per conversation, numbered 0..D-1 in the micro-batch's
order, -1 on padding; train/packing.py). Unpacked, conversation d is row d of a (D, W) batch, W the
longest conversation (collate pads to it), and its anchors are the N smallest of W uniform keys over
its valid positions (loss_mask[a] and a <= W - block_size; drawn from its own generator, or row d of
one (D, W) draw). :func:`document_rows` rebuilds exactly that (D, W) view of the loss mask, block.py's
``document_anchors`` draws the same keys in the same order with ``sample_anchors`` on it, and only
then :func:`place_anchors` moves each document's anchors to their slots in the packed row. So a packed
micro-batch gets the very anchors of the unpacked one, and with the document rules of block.py
(context keys in [document start, anchor), RoPE positions from the document's first slot, labels
before the document's end) the same loss and gradients.

A block whose anchor lies within block_size of a short document's end runs past it, as the unpacked
row's block runs into its padding: those slots are never supervised (the label rule) and read nothing
of the next document (a block reads its own [anchor, MASK, ...] ids and its document's context only;
Domino's GRU is causal, so no supervised slot reads a token past it).
"""

from __future__ import annotations

import torch

__all__ = ["document_spans", "document_rows", "place_anchors"]


def document_spans(doc_ids: torch.Tensor, docs: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """doc_ids (B', T') -> (row, start, length), each (D,) int64 for documents 0..docs-1: the packed row
    and first slot of each, and its slots (0 for an id that is absent; its row and start are then 0)."""
    b, t = doc_ids.shape
    flat = doc_ids.flatten()
    real = flat >= 0
    ids = flat[real]
    where = torch.arange(b * t, device=doc_ids.device)[real]  # flat slot of each real position
    length = torch.bincount(ids, minlength=docs)[:docs]
    first = torch.full((docs,), b * t, dtype=torch.long, device=doc_ids.device).scatter_reduce(0, ids, where, "amin")
    first = torch.where(length > 0, first, torch.zeros_like(first))
    return first // t, first % t, length


def document_rows(loss_mask: torch.Tensor, doc_ids: torch.Tensor, docs: int
                  ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Packed (B', T') loss_mask and doc_ids -> (local, spans): local (D, W) bool, document d's loss mask
    as its own unpacked row (False past its end; W = the longest document, the unpacked rows' width),
    and :func:`document_spans`."""
    t = doc_ids.shape[1]
    row, start, length = document_spans(doc_ids, docs)  # (D,) each
    width = max(int(length.max()) if docs else 0, 1)  # W
    j = torch.arange(width, device=doc_ids.device)
    inside = j < length[:, None]  # (D, W)
    col = (start[:, None] + j).clamp(max=t - 1)
    return loss_mask.bool()[row[:, None], col] & inside, (row, start, length)


def place_anchors(anchor: torch.Tensor, keep: torch.Tensor, spans: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                  rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Document-local anchors (D, N) with keep (D, N) -> (anchor, keep, start, end), each (B', N') of the
    ``rows`` x ``width`` packed rows (int64, bool, int64, int64).

    anchor: packed slots, sorted per row (documents in slot order, each's anchors sorted); start / end:
    the first slot of the anchor's document and the slot after its last. Rows with fewer anchors than
    N' pad with keep=False blocks at anchor 0 (start 0, end 0: nothing supervised), as sample_anchors'.
    """
    row, start, length = spans
    dev = anchor.device
    d, n = keep.nonzero(as_tuple=True)  # the kept anchors, (M,) each
    r, first = row[d], start[d]
    slot = first + anchor[d, n]  # (M,) packed slots
    order = (r * width + slot).argsort()  # by row, then slot (slots are distinct)
    r, slot, first, end = r[order], slot[order], first[order], (start + length)[d][order]
    count = torch.bincount(r, minlength=rows)  # (B',) anchors per packed row
    rank = torch.arange(r.numel(), device=dev) - (count.cumsum(0) - count)[r]  # (M,) index within its row
    shape = (rows, max(int(count.max()) if r.numel() else 0, 1))
    out, kept = torch.zeros(shape, dtype=torch.long, device=dev), torch.zeros(shape, dtype=torch.bool, device=dev)
    starts, ends = torch.zeros_like(out), torch.zeros_like(out)
    out[r, rank], kept[r, rank], starts[r, rank], ends[r, rank] = slot, True, first, end
    return out, kept, starts, ends
