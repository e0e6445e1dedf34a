"""EAGLE-3's memory savers change no number: a long row's checkpointed TTT step in blocks of positions,
the blocked CE reading h_pre (its own final norm, no (N, H) copy), the frozen lm_head cast once or a
slice at a time under autocast, and bf16 aux states read by fc without an fp32 round trip."""

import pytest
import torch
import torch.nn.functional as F

from draftsmith.drafts.eagle3.ttt import FrozenHead
from test_eagle3 import H, VD, make_batch, make_draft

NORMS = dict(fc_norm=True, norm_output=True, norm_before_residual=True)


def close(a: torch.Tensor, b: torch.Tensor, rel: float) -> bool:
    """|a - b| <= rel * max|b| (elementwise tolerances fail on gradients that are 0 in one place)."""
    return float((a - b).abs().max()) <= rel * max(float(b.abs().max()), 1e-30)


def run(d, batch, autocast: bool = False):
    d.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = d(*batch)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("flags", [{}, NORMS], ids=["plain", "norms"])
def test_checkpointed_step_in_blocks_of_positions_equals_the_whole_step(flags):
    """2 query rows a block (scores budget 2 rows x 2 heads x 2 rows x 13 keys), 3 rows a CE block, every block
    recomputed in backward: the loss, metrics and gradients of one unblocked, uncheckpointed step."""
    batch = make_batch(t=13, seed=4)
    ref, ref_g = run(make_draft(seed=3, **flags), batch)
    d = make_draft(seed=3, **flags)
    d.activation_checkpointing = True
    d.max_score_elements, d.max_logit_elements = 2 * 2 * 2 * 13, 3 * VD
    calls = []
    d.step_rows = lambda *a, **k: calls.append(a[-2]) or type(d).step_rows(d, *a, **k)  # start of each block
    got, got_g = run(d, batch)
    assert sorted(calls) == sorted(list(range(0, 13, 2)) * 3 * 2)  # 7 blocks, 3 steps, forward and recompute
    assert abs(float(got.loss.detach() / ref.loss.detach()) - 1) < 1e-6
    for name in ("step_correct", "prefix_correct", "step_count"):
        assert torch.equal(getattr(got, name), getattr(ref, name))
    assert got_g.keys() == ref_g.keys()
    for name in ref_g:
        assert close(got_g[name], ref_g[name], 1e-6), name


def test_frozen_lm_head_is_cast_once_per_forward_under_autocast():
    """One CE block per step: autograd kept each step's own bf16 copy of the frozen (Vd, H) lm_head;
    now the steps share one, with bitwise the same loss and gradients."""
    batch = make_batch(t=8, seed=2)

    def saved_heads(d):
        seen = []

        def pack(t):
            if t.dtype == torch.bfloat16 and t.shape in ((VD, H), (H, VD)):  # the weight, or linear's W.T
                seen.append(t.data_ptr())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, grads = run(d, batch, autocast=True)
        return out, grads, seen

    d = make_draft(seed=5)
    d.lm_head.weight.requires_grad_(False)
    out, grads, seen = saved_heads(d)
    assert len(seen) == 3 and len(set(seen)) == 1  # three steps, one copy
    d.logits_fn = lambda: d.compute_logits  # the old path: autocast casts at each step
    ref, ref_grads, seen = saved_heads(d)
    assert len(set(seen)) == 3
    assert torch.equal(out.loss, ref.loss) and grads.keys() == ref_grads.keys()
    for name in grads:
        assert torch.equal(grads[name], ref_grads[name]), name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_frozen_head_slices_equal_the_one_matmul(dtype):
    """FrozenHead casts 3 rows of W at a time: the logits and x's gradient of autocast's one GEMM, up to
    the summation order (in bf16 then one rounding may land one bf16 step, 2^-8, apart)."""
    g = torch.Generator().manual_seed(0)
    w, x0, up = torch.randn(10, 16, generator=g), torch.randn(5, 16, generator=g), torch.randn(5, 10, generator=g)
    x = x0.clone().requires_grad_(True)
    got = FrozenHead.apply(x, w, dtype, 3)
    (got * up).sum().backward()
    xr = x0.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        ref = F.linear(xr, w).float()
    (ref * up).sum().backward()
    rel = 1e-6 if dtype == torch.float32 else 2 ** -7
    assert got.dtype == torch.float32 and close(got.detach(), ref.detach(), rel) and close(x.grad, xr.grad, rel)


def test_blocked_ce_under_autocast_with_a_frozen_head():
    """The blocked CE's FrozenHead under bf16 autocast: autocast's loss and gradients (bf16 tolerance)."""
    batch = make_batch(t=13, seed=4)
    out = []
    for logits in (10**9, 3 * VD):
        d = make_draft(seed=3)
        d.lm_head.weight.requires_grad_(False)
        d.max_logit_elements = logits
        out.append(run(d, batch, autocast=True))
    (ref, ref_g), (got, got_g) = out
    assert abs(float(got.loss.detach() / ref.loss.detach()) - 1) < 1e-3
    assert got_g.keys() == ref_g.keys() and "lm_head.weight" not in got_g
    for name in ref_g:
        assert close(got_g[name], ref_g[name], 2e-2), name


def test_bf16_aux_states_are_read_by_fc_as_they_are_under_autocast():
    """bf16 features: fc reads them directly under autocast instead of after an exact fp32 round trip."""
    aux, *rest = make_batch(t=8, seed=7)
    aux = aux.to(torch.bfloat16)
    outs = []
    for a in (aux, aux.float()):
        d = make_draft(seed=1)
        outs.append(run(d, (a, *rest), autocast=True))
    (got, got_g), (ref, ref_g) = outs
    assert torch.equal(got.loss, ref.loss)
    for name in ref_g:
        assert torch.equal(got_g[name], ref_g[name]), name
