"""EAGLE-3 on packed rows (``doc_ids``): positions restart per document, attention never crosses one,
step k scores slot t only when slot t + k is in the same document; the blocked attention path too."""

import pytest
import torch

from draftsmith.drafts.eagle3.ttt import attention_mask, same_document
from draftsmith.drafts.layers import document_positions
from test_eagle3 import HT, V, VD, make_draft

# one packed row of T = 12: document A in slots 0..4, document B in 5..10, one pad slot
DOC = torch.tensor([[0] * 5 + [1] * 6 + [-1]])
A, B = slice(0, 5), slice(5, 11)
BLOCKED = 2 * 2 * 12  # max_score_elements: 2 heads x 1 row x 12 keys -> 2 query rows a block


def row(t=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, t, 3, HT, generator=g) * 3, torch.randint(0, V, (1, t), generator=g)


def steps(d, aux, ids, doc=None):
    with torch.no_grad():
        return [s.hidden for s in d.iter_steps(aux, ids, doc_ids=doc)]  # per step (1, T, H)


def test_positions_restart_and_same_document_rules():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]
    assert same_document(doc, 0)[0].tolist() == [True] * 6 + [False] * 2  # padding is no document
    assert same_document(doc, 1)[0].tolist() == [True, True, False, True, False, False, False, False]
    assert same_document(doc, 2)[0].tolist() == [True, False, False, False, False, False, False, False]
    assert same_document(doc, 2)[1].tolist() == [True] * 6 + [False] * 2  # the row's end: no slot t + k
    m = attention_mask(2, 5, doc.device, doc)  # query rows 2..4, keys 0..4
    assert m.shape == (2, 1, 3, 5)
    assert m[0, 0].tolist() == [[True, True, True, False, False], [False, False, False, True, False],
                                [False, False, False, True, True]]
    assert torch.equal(m[1, 0], attention_mask(2, 5, doc.device))  # one document: the causal rule


@pytest.mark.parametrize("blocked", [False, True])
def test_no_attention_across_documents(blocked):
    d = make_draft(seed=2, fc_norm=True, norm_output=True)
    if blocked:
        d.max_score_elements = BLOCKED
    aux, ids = row()
    ref = steps(d, aux, ids, DOC)
    aux2, ids2 = aux.clone(), ids.clone()
    aux2[:, A] += 5.0
    ids2[:, A] = (ids2[:, A] + 7) % V
    for k, (a, b) in enumerate(zip(ref, steps(d, aux2, ids2, DOC))):
        torch.testing.assert_close(b[:, B], a[:, B], rtol=1e-6, atol=1e-6, msg=f"step {k}")  # B never reads A
        assert not torch.allclose(b[:, A], a[:, A])
    aux3, ids3 = aux.clone(), ids.clone()
    aux3[:, B] -= 4.0
    ids3[:, B] = (ids3[:, B] + 3) % V
    for k, (a, b) in enumerate(zip(ref, steps(d, aux3, ids3, DOC))):
        # A's slot t reads B's ids only at step k >= 5 - t (those slots learn nothing: same_document)
        keep = slice(0, 5 - k)
        torch.testing.assert_close(b[:, keep], a[:, keep], rtol=1e-6, atol=1e-6, msg=f"step {k}")


@pytest.mark.parametrize("blocked", [False, True])
def test_a_packed_document_equals_its_own_row(blocked):
    """Document B at slots 5..10 of the packed row = B alone in a row of its own (positions from 0)."""
    d = make_draft(seed=4)
    if blocked:
        d.max_score_elements = BLOCKED
    aux, ids = row(seed=3)
    ids[:, 11] = 0  # what B's own row reads past its end (the zero tail)
    packed = steps(d, aux, ids, DOC)
    alone = steps(d, aux[:, 5:], ids[:, 5:])
    unsplit = steps(d, aux, ids)  # the same row as one document: B's positions would start at 5
    for k in range(len(packed)):
        torch.testing.assert_close(packed[k][:, B], alone[k][:, :6], rtol=1e-5, atol=1e-5, msg=f"step {k}")
    assert not torch.allclose(unsplit[0][:, B], alone[0][:, :6], atol=1e-3)


def test_ttt_steps_never_score_across_a_boundary():
    """Every real slot supervised: step k scores sum over documents of (length - k), not T - k."""
    d = make_draft(seed=1, ttt_steps=4)
    aux, ids = row()
    g = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(1, 12, VD, generator=g), -1)
    mask = (DOC >= 0).float()
    out = d(aux, ids, probs, mask.bool(), mask, doc_ids=DOC)
    assert out.step_count.tolist() == [5 + 6, 4 + 5, 3 + 4, 2 + 3]
    assert d(aux, ids, probs, mask.bool(), mask).step_count.tolist() == [11, 10, 9, 8]  # without doc_ids
    assert int(out.parts.den[3]) == 5  # the CE's counts too
