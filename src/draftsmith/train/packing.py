"""``data.packing``: several conversations per row of the draft's supervision (bounded memory).

Packing happens at the supervision level. The engine still sees one conversation per row, so each
conversation's supervision (the EAGLE-3 shift with its zero tail) is exactly its unpacked one; then
the per-position tensors (B, T, ...) of a micro-batch's conversations are laid end to end into rows of
at most ``data.max_length`` positions, with ``doc_ids`` (B', T') int64 telling them apart (the
conversation's index in the micro-batch, -1 on padding). A family whose description says ``packing``
keeps attention, RoPE positions and its loss within each document (EAGLE-3's TTT steps:
drafts/eagle3/ttt.py; the DFlash family's anchors, drawn per document as its own row would:
drafts/block_documents.py), so a packed micro-batch has the loss, metrics and gradients of the same
conversations unpacked; it only computes fewer padded positions.

``train.batch_size`` stays *conversations* per micro-batch: the data order, the resume position and
the rank shares count conversations exactly as without packing (train/parallel.py is untouched), and
packing changes which rows hold a micro-batch's conversations, never which conversations a step trains
on. So a run may switch packing on or off on resume, and N ranks still equal one rank of N x the batch.
The target's own forward is not packed: the engine's rows are padded as before.
"""

from __future__ import annotations

from dataclasses import dataclass, make_dataclass
from typing import Any, Iterable, Optional, Sequence

import torch

from draftsmith.targets.contract import supervision_tensors

__all__ = ["first_fit", "plan_rows", "pack", "packed_class", "Padding", "padding"]


def first_fit(lengths: Sequence[int], rows: int, width: int) -> Optional[list[list[int]]]:
    """Conversations into ``rows`` rows of ``width`` positions, longest first, each into the first row
    with room (first-fit decreasing; ties keep the micro-batch's order); None when one does not fit."""
    out: list[list[int]] = [[] for _ in range(rows)]
    fill = [0] * rows
    for i in sorted(range(len(lengths)), key=lambda j: -lengths[j]):
        r = next((r for r in range(rows) if fill[r] + lengths[i] <= width), None)
        if r is None:
            return None
        out[r].append(i)
        fill[r] += lengths[i]
    return out


