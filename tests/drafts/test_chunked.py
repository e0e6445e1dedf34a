"""Bounded-memory losses and activation checkpointing: the loss over the vocabulary in chunks of rows
(drafts/chunked.py) equals the unchunked one, loss and gradients, for DFlash's CE, JetSpec's KD and
Domino's two CEs; JetSpec's teacher from the target's last state is the engines' rebuilt logits; a
draft with activation checkpointing gives the loss and gradients it gives without."""

import pytest
import torch
import torch.nn.functional as F

from draftsmith.drafts.chunked import MAX_ELEMENTS, chunked_rows, chunked_soft_ce, rows_per_chunk
from draftsmith.drafts.dflash import domino, jetspec
from draftsmith.drafts.dflash.model import DFlashDraft
from draftsmith.targets.contract import rebuild_logits
import test_peagle
from test_dflash import DOMINO, H, V, make_draft, make_sup

FAMILIES = [(DFlashDraft, {}), (jetspec.JetSpecDraft, {"causal": True, "extra": {"kd_temperature": 2.0}}),
            (domino.DominoDraft, {"extra": dict(DOMINO)})]
IDS = ["dflash", "jetspec", "domino"]


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-6) -> bool:
    """|a - b| <= rel * max|b| (elementwise tolerances fail on gradients that are 0 in one place)."""
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


def loss_and_grads(m: torch.nn.Module, sup, seed: int = 11):
    m.zero_grad()
    torch.manual_seed(seed)  # the same anchors every time
    out = m(sup)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}


# ---- the helper ----------------------------------------------------------------------------------


def test_rows_per_chunk():
    assert rows_per_chunk(128 * 1024) == 128 and MAX_ELEMENTS == 2 ** 24  # 128 rows of a 128k vocab
    assert rows_per_chunk(50, 120) == 2 and rows_per_chunk(50, 10) == 1  # at least one row
    with pytest.raises(ValueError, match="max_elements=0 and width=50 must be >= 1"):
        rows_per_chunk(50, 0)


@pytest.mark.parametrize("soft", [False, True], ids=["labels", "teacher"])
def test_chunked_soft_ce_equals_the_whole_loss(soft):
    g = torch.Generator().manual_seed(0)
    n, h, v = 13, 8, 50
    w = torch.randn(v, h, generator=g)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    weight = torch.rand(n, generator=g)
    teacher = torch.randn(n, v, generator=g) * 3
    labels = torch.randint(0, v, (n,), generator=g)
    target = (lambda sl: teacher[sl]) if soft else labels
    runs = {}
    for budget in (MAX_ELEMENTS, 4 * v, 1):  # one chunk, chunks of 4 rows (the last of 1), one row each
        hidden.grad = None
        loss, hits = chunked_soft_ce(hidden, lambda x: x @ w.T, target, vocab_size=v, weight=weight,
                                     temperature=2.0, max_elements=budget)
        loss.backward()
        runs[budget] = loss.detach(), hits, hidden.grad.clone()
    # the by-hand loss, all rows at once
    s = (hidden @ w.T).float()
    if soft:
        t = F.log_softmax(teacher / 2.0, -1)
        ref = (weight * (t.exp() * (t - F.log_softmax(s / 2.0, -1))).sum(-1)).sum()
        ref_hits = s.argmax(-1) == teacher.argmax(-1)
    else:
        ref = (weight * F.cross_entropy(s, labels, reduction="none")).sum()
        ref_hits = s.argmax(-1) == labels
    whole = runs[MAX_ELEMENTS]
    assert torch.equal(whole[0], ref.detach()) and torch.equal(whole[1], ref_hits)  # one chunk: the same ops
    for budget in (4 * v, 1):
        loss, hits, grad = runs[budget]
        assert close(loss, whole[0]) and torch.equal(hits, whole[1]) and close(grad, whole[2]), budget


def test_no_rows_by_vocab_tensor_is_kept_for_backward():
    # what autograd saves outside the checkpointed chunks: the (N, H) states, never an (N, V) tensor
    g = torch.Generator().manual_seed(0)
    n, h, v = 64, 8, 4096
    w = torch.randn(v, h, generator=g)
    hidden = torch.randn(n, h, generator=g, requires_grad=True)
    labels = torch.randint(0, v, (n,), generator=g)
    for budget in (MAX_ELEMENTS, 8 * v):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            loss, _ = chunked_soft_ce(hidden, lambda x: x @ w.T, labels, vocab_size=v, max_elements=budget)
        if budget == MAX_ELEMENTS:  # one chunk, the plain ops: the (N, V) logits are saved
            assert max(saved) == n * v
        else:  # 8 chunks of 8 rows, recomputed in backward: nothing as large as one row of logits
            assert max(saved) < v, max(saved)
        loss.backward()


def test_chunked_rows_sums_scalars_and_concatenates_rows_and_checks_labels():
    x = torch.arange(10.0, requires_grad=True)
    seen = []

    def fn(start, xs):
        seen.append((start, xs.shape[0]))
        return (xs.square().sum(), xs * 2)

    total, doubled = chunked_rows(fn, [x], width=4, max_elements=12)  # 3 rows a chunk
    assert seen == [(0, 3), (3, 3), (6, 3), (9, 1)] and float(total.detach()) == 285.0
    assert torch.equal(doubled, x.detach() * 2)
    total.backward()
    assert torch.equal(x.grad, 2 * x.detach())
    with pytest.raises(ValueError, match=r"target labels have shape \(3,\); expected \(4,\)"):
        chunked_soft_ce(torch.zeros(4, 2), lambda h: h, torch.zeros(3, dtype=torch.long), vocab_size=2)


