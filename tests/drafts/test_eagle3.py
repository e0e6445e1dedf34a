"""EAGLE-3 draft: TTT attention vs a plain-loop reference, loss/metrics vs hand numbers, on-disk names."""

import math

import pytest
import torch
from transformers import LlamaConfig

from draftsmith.drafts.eagle3 import api as eagle3_family
from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.drafts.eagle_summary import simulated_tau

V, VD, H, HT = 50, 20, 32, 24


def make_cfg(**kw):
    base = dict(
        hidden_size=H, target_hidden_size=HT, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        intermediate_size=48, vocab_size=V, draft_vocab_size=VD, num_aux=3, ttt_steps=3,
    )
    base.update(kw)
    return Eagle3Config(**base)


def make_draft(seed=0, **kw):
    torch.manual_seed(seed)
    return Eagle3Draft(make_cfg(**kw))


def make_batch(b=2, t=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(b, t, 3, HT, generator=g) * 3
    ids = torch.randint(0, V, (b, t), generator=g)
    probs = torch.softmax(torch.randn(b, t, VD, generator=g) * 2, -1)
    mask = torch.ones(b, t)
    mask[1, 5:] = 0  # right padding
    mask[0, 2] = 0  # an unsupervised position in the middle
    return aux, ids, probs, mask


# ---- plain-loop reference ---------------------------------------------------------------------


def rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean() + eps)


def rotate(x, pos, inv_freq):
    """x (d,) at integer position pos, rotate_half convention, by hand."""
    half = x.shape[0] // 2
    ang = pos * inv_freq  # (d/2,)
    x1, x2 = x[:half], x[half:]
    return torch.cat([x1 * torch.cos(ang) - x2 * torch.sin(ang), x2 * torch.cos(ang) + x1 * torch.sin(ang)])


@torch.no_grad()
def reference_unroll(d, aux, ids, steps, offset=True):
    """Per (b, t) vectors and explicit key sets; returns [(h_pre (B,T,H), logits (B,T,Vd))] per step."""
    cfg, m = d.cfg, d.model
    lay, at = m.layers[0], m.layers[0].self_attn
    eps, nh, nkv, hd = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, hd, 2).double() / hd)
    B, T = ids.shape
    h = torch.zeros(B, T, cfg.hidden_size)
    for b in range(B):
        for t in range(T):
            parts = [aux[b, t, i] for i in range(cfg.num_aux)]
            if cfg.fc_norm:
                parts = [rms(p, m.fc_norm[i].weight, eps) for i, p in enumerate(parts)]
            h[b, t] = m.fc.weight @ torch.cat(parts)
    keys, vals, out = {}, {}, []  # keys[(step, b, t)] = (h_kv, d)
    for k in range(steps):
        q = {}
        for b in range(B):
            for t in range(T):
                tok = ids[b, t + k] if t + k < T else 0
                x = torch.cat([rms(m.embed_tokens.weight[tok], lay.input_layernorm.weight, eps),
                               rms(h[b, t], lay.hidden_norm.weight, eps)])
                pos = t + k if offset else t
                qh = (at.q_proj.weight @ x).view(nh, hd)
                kh = (at.k_proj.weight @ x).view(nkv, hd)
                q[b, t] = torch.stack([rotate(v, pos, inv_freq).float() for v in qh])
                keys[k, b, t] = torch.stack([rotate(v, pos, inv_freq).float() for v in kh])
                vals[k, b, t] = (at.v_proj.weight @ x).view(nkv, hd)
        h_pre, logits = torch.zeros_like(h), torch.zeros(B, T, cfg.draft_vocab_size)
        for b in range(B):
            for t in range(T):
                key_set = [(0, s) for s in range(t + 1)] + [(j, t) for j in range(1, k + 1)]
                heads = []
                for head in range(nh):
                    g = head // (nh // nkv)
                    scores = torch.stack([q[b, t][head] @ keys[j, b, s][g] for j, s in key_set]) / math.sqrt(hd)
                    p = torch.softmax(scores, 0)
                    heads.append(sum(p[i] * vals[j, b, s][g] for i, (j, s) in enumerate(key_set)))
                r = h[b, t] + at.o_proj.weight @ torch.cat(heads)
                y = rms(r, lay.post_attention_layernorm.weight, eps)
                gate, up = lay.mlp.gate_proj.weight @ y, lay.mlp.up_proj.weight @ y
                h_pre[b, t] = r + lay.mlp.down_proj.weight @ (gate * torch.sigmoid(gate) * up)
                logits[b, t] = d.lm_head.weight @ rms(h_pre[b, t], m.norm.weight, eps)
        out.append((h_pre, logits))
        if cfg.norm_output:
            h = torch.stack([torch.stack([rms(v, m.norm.weight, eps) for v in row]) for row in h_pre])
        else:
            h = h_pre
    return out


