"""The DFlash family (DFlash, JetSpec, Domino) on packed rows (``doc_ids``): the same loss, metrics and
gradients as the same conversations unpacked (each document draws its anchors as its own row would),
no attention across documents, RoPE positions restarting per document."""

import pytest
import torch
from torch import nn

from draftsmith.drafts.dflash import domino, jetspec
from draftsmith.drafts.block_documents import document_rows, document_spans, place_anchors
from draftsmith.drafts.dflash.model import DFlashDraft, block_inputs, document_anchors, sample_anchors, visibility
from draftsmith.drafts.block_supervision import DFlashKDSupervision, DFlashSupervision
from draftsmith.train.packing import pack
from test_dflash import DOMINO, H, MASK, V, make_draft

LENGTHS = [11, 7, 14]  # three conversations, right-padded to S = 14 unpacked; 7 + 14 > 14: 2 rows at 21
FAMILIES = {
    "dflash": (DFlashDraft, {}),
    "jetspec": (jetspec.JetSpecDraft, dict(causal=True, extra={"kd_temperature": 2.0})),
    "domino": (domino.DominoDraft, dict(extra=dict(DOMINO))),
}


def supervision(kd: bool, seed: int = 0):
    """dflash (or dflash_kd) supervision of 3 right-padded conversations (pads hold junk, as an engine's
    may) and their lengths. The 7-token one has answers within a block of its end: its blocks run past it."""
    g = torch.Generator().manual_seed(seed)
    b, s = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(0, V, (b, s), generator=g)
    loss = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        loss[i, 2:n] = 1  # a 2-token prompt, then the answer
        ids[i, n:] = 3  # pad id
    aux = torch.randn(b, s, 2, H, generator=g)
    if kd:
        return DFlashKDSupervision(aux, ids, loss, torch.randn(b, s, H, generator=g) * 3), LENGTHS
    return DFlashSupervision(aux, ids, loss), LENGTHS


def model(family: str, blocked: bool):
    cls, kw = FAMILIES[family]
    d = make_draft(cls, seed=5, num_anchors=6, **kw)
    if isinstance(d, domino.DominoDraft):  # a live correction head and a mixed loss: every part has gradients
        nn.init.normal_(d.embed_proj[2].weight, generator=torch.Generator().manual_seed(6))
        d.set_progress(1, 4)  # lambda 0.5
    if blocked:  # 3 logit rows per loss chunk, each layer recomputed in backward
        d.max_logit_elements, d.activation_checkpointing = 3 * V, True
    return d


def draws(kind: str):
    """The anchors' randomness, fresh for each run: one generator per conversation (the trainer's), one
    for the batch (eval mode's fixed one), or torch's global RNG."""
    if kind == "rows":
        return [torch.Generator().manual_seed(40 + i) for i in range(len(LENGTHS))]
    if kind == "one":
        return torch.Generator().manual_seed(0)
    torch.manual_seed(7)
    return None


