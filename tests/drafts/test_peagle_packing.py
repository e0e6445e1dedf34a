"""P-EAGLE on packed rows (``doc_ids``): the packed supervision of 3 conversations gives the loss, metrics
and gradients of the same conversations one per row. Each document draws its COD elements with its own
conversation's generator in its own coordinates, its elements attend within it only, and its RoPE
positions restart at 0; the blocked attention path (a mask per block of query rows) gives the same."""

import pytest
import torch

from draftsmith.drafts.peagle.model import (ElementMask, attention_mask, cod_sample, document_spans, packed_sample,
                                            pad_elements)
from draftsmith.targets import Batch, Features
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.train.packing import pack
from test_peagle import H, HT, MASK, V, VD, make_draft

LENGTHS = [7, 5, 9]  # three conversations, right-padded to S = 9 unpacked


def supervision(seed=0):
    """eagle3 supervision of 3 right-padded conversations as an engine builds it (random aux and logits,
    junk on the pads), and its lengths."""
    g = torch.Generator().manual_seed(seed)
    b, s = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(0, V, (b, s), generator=g)
    ids[ids == MASK] = MASK + 1  # the mask token never occurs in text
    attn = torch.zeros(b, s, dtype=torch.long)
    loss = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        attn[i, :n] = 1
        loss[i, 2:n] = 1  # a 2-token prompt, then the answer
    loss[2, 4] = 0  # a hole inside one answer
    batch = Batch(ids, attn, loss)
    feats = Features(aux_hidden=torch.randn(b, s, 3, HT, generator=g) * 3, logits=torch.randn(b, s, V, generator=g) * 3)
    return batch, eagle3_supervision(batch, feats, torch.arange(VD))  # VD < V: some argmaxes outside


def generators(kind):
    if kind == "per_row":  # the trainer's: one per conversation (train/loop.py row_generators)
        return [torch.Generator().manual_seed(100 + i) for i in range(len(LENGTHS))]
    return torch.Generator().manual_seed(100)  # one for every row: documents draw in the rows' order