@pytest.mark.parametrize("variant", [{}, {"fc_norm": True, "norm_output": True}])
def test_ttt_attention_matches_plain_loop(variant):
    d = make_draft(**variant)
    aux, ids, _, _ = make_batch()
    got = list(d.iter_steps(aux, ids))
    ref = reference_unroll(d, aux, ids, d.cfg.ttt_steps)
    assert len(got) == 3
    for k, (step, (h_ref, logits_ref)) in enumerate(zip(got, ref)):
        torch.testing.assert_close(step.hidden, h_ref, atol=1e-5, rtol=1e-5, msg=f"hidden step {k}")
        torch.testing.assert_close(step.logits, logits_ref, atol=1e-5, rtol=1e-5, msg=f"logits step {k}")


def test_rope_step_offset_matters():
    d = make_draft()
    aux, ids, _, _ = make_batch()
    on = list(d.iter_steps(aux, ids))
    off = list(d.iter_steps(aux, ids, rope_step_offset=False))
    torch.testing.assert_close(on[0].logits, off[0].logits)  # step 0 has no offset either way
    for k in (1, 2):
        assert (on[k].logits - off[k].logits).abs().max() > 1e-3
    ref_off = reference_unroll(d, aux, ids, 2, offset=False)  # and the flag means exactly "rotate at t"
    torch.testing.assert_close(off[1].logits, ref_off[1][1], atol=1e-5, rtol=1e-5)


def test_step0_equals_single_step_run():
    d = make_draft()
    one = Eagle3Draft(make_cfg(ttt_steps=1))
    one.load_state_dict(d.state_dict())
    batch = make_batch()
    multi, single = d(*batch), one(*batch)
    torch.testing.assert_close(multi.step_losses[0], single.step_losses[0])
    torch.testing.assert_close(single.loss, single.step_losses[0])
    torch.testing.assert_close(next(d.iter_steps(*batch[:2])).logits, next(one.iter_steps(*batch[:2])).logits)


def test_loss_normalisation_and_step_weights_hand_numbers():
    d = make_draft(ttt_steps=2, step_weight=0.8)
    with torch.no_grad():
        d.lm_head.weight.zero_()  # logits 0 -> log_softmax = -log(VD) everywhere
    aux = torch.randn(1, 4, 3, HT)
    ids = torch.tensor([[1, 2, 3, 4]])
    c = torch.tensor([1.0, 2.0, 3.0, 4.0])  # probs with mass c[t] make CE[t] = c[t] * log(VD)
    probs = c[None, :, None] * torch.full((1, 4, VD), 1.0 / VD)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    out = d(aux, ids, probs, mask)
    # step 0: supervised t = 0, 1, 3 -> (1 + 2 + 4) / 3; step 1: shifted mask [1, 0, 1, 0], c [2, 3, 4, 0] -> 6 / 2
    expected = torch.tensor([7 / 3, 3.0]) * math.log(VD)
    torch.testing.assert_close(out.step_losses, expected)
    torch.testing.assert_close(out.loss, (expected[0] + 0.8 * expected[1]) / 1.8)
    assert out.step_count.tolist() == [3, 2]