def run(d, sup, kind):
    out = d(sup, draws(kind))
    d.zero_grad()
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("capacity,rows", [(21, 2), (32, 1)])
@pytest.mark.parametrize("kind,blocked", [("rows", False), ("rows", True), ("one", False), ("global", False)])
def test_packed_equals_unpacked_loss_metrics_and_gradients(family, capacity, rows, kind, blocked):
    sup, lengths = supervision(family == "jetspec")
    packed = pack(sup, lengths, capacity)
    assert packed.input_ids.shape[0] == rows and packed.input_ids.numel() < sup.input_ids.numel()
    d = model(family, blocked)
    ref, ref_grads = run(d, sup, kind)
    got, grads = run(d, packed, kind)
    assert float(ref.parts.den.sum()) > 0
    torch.testing.assert_close(got.loss.detach(), ref.loss.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(got.parts.den, ref.parts.den, rtol=1e-6, atol=0)  # the same supervised positions
    for name in ref.sums:
        assert torch.equal(got.sums[name], ref.sums[name]), name
    assert grads.keys() == ref_grads.keys() and len(grads) == len(list(d.parameters()))
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_document_anchors_are_each_rows_own_draws_moved_to_its_slots():
    # one packed row: document 0 in slots 0..2, document 1 in 3..7, one pad slot; and one row of document 2
    doc = torch.tensor([[0] * 3 + [1] * 5 + [-1], [2] * 4 + [-1] * 5])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0]])
    row, start, length = document_spans(doc, 3)
    assert (row.tolist(), start.tolist(), length.tolist()) == ([0, 0, 1], [0, 3, 0], [3, 5, 4])
    local, _ = document_rows(mask, doc, 3)  # (D, W = 5): each document as its own unpacked row
    assert local.long().tolist() == [[0, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    anchor, keep, first, end = document_anchors(mask, doc, 2, 8, [torch.Generator().manual_seed(i) for i in range(3)])
    ref, ref_keep = sample_anchors(local, 2, 8, [torch.Generator().manual_seed(i) for i in range(3)])
    # bs 2, W 5: valid local anchors a <= 3 -> document 0 {1, 2}, 1 {0, 1, 2, 3}, 2 {0, 1, 2}
    assert ref.tolist() == [[1, 2, 0, 0], [0, 1, 2, 3], [0, 1, 2, 0]] and ref_keep.sum().item() == 9
    assert anchor.tolist() == [[1, 2, 3, 4, 5, 6], [0, 1, 2, 0, 0, 0]]  # document 1's shifted by its start, 3
    assert keep.tolist() == [[True] * 6, [True] * 3 + [False] * 3]
    assert first.tolist() == [[0, 0, 3, 3, 3, 3], [0] * 6] and end.tolist() == [[3, 3, 8, 8, 8, 8], [4, 4, 4, 0, 0, 0]]
    assert place_anchors(ref, ref_keep, document_spans(doc, 3), 2, 9)[0].tolist() == anchor.tolist()
    # labels stop at the document's end: document 0's block at slot 2 runs past it (as its unpacked row's
    # runs into padding), and slot 3, supervised, is document 1's
    _, _, _, lmask = block_inputs(torch.zeros_like(doc), mask, anchor, keep, 2, MASK, 0, end)
    assert lmask[0, :, 1].tolist() == [True, False, True, True, True, False]
    _, _, _, unsplit = block_inputs(torch.zeros_like(doc), mask, anchor, keep, 2, MASK, 0)
    assert unsplit[0, :, 1].tolist() == [True, True, True, True, True, False]


def test_visibility_stops_at_the_document_start():
    anchor, start = torch.tensor([[3, 7]]), torch.tensor([[0, 5]])
    vis = visibility(anchor, 9, 2, False, start)[0]  # (Q = 4, S + Q = 13)
    ctx = vis[:, :9].long().tolist()
    assert ctx[0] == ctx[1] == [1, 1, 1, 0, 0, 0, 0, 0, 0]
    assert ctx[2] == ctx[3] == [0, 0, 0, 0, 0, 1, 1, 0, 0]  # slots 5, 6: its document before the anchor
    assert torch.equal(vis[:, 9:], visibility(anchor, 9, 2, False)[0, :, 9:])


@pytest.mark.parametrize("family", list(FAMILIES))
def test_no_attention_across_documents(family):
    """Perturb one packed document (states, ids, teacher): the other documents' blocks do not move."""
    sup, lengths = supervision(family == "jetspec", seed=2)
    packed = pack(sup, lengths, 32)  # one row: documents 0, 1, 2 in slots 0..10, 11..17, 18..31
    d = model(family, False).eval()

    def blocks(p):
        with torch.no_grad():
            return d.blocks(p.aux_hidden, p.input_ids, p.loss_mask, draws("rows"), p.doc_ids)

    h, labels, lmask, anchor = blocks(packed)
    owner = packed.doc_ids.gather(1, anchor)  # (1, N) each block's document
    for target in range(3):
        other = pack(sup, lengths, 32)
        span = packed.doc_ids[0] == target
        other.aux_hidden[:, span] += 5.0
        other.input_ids[:, span] = (other.input_ids[:, span] + 7) % V
        if family == "jetspec":
            other.last_hidden[:, span] -= 2.0
        h2, labels2, lmask2, anchor2 = blocks(other)
        assert torch.equal(anchor2, anchor) and torch.equal(lmask2, lmask)
        rest = owner[0] != target
        torch.testing.assert_close(h2[:, rest], h[:, rest], rtol=1e-6, atol=1e-6)
        assert torch.equal(labels2[:, rest][lmask[:, rest]], labels[:, rest][lmask[:, rest]])
        assert not torch.allclose(h2[:, ~rest], h[:, ~rest])
        # JetSpec's teacher and Domino's GRU read their own document only: the other documents' losses agree
        for doc in set(range(3)) - {target}:
            losses = [document_loss(d, p, doc) for p in (packed, other)]
            torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=0)


def document_loss(d, p, doc):
    """The loss of one document's supervised positions of packed rows ``p`` (the others' masked out)."""
    keep = (p.doc_ids == doc) & p.loss_mask.bool()
    masked = type(p)(**{**{f: getattr(p, f) for f in p.__dataclass_fields__}, "loss_mask": keep.long()})
    with torch.no_grad():
        return d(masked, draws("rows")).loss


class Recorder(nn.Module):
    """The draft's rotary embedding, remembering every positions tensor it rotates at."""

    def __init__(self, rotary):
        super().__init__()
        self.rotary, self.calls = rotary, []

    def forward(self, positions):
        self.calls.append(positions.clone())
        return self.rotary(positions)


def test_positions_restart_per_document():
    """Context positions count from each document's first slot, and each block's from its local anchor:
    the positions its conversation's own row rotates at (RoPE's scores are shift-invariant, so the
    outputs alone could not tell)."""
    sup, lengths = supervision(False, seed=3)
    packed = pack(sup, lengths, 32)
    d = model("dflash", False).eval()
    d.rotary = Recorder(d.rotary)
    with torch.no_grad():
        _, _, _, anchor = d.blocks(packed.aux_hidden, packed.input_ids, packed.loss_mask, draws("rows"), packed.doc_ids)
        ctx_pos, block_pos = d.rotary.calls
        _, _, _, ref_anchor = d.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask, draws("rows"))
        ref_ctx, ref_block = d.rotary.calls[2:]
    assert ctx_pos[0].tolist() == [*range(11), *range(7), *range(14)]
    assert torch.equal(ref_ctx[0], torch.arange(14))
    bs = d.cfg.block_size
    owner = packed.doc_ids.gather(1, anchor)[0]
    got = {(int(o), tuple(block_pos[0, j * bs:(j + 1) * bs].tolist())) for j, o in enumerate(owner)
           if int(anchor[0, j]) > 0}
    ref = {(b, tuple(ref_block[b, j * bs:(j + 1) * bs].tolist())) for b in range(3)
           for j in range(ref_anchor.shape[1]) if int(ref_anchor[b, j]) > 0}
    assert got == ref and len(got) > 9
    assert max(p[0] for _, p in got) < 14  # never the packed slot (document 2 starts at slot 18)