def plan_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Conversations (indices into ``lengths``) per packed row of at most ``capacity`` positions.

    The draft computes rows x the fullest row's positions, so the plan minimises that product: for
    each row count R from the fewest first-fit-decreasing needs at ``capacity`` up, the narrowest width
    first fit still packs into R rows (a binary search), while R rows could still beat the best; one
    conversation per row (the unpacked layout) is a candidate too, so packing never pads more than
    not packing. Deterministic in ``lengths``, so a resumed run packs exactly as the interrupted one.
    Rows list their conversations in the micro-batch's order, rows by their first one. A conversation
    longer than ``capacity`` (only a hand-made batch: rendering truncates to data.max_length) widens
    the rows to it.
    """
    n = len(lengths)
    if n == 0:
        return []
    total, longest = sum(lengths), max(lengths)
    capacity = max(int(capacity), longest)
    best, best_cost = [[i] for i in range(n)], n * longest  # the unpacked layout
    rows = sum(1 for r in first_fit(lengths, n, capacity) if r)  # the fewest rows first fit needs (each fits)
    while rows < n and rows * max(longest, -(-total // rows)) < best_cost:
        lo, hi = max(longest, -(-total // rows)), capacity  # the narrowest width R rows could have .. capacity
        plan = None
        while lo <= hi:  # the narrowest width first fit packs into R rows
            mid = (lo + hi) // 2
            fit = first_fit(lengths, rows, mid)
            if fit is not None:
                plan, hi = fit, mid - 1
            else:
                lo = mid + 1
        if plan is not None:
            plan = [sorted(r) for r in plan if r]
            cost = len(plan) * max(sum(lengths[i] for i in r) for r in plan)
            if cost < best_cost:
                best, best_cost = plan, cost
        rows += 1
    return sorted(best, key=lambda r: r[0])


_PACKED: dict[type, type] = {}


def packed_class(cls: type) -> type:
    """``cls`` (a supervision dataclass) with one more field, ``doc_ids`` (B, T) int64: still a ``cls``
    to everything that reads it by field name, and its tensors go through ``supervision_to`` alike."""
    if cls not in _PACKED:
        _PACKED[cls] = make_dataclass(f"Packed{cls.__name__}", [("doc_ids", torch.Tensor)], bases=(cls,))
    return _PACKED[cls]


def pack(sup: Any, lengths: Sequence[int], capacity: int) -> Any:
    """The per-position supervision ``sup`` of B right-padded rows -> the same positions packed.

    ``lengths`` (B,): each row's real positions (the batch's attention_mask sums). Every field of ``sup``
    is (B, T, ...); row b's slots 0..lengths[b]-1 (its zero tail included) are copied to slots
    off..off+lengths[b]-1 of its packed row (:func:`plan_rows`), and the rest stays zero, with
    doc_ids -1. Returns a :func:`packed_class` instance of (B', T', ...) tensors, T' = the fullest row.
    """
    lengths = [int(n) for n in lengths]
    plan = plan_rows(lengths, capacity)
    src_b, src_t, dst_r, dst_t = [], [], [], []  # one (n,) index piece per conversation
    width = 0
    for r, row in enumerate(plan):
        off = 0
        for i in row:
            n = lengths[i]
            src_b.append(torch.full((n,), i, dtype=torch.long))
            src_t.append(torch.arange(n))
            dst_r.append(torch.full((n,), r, dtype=torch.long))
            dst_t.append(torch.arange(off, off + n))
            off += n
        width = max(width, off)
    index = [torch.cat(x) for x in (src_b, src_t, dst_r, dst_t)]  # each (N,), N = sum(lengths)
    out, on = {}, {}  # on: the index pieces per device (fields may sit on several)
    for name, x in supervision_tensors(sup).items():
        sb, st, dr, dt = on.setdefault(x.device, [ix.to(x.device) for ix in index])
        y = x.new_zeros((len(plan), width, *x.shape[2:]))  # (B', T', ...)
        y[dr, dt] = x[sb, st]
        out[name] = y
    device = next(iter(out.values())).device
    sb, _, dr, dt = on[device]
    doc = torch.full((len(plan), width), -1, dtype=torch.long, device=device)  # (B', T')
    doc[dr, dt] = sb
    return packed_class(type(sup))(**out, doc_ids=doc)


@dataclass(frozen=True)
class Padding:
    """Draft positions of a set of micro-batches: real ones, and all of them unpacked / packed."""

    real: int
    unpacked: int  # sum over micro-batches of B x the longest conversation
    packed: int  # sum over micro-batches of B' x the fullest packed row
    conversations: int
    packed_rows: int
    batches: int = 0  # micro-batches counted

    @staticmethod
    def fraction(real: int, total: int) -> float:
        return 1.0 - real / total if total else 0.0

    @property
    def unpacked_fraction(self) -> float:
        return self.fraction(self.real, self.unpacked)

    @property
    def packed_fraction(self) -> float:
        return self.fraction(self.real, self.packed)

    def describe(self, packing: bool, can_pack: bool) -> str:
        """The setup line: the padding the run computes, and the other option's when the family packs."""
        unpacked, packed = f"{100 * self.unpacked_fraction:.1f}%", f"{100 * self.packed_fraction:.1f}%"
        per_row, over = self.conversations / max(self.packed_rows, 1), f"{self.batches} micro-batches of epoch 0"
        if packing:
            return (f"data: padding {packed} of the draft's positions packed ({per_row:.1f} conversations per row), "
                    f"{unpacked} unpacked (data.packing on; {over})")
        tail = f"; data.packing would make it {packed}" if can_pack else ""
        return f"data: padding {unpacked} of the draft's positions (data.packing off{tail}; {over})"


def padding(batches: Iterable[Sequence[int]], capacity: int) -> Padding:
    """:class:`Padding` of micro-batches given as their conversations' lengths, rows of ``capacity``."""
    real = unpacked = packed = convs = rows = n = 0
    for lengths in batches:
        if not lengths:
            continue
        n += 1
        plan = plan_rows(lengths, capacity)
        real += sum(lengths)
        unpacked += len(lengths) * max(lengths)
        packed += len(plan) * max(sum(lengths[i] for i in row) for row in plan)
        convs, rows = convs + len(lengths), rows + len(plan)
    return Padding(real, unpacked, packed, convs, rows, n)