def test_loss_matches_manual_formula_on_random_logits():
    d = make_draft(ttt_steps=3, step_weight=0.5)
    aux, ids, probs, mask = make_batch()
    out = d(aux, ids, probs, mask)
    steps = list(d.iter_steps(aux, ids))
    T = ids.shape[1]
    manual = []
    for k, s in enumerate(steps):
        num, den = 0.0, 0.0
        for b in range(2):
            for t in range(T - k):
                if mask[b, t + k]:
                    num += -(probs[b, t + k] * torch.log_softmax(s.logits[b, t], -1)).sum()
                    den += 1
        manual.append(num / den)
    manual = torch.stack(manual)
    torch.testing.assert_close(out.step_losses, manual)
    torch.testing.assert_close(out.loss.detach(), (manual * torch.tensor([1, 0.5, 0.25])).sum() / 1.75)


def test_all_zero_mask_gives_zero_loss_without_nan():
    d = make_draft()
    aux, ids, probs, _ = make_batch()
    out = d(aux, ids, probs, torch.zeros(2, 8))
    assert out.loss.item() == 0.0 and torch.isfinite(out.step_losses).all()
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in d.parameters() if p.grad is not None)
    assert out.step_count.tolist() == [0, 0, 0] and out.simulated_tau == 1.0


def test_prefix_hits_and_simulated_tau_hand_case():
    d = make_draft(ttt_steps=3)
    T = 5
    y = torch.tensor([3, 1, 4, 1, 5, 9])  # y[s] = target label at slot s
    probs = torch.nn.functional.one_hot(y[:T], VD).float()[None]
    hits = [[1, 1, 0, 1, 1], [1, 0, 1, 1], [0, 1, 1]]  # step k, start t (t + k < T)
    calls = iter(range(3))

    def fake_logits(normed):  # forward applies the lm_head to supervised rows only: (N, H)
        k = next(calls)
        pred = torch.zeros(T, dtype=torch.long)
        for t, ok in enumerate(hits[k]):
            pred[t] = y[t + k] if ok else (y[t + k] + 1) % VD
        assert normed.shape[0] == T - k  # the mask shifted left by k keeps starts t < T - k
        return torch.nn.functional.one_hot(pred[: T - k], VD).float() * 10

    d.compute_logits = fake_logits
    out = d(torch.randn(1, T, 3, HT), torch.zeros(1, T, dtype=torch.long), probs, torch.ones(1, T))
    assert out.step_correct.tolist() == [4, 3, 2]
    assert out.step_count.tolist() == [5, 4, 3]
    assert out.prefix_correct.tolist() == [4, 2, 0]  # chains at t=0,1,3,4 | t=0,3 | none
    torch.testing.assert_close(out.step_accuracy, torch.tensor([4 / 5, 3 / 4, 2 / 3], dtype=torch.float64))
    assert out.simulated_tau == pytest.approx(1 + 4 / 5 + 2 / 4)
    # aggregated over two such batches: same rates
    assert simulated_tau(out.prefix_correct * 2, out.step_count * 2) == pytest.approx(2.3)