def run(sup, kind, blocked=False, train=True):
    d = make_draft(seed=11, fc_norm=True)
    if blocked:  # a few query rows per attention block, each block and each layer recomputed in backward
        d.max_score_elements = 2 * 3 * 40
        d.activation_checkpointing = True
    d.train(train)
    out = d.supervised(sup, generators(kind))
    out.loss.backward()
    return out, {n: p.grad for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("capacity,rows", [(14, 2), (21, 1)])
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("kind", ["per_row", "shared"])
def test_packed_equals_unpacked_loss_metrics_and_gradients(capacity, rows, blocked, kind):
    batch, sup = supervision()
    packed = pack(sup, batch.attention_mask.sum(1).tolist(), capacity)
    assert packed.input_ids.shape[0] == rows and packed.input_ids.numel() < sup.input_ids.numel()
    ref, ref_grads = run(sup, kind)
    got, grads = run(packed, kind, blocked)
    assert int(ref.depth_count[1:].sum()) > 0  # COD kept deeper elements
    torch.testing.assert_close(got.loss.detach(), ref.loss.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(got.depth_losses, ref.depth_losses, rtol=1e-5, atol=1e-7)
    for name in ("depth_correct", "depth_prefix", "depth_count"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    assert torch.equal(got.parts.den, ref.parts.den)
    assert grads.keys() == ref_grads.keys() and "mask_hidden" in grads
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize("capacity", [14, 21])
def test_packed_held_out_metrics_equal_unpacked(capacity):
    """Eval mode (every (anchor, depth), no COD): per document, never across a boundary."""
    batch, sup = supervision(seed=2)
    packed = pack(sup, batch.attention_mask.sum(1).tolist(), capacity)
    ref, _ = run(sup, "per_row", train=False)
    got, _ = run(packed, "per_row", train=False)
    torch.testing.assert_close(got.loss.detach(), ref.loss.detach(), rtol=1e-5, atol=0)
    for name in ("depth_correct", "depth_prefix", "depth_count"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name


def test_each_document_draws_as_its_own_row():
    """packed_sample: depth 0 at every slot, then document j's draws with generator j, offset to its slots."""
    doc = torch.tensor([[0] * 7 + [1] * 5, [2] * 9 + [-1] * 3])
    assert document_spans(doc) == {0: (0, 0, 7), 1: (0, 7, 12), 2: (1, 0, 9)}
    valid = doc >= 0
    valid[0, 3] = valid[0, 6] = valid[0, 11] = False  # holes and each document's zero tail
    valid[1, 8] = False
    draw = lambda j, v: cod_sample(v, 4, 0.8, 0.2, torch.Generator().manual_seed(j))  # noqa: E731
    rows = packed_sample(doc, valid, draw)
    for r, (a, d) in enumerate(rows):
        assert torch.equal(a[:12], torch.arange(12)) and not d[:12].any()
    for j, (r, s, e) in document_spans(doc).items():
        a, d = rows[r]
        mine = (d > 0) & (a >= s) & (a < e)
        own_a, own_d = draw(j, valid[r, s:e])
        assert torch.equal(a[mine] - s, own_a[own_d > 0]) and torch.equal(d[mine], own_d[own_d > 0])
        assert ((a[mine] + d[mine]) < e).all()  # every ref inside the document
    assert sum(int((d > 0).sum()) for _, d in rows) == sum(
        int((draw(j, valid[r, s:e])[1] > 0).sum()) for j, (r, s, e) in document_spans(doc).items())


def test_no_attention_across_documents_and_positions_restart():
    doc = torch.tensor([[0] * 5 + [1] * 6 + [-1]])  # document A at slots 0..4, B at 5..10, a pad slot
    valid = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0, 0]]).bool()
    draw = lambda j, v: cod_sample(v, 4, 1.0, 0.2, torch.Generator().manual_seed(j))  # noqa: E731
    anchor, depth, real = pad_elements(packed_sample(doc, valid, draw))
    el_doc = doc.gather(1, anchor)
    mask = attention_mask(anchor, depth, real, el_doc)[:, 0]  # (1, N, N) bool
    assert not (mask & (el_doc[:, :, None] != el_doc[:, None, :])).any()
    blocks = ElementMask(anchor, depth, real, el_doc)
    assert torch.equal(torch.cat([blocks.rows(a, min(a + 3, anchor.shape[1])) for a in range(0, anchor.shape[1], 3)], 2),
                       mask[:, None])  # per-block rules = the whole mask
    d = make_draft(seed=3)
    g = torch.Generator().manual_seed(4)
    aux, ids = torch.randn(1, 12, 3, HT, generator=g) * 3, torch.randint(0, V, (1, 12), generator=g)
    with torch.no_grad():
        ref = d.flat_forward(aux, ids, anchor, depth, real, doc)
        aux2, ids2 = aux.clone(), ids.clone()
        aux2[:, :5] += 5.0
        ids2[:, :5] = (ids2[:, :5] + 7) % V
        got = d.flat_forward(aux2, ids2, anchor, depth, real, doc)
        b_el = (el_doc[0] == 1) & real[0]
        torch.testing.assert_close(got[0, b_el], ref[0, b_el], rtol=1e-6, atol=1e-6)  # B never reads A
        assert not torch.allclose(got[0, el_doc[0] == 0], ref[0, el_doc[0] == 0])
        # B alone in a row of its own (positions from 0) = B's elements in the packed row
        alone = d.flat_forward(aux[:, 5:11], ids[:, 5:11], anchor[:, b_el] - 5, depth[:, b_el], real[:, b_el])
        torch.testing.assert_close(ref[0, b_el], alone[0], rtol=1e-5, atol=1e-5)
    # RoPE is relative, so a uniform shift within a document changes only rounding: check the positions
    seen = []
    layers = d.run_layers
    d.run_layers = lambda hidden, ids, positions, mask: seen.append(positions) or layers(hidden, ids, positions, mask)
    with torch.no_grad():
        d.flat_forward(aux, ids, anchor, depth, real, doc)
    local = torch.where(el_doc == 1, anchor - 5, anchor) + depth  # A from slot 0, B from slot 5
    mine = real & (el_doc >= 0)  # the pad slot's position is its own run's (no real element reads it)
    assert torch.equal(seen[0][mine], local[mine]) and seen[0][0, 5].item() == 0


def test_blocked_attention_equals_one_block_without_packing():
    """The ElementMask path in blocks of query rows = one block = the old dense fp32 additive mask."""
    batch, sup = supervision(seed=5)
    d = make_draft(seed=6)
    valid = sup.loss_mask.bool()
    rows = [cod_sample(valid[i], 4, 0.8, 0.2, torch.Generator().manual_seed(i)) for i in range(3)]
    anchor, depth, real = pad_elements(rows)
    aux = sup.aux_hidden.float()
    with torch.no_grad():
        one = d.flat_forward(aux, sup.input_ids, anchor, depth, real)
        dense = attention_mask(anchor, depth, real)
        additive = torch.zeros(dense.shape).masked_fill(~dense, float("-inf"))  # the former (B, 1, N, N) fp32
        h = d.combine(aux).gather(1, anchor[..., None].expand(-1, -1, H))
        hidden = torch.where((depth == 0)[..., None], h, d.combine(d.mask_hidden))
        ids = torch.where(depth == 0, sup.input_ids.gather(1, anchor), MASK)
        old = d.run_layers(hidden, ids, (anchor + depth).clamp(min=0), additive)
        d.max_score_elements = 3 * 2 * anchor.shape[1]  # 1 query row a block
        blocked = d.flat_forward(aux, sup.input_ids, anchor, depth, real)
    assert torch.equal(one, old)
    torch.testing.assert_close(blocked, one, rtol=1e-6, atol=1e-6)