# ---- the drafts ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,kw", FAMILIES, ids=IDS)
def test_chunked_draft_loss_and_grads_equal_the_unchunked(cls, kw):
    m = make_draft(cls, **kw)
    if cls is domino.DominoDraft:
        torch.nn.init.normal_(m.embed_proj[2].weight)  # a live correction head
        m.set_progress(5, 20)  # lambda 0.5: both CEs count
    sup = make_sup()
    whole, whole_g = loss_and_grads(m, sup)
    m.max_logit_elements = 3 * V  # 3 rows a chunk (B x S x V = 1600 > 150: JetSpec's teacher per chunk too)
    part, part_g = loss_and_grads(m, sup)
    assert int(whole.sums["pos_count"].sum()) > 6  # several chunks
    assert close(part.loss.detach(), whole.loss.detach())
    assert whole_g.keys() == part_g.keys() and whole_g
    for name in whole_g:
        assert close(part_g[name], whole_g[name]), name
    for key in whole.sums:
        assert torch.equal(part.sums[key], whole.sums[key]), key  # the hits come from the same chunks


def test_jetspec_teacher_from_the_last_state_is_the_rebuilt_logits():
    m = make_draft(jetspec.JetSpecDraft, causal=True, extra={"kd_temperature": 2.0})
    last = make_sup().last_hidden  # (B, S, H)
    for dtype in (torch.float32, torch.bfloat16):
        h = last.to(dtype)
        ref = rebuild_logits(h, m.teacher_norm, m.lm_head, m.teacher_eps)  # what the engines made: (B, S, V)
        got = m.teacher_logits(h)
        assert got.dtype == dtype and torch.equal(got, ref)
        assert torch.equal(torch.softmax(got.float(), -1), torch.softmax(ref.float(), -1))
        rows = m.teacher_logits(h[0, 3:7])  # a chunk's rows alone: the same up to rounding
        torch.testing.assert_close(rows.float(), ref[0, 3:7].float(), atol=1e-4 if dtype == torch.float32 else 0.2,
                                   rtol=1e-5 if dtype == torch.float32 else 0.02)
    m.teacher_norm = None
    with pytest.raises(RuntimeError, match=r"attach_teacher\(final_norm_weight, eps\)"):
        m.teacher_logits(last)
    assert "teacher_norm" not in m.state_dict()  # never saved: the export is what it was


def test_jetspec_attach_target_takes_the_final_norm():
    m = jetspec.JetSpecDraft(make_draft(jetspec.JetSpecDraft, causal=True).cfg)
    lm_head, norm = torch.randn(V, H), torch.rand(H)
    jetspec.attach_target(m, None, embeddings=torch.randn(V, H), head=lambda: (lm_head, norm), vocab=None)
    assert m.lm_head is not None and torch.equal(m.teacher_norm, norm) and m.teacher_eps == m.cfg.rms_norm_eps
    assert sorted(m.state_dict()) == sorted(DFlashDraft(m.cfg).state_dict())


# ---- activation checkpointing --------------------------------------------------------------------


@pytest.mark.parametrize("cls,kw", FAMILIES, ids=IDS)
def test_activation_checkpointing_gives_the_same_loss_and_grads(cls, kw):
    m = make_draft(cls, **kw)
    sup = make_sup()
    calls = []
    m.layers[1].register_forward_pre_hook(lambda *_: calls.append(1))
    ref, ref_g = loss_and_grads(m, sup)
    m.activation_checkpointing = True
    got, got_g = loss_and_grads(m, sup)
    assert len(calls) == 3  # once without; with it, once forward and once again in backward
    torch.testing.assert_close(got.loss, ref.loss, rtol=1e-6, atol=1e-6)
    assert ref_g.keys() == got_g.keys()
    for name in ref_g:
        torch.testing.assert_close(got_g[name], ref_g[name], rtol=1e-6, atol=1e-6, msg=name)
    with torch.no_grad():  # eval: nothing to recompute, the plain path
        torch.manual_seed(11)
        torch.testing.assert_close(m(sup).loss, ref.loss, rtol=1e-6, atol=1e-6)


def test_peagle_activation_checkpointing_gives_the_same_loss_and_grads():
    m = test_peagle.make_draft(num_draft_layers=3)
    aux, ids, probs, mask = test_peagle.make_batch()

    def run():
        m.zero_grad()
        out = m(aux, ids, probs, mask, generator=torch.Generator().manual_seed(3))
        out.loss.backward()
        return out.loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    ref, ref_g = run()
    m.activation_checkpointing = True
    got, got_g = run()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    assert ref_g.keys() == got_g.keys() and len(ref_g) > 10
    for name in ref_g:
        torch.testing.assert_close(got_g[name], ref_g[name], rtol=1e-6, atol=1e-6, msg=name)