def test_draft_vocab_miss_counts_in_the_metric_denominator_not_in_the_loss():
    # T = 5, every slot in the loss mask, but slot 2's target argmax lies outside the draft vocab
    # (position_mask[2] = 0): no draft logit can name it, so it is a certain miss. The draft gets every
    # other target right.
    d = make_draft(ttt_steps=3)
    T = 5
    y = torch.tensor([3, 1, 4, 1, 5])  # y[s] = the in-vocab label at slot s (slot 2's is meaningless)
    probs = torch.nn.functional.one_hot(y, VD).float()[None]
    loss_mask = torch.ones(1, T)
    position_mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    rows = []  # per step: the start positions t the CE (lm_head) is applied to

    def fake_logits(normed):
        k = len(rows)
        starts = [t for t in range(T - k) if position_mask[0, t + k]]
        rows.append(starts)
        assert normed.shape[0] == len(starts)  # the loss still skips the out-of-vocab slot
        return torch.nn.functional.one_hot(y[[t + k for t in starts]], VD).float() * 10  # always right

    d.compute_logits = fake_logits
    aux, ids = torch.randn(1, T, 3, HT), torch.zeros(1, T, dtype=torch.long)
    out = d(aux, ids, probs, position_mask, loss_mask)
    assert rows == [[0, 1, 3, 4], [0, 2, 3], [1, 2]]  # slot 2 = start t + k: excluded from the CE
    # step k counts the loss-mask positions with a step-k target: 5, 4, 3 (slot 2 among them)
    assert out.step_count.tolist() == [5, 4, 3]
    assert out.step_correct.tolist() == [4, 3, 2]  # hits = the CE rows, all right
    # prefix: step 0 hits {0,1,3,4}; step 1 hits {0,2,3} -> chains {0,3}; step 2 hits {1,2} -> none
    assert out.prefix_correct.tolist() == [4, 2, 0]
    torch.testing.assert_close(out.step_accuracy, torch.tensor([4 / 5, 3 / 4, 2 / 3], dtype=torch.float64))
    assert out.simulated_tau == pytest.approx(1 + 4 / 5 + 2 / 4)  # was 1 + 4/4 + 2/3 over position_mask
    s = eagle3_family.summarize(out.sums)
    assert s["positions"] == 5 and s["prefix_rate"] == pytest.approx([0.8, 0.5, 0.0])
    assert s["conditional_acceptance"] == pytest.approx([0.8, 0.5 / 0.8, 0.0])
    # the loss is the same with and without the loss mask: only the metrics changed
    rows.clear()
    legacy = d(aux, ids, probs, position_mask)
    torch.testing.assert_close(out.step_losses, legacy.step_losses)
    torch.testing.assert_close(out.loss, legacy.loss)
    assert legacy.step_count.tolist() == [4, 3, 2]  # the old, biased denominator


def test_supervised_reads_the_loss_mask():
    from draftsmith.drafts.eagle_supervision import Eagle3Supervision

    d = make_draft(ttt_steps=2)
    aux, ids, probs, mask = make_batch()
    pos = mask.clone()
    pos[0, 4] = 0  # one loss position out of the draft vocab
    sup = Eagle3Supervision(aux_hidden=aux, input_ids=ids, loss_mask=mask, target_probs=probs, position_mask=pos.bool())
    out = d.supervised(sup)
    ref = d(aux, ids, probs, pos, mask)
    assert out.step_count.tolist() == ref.step_count.tolist() == [int(mask.sum()), int(mask[:, 1:].sum())]
    torch.testing.assert_close(out.loss, d(aux, ids, probs, pos).loss)


def test_vocab_map_and_lm_head_init():
    d = make_draft()
    g = torch.Generator().manual_seed(3)
    draft_ids = torch.randperm(V, generator=g)[:VD].sort().values
    d2t = draft_ids - torch.arange(VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    with pytest.raises(ValueError, match="d2t"):
        d.init_from_target(torch.randn(V, H), draft_ids)  # map not installed yet
    d.set_vocab_map(d2t, t2d)
    q = torch.tensor([[0, 5, 19], [7, 7, 1]])
    assert torch.equal(d.draft_to_target(q), draft_ids[q])
    sd = d.state_dict()
    assert sd["d2t"].dtype == torch.int64 and torch.equal(sd["d2t"], d2t)
    assert sd["t2d"].dtype == torch.bool and torch.equal(sd["t2d"], t2d)
    target_head = torch.randn(V, H)
    d.init_from_target(target_head, draft_ids)
    x = torch.randn(2, 3, H)
    torch.testing.assert_close(d.compute_logits(x), (x @ target_head.T)[..., draft_ids])
    # with the final norm too: draft norm + lm_head == the target's head on the draft rows, and
    # fc passes the deepest aux state through (H == Ht here)
    norm_w = torch.rand(H) + 0.5
    d.init_from_target(target_head, draft_ids, norm_w)
    assert torch.equal(d.model.norm.weight, norm_w)
    same = make_draft(target_hidden_size=H, draft_vocab_size=V)
    same.init_from_target(target_head, torch.arange(V))
    aux = torch.randn(1, 4, 3, H)
    torch.testing.assert_close(same.combine(aux), aux[..., -1, :])
    with pytest.raises(ValueError, match="d2t"):
        d.set_vocab_map(d2t[:-1], t2d)
    with pytest.raises(ValueError, match="outside 0..49"):
        d.set_vocab_map(d2t + V, t2d)
    unpruned = make_draft(draft_vocab_size=V)
    assert "d2t" not in unpruned.state_dict() and "t2d" not in unpruned.state_dict()
    assert torch.equal(unpruned.draft_to_target(q), q)


@pytest.mark.parametrize("flag", ["fc_norm", "norm_output"])
def test_31_variants_run_and_differ(flag):
    plain = make_draft()
    var = Eagle3Draft(make_cfg(**{flag: True}))
    missing, unexpected = var.load_state_dict(plain.state_dict(), strict=False)
    assert unexpected == [] and all("fc_norm" in k for k in missing)
    aux, ids, probs, mask = make_batch()
    a, b = list(plain.iter_steps(aux, ids)), list(var.iter_steps(aux, ids))
    if flag == "norm_output":  # same h_0, so step 0 agrees; the fed-back state differs from step 1
        torch.testing.assert_close(a[0].logits, b[0].logits)
    else:
        assert (a[0].logits - b[0].logits).abs().max() > 1e-3
    assert (a[1].logits - b[1].logits).abs().max() > 1e-3
    assert torch.isfinite(var(aux, ids, probs, mask).loss)


LAYER = [
    "model.layers.0.input_layernorm.weight", "model.layers.0.hidden_norm.weight",
    "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight",
]


def test_state_dict_names_and_shapes():
    plain = make_draft(draft_vocab_size=V).state_dict()
    assert set(plain) == {"model.embed_tokens.weight", "model.fc.weight", *LAYER, "model.norm.weight", "lm_head.weight"}
    v31 = make_draft(fc_norm=True, norm_output=True).state_dict()
    fc_norm = {f"model.fc_norm.{i}.weight" for i in range(3)}
    assert set(v31) == set(plain) | fc_norm | {"d2t", "t2d"}
    assert v31["model.embed_tokens.weight"].shape == (V, H)
    assert v31["model.fc.weight"].shape == (H, 3 * HT)
    assert v31["model.fc_norm.2.weight"].shape == (HT,)
    assert v31["model.layers.0.self_attn.q_proj.weight"].shape == (2 * 16, 2 * H)
    assert v31["model.layers.0.self_attn.k_proj.weight"].shape == (16, 2 * H)
    assert v31["lm_head.weight"].shape == (VD, H)
    assert v31["d2t"].shape == (VD,) and v31["t2d"].shape == (V,)


@pytest.mark.parametrize("freeze", [True, False])
def test_frozen_embeddings_get_no_gradient(freeze):
    d = make_draft()
    target_embed = torch.randn(V, H)
    d.load_target_embeddings(target_embed, freeze=freeze)
    assert torch.equal(d.model.embed_tokens.weight, target_embed)
    d(*make_batch()).loss.backward()
    assert (d.model.embed_tokens.weight.grad is None) == freeze
    assert d.model.fc.weight.grad is not None and d.lm_head.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="embed_tokens"):
        d.load_target_embeddings(torch.randn(V, H + 1))


def test_logits_fp32_under_bf16_autocast():
    d = make_draft()
    aux, ids, probs, mask = make_batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        steps = list(d.iter_steps(aux, ids))
        out = d(aux, ids, probs, mask)
    assert all(s.logits.dtype == torch.float32 for s in steps)
    assert out.loss.dtype == torch.float32 and torch.isfinite(out.loss)
    ref = list(d.iter_steps(aux, ids))
    assert (steps[0].logits - ref[0].logits).abs().max() < 0.5  # bf16 path tracks fp32


@pytest.mark.parametrize("rope_scaling", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_export_config_round_trip(rope_scaling):
    d = make_draft(fc_norm=True, norm_output=True, rope_scaling=rope_scaling, rope_theta=5e5, ttt_steps=5)
    exported = d.export_config([1, 4, 7], torch_dtype="bfloat16")
    assert exported["architectures"] == ["LlamaEagle3DraftModel"] and exported["num_hidden_layers"] == 1
    assert exported["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 4, 7], "use_aux_hidden_state": True}
    assert exported["draftsmith"] == {"draft_type": "eagle3", "ttt_steps": 5, "step_weight": 0.8}
    assert exported["tie_word_embeddings"] is False and exported["torch_dtype"] == "bfloat16"
    assert Eagle3Config.from_export(exported) == d.cfg
    # what vLLM reads through the HF config object
    hf_cfg = LlamaConfig(**exported)
    read = (hf_cfg.draft_vocab_size, hf_cfg.target_hidden_size, hf_cfg.fc_norm, hf_cfg.norm_output)
    assert read == (VD, HT, True, True)
    assert hf_cfg.rope_parameters["rope_theta"] == 5e5
    with pytest.raises(ValueError, match="num_aux=3"):
        d.export_config([1, 2])


# ---- bounded memory: attention and loss in blocks of rows ------------------------------------


@pytest.mark.parametrize("flags", [{}, dict(fc_norm=True, norm_output=True, norm_before_residual=True)])
def test_blocked_attention_and_loss_equal_one_block(flags):
    """Query blocks of the TTT attention and row blocks of the draft-vocab CE (both checkpointed) give
    the one-block loss, metrics and gradients; the budgets force 2-7 rows a block of a 13-row batch."""
    aux, ids, probs, mask = make_batch(t=13, seed=4)
    ref = make_draft(seed=3, **flags)
    out = ref(aux, ids, probs, mask)
    out.loss.backward()
    for scores, logits in ((2 * 2 * 13, 10**9), (10**9, 3 * VD), (7 * 2 * 2 * 13, VD)):
        d = make_draft(seed=3, **flags)
        d.max_score_elements, d.max_logit_elements = scores, logits
        got = d(aux, ids, probs, mask)
        got.loss.backward()
        assert abs(float(got.loss.detach() / out.loss.detach()) - 1) < 1e-6
        for name in ("step_correct", "prefix_correct", "step_count"):
            assert torch.equal(getattr(got, name), getattr(out, name))
        for (name, p), q in zip(d.named_parameters(), ref.parameters()):
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_attention_block_reads_only_the_keys_it_may_attend():
    from draftsmith.drafts.eagle3.model import ttt_attention

    g = torch.Generator().manual_seed(0)
    q, k0, v0, k1, v1 = (torch.randn(1, 2, 6, 4, generator=g) for _ in range(5))
    whole = ttt_attention(q, [k0, k1], [v0, v1], 0.5, torch.ones(6, 6, dtype=torch.bool).tril())
    # rows 2..3: step-0 keys 0..3 only; changing keys 4..5 cannot change them
    k0b = k0.clone()
    k0b[:, :, 4:] = 100.0
    part = ttt_attention(q[:, :, 2:4], [k0b, k1], [v0, v1], 0.5, None, 2)
    torch.testing.assert_close(part, whole[:, :, 2:4], rtol=1e-6, atol=1e-6)


def test_activation_checkpointing_changes_nothing_but_memory():
    """Each TTT step recomputed in backward: the same loss and gradients (keys kept per step)."""
    aux, ids, probs, mask = make_batch(t=11, seed=6)
    outs = []
    for ckpt in (False, True):
        d = make_draft(seed=5, fc_norm=True, norm_output=True)
        d.activation_checkpointing = ckpt
        d.max_score_elements = 2 * 2 * 11 * 3  # attention blocks nested inside the checkpointed steps
        out = d(aux, ids, probs, mask)
        out.loss.backward()
        outs.append((out, {n: p.grad.clone() for n, p in d.named_parameters() if p.grad is not None}))
    (a, ga), (b, gb) = outs
    torch.testing.assert_close(a.loss.detach(), b.loss.detach(), rtol=1e-6, atol=0)
    assert torch.equal(a.prefix_correct, b.prefix_correct) and ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], rtol=1e-5, atol=1e-6, msg=n)
