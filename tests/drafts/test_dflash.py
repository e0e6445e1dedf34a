"""DFlash family drafts: anchors by hand, block mask vs a loop predicate, the block forward vs one
block at a time, decay weights and loss by hand, JetSpec teacher alignment, Domino lambda, export.
Chunked losses and activation checkpointing: tests/drafts/test_chunked.py."""

import math
import types

import pytest
import torch
import torch.nn.functional as F

from draftsmith.drafts.dflash import api as dflash
from draftsmith.drafts.dflash import domino, jetspec
from draftsmith.drafts.dflash.config import DFlashConfig
from draftsmith.drafts.dflash.model import (DFlashDraft, NoValidAnchors, block_inputs, block_metrics, decay_weights,
                                           sample_anchors, visibility)
from draftsmith.targets.contract import rebuild_logits

V, H, L, MASK = 50, 32, 6, 7


def make_cfg(**kw):
    base = dict(hidden_size=H, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
                vocab_size=V, num_target_layers=L, target_layer_ids=[1, 3], mask_token_id=MASK, num_hidden_layers=2,
                block_size=4, num_anchors=4)
    base.update(kw)
    return DFlashConfig(**base)


DOMINO = {"projector_type": "domino", "emb_dim": 16, "gru_hidden_dim": 8, "pure_draft_prefix_len": 0,
          "shift_label": True, "lambda_start": 1.0, "lambda_decay_ratio": 0.5}


def make_draft(cls=DFlashDraft, seed=0, **kw):
    torch.manual_seed(seed)
    m = cls(make_cfg(**kw))
    g = torch.Generator().manual_seed(seed + 100)
    m.attach_target(torch.randn(V, H, generator=g), torch.randn(V, H, generator=g))
    for p in m.parameters():  # non-trivial norms so a wrong order of ops shows
        if p.dim() == 1:
            p.data.uniform_(0.5, 1.5, generator=g)
    if isinstance(m, jetspec.JetSpecDraft):  # the target's final norm: the KD teacher's head
        m.attach_teacher(torch.empty(H).uniform_(0.5, 1.5, generator=g), 1e-5)
    return m


def make_sup(b=2, s=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(b, s, dtype=torch.long)
    mask[0, 3:14] = 1
    mask[1, 6:9] = 1  # a short answer: few valid anchors, padding blocks
    return types.SimpleNamespace(aux_hidden=torch.randn(b, s, 2, H, generator=g), loss_mask=mask,
                                 input_ids=torch.randint(0, V, (b, s), generator=g),
                                 last_hidden=torch.randn(b, s, H, generator=g) * 3)  # JetSpec's (dflash_kd)


# ---- anchors -------------------------------------------------------------------------------------


def test_anchors_hand_example_with_padding_block():
    # S 8, bs 4: valid = loss_mask & a <= 4. Row 0: {1, 2, 3}; row 1: only 4 (5..7 are past S - bs).
    # N = min(8, 3) = 3, every valid anchor is taken; row 1 pads with two keep=False blocks at 0.
    mask = torch.tensor([[0, 1, 1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1, 1, 1]])
    anchor, keep = sample_anchors(mask, 4, 8, torch.Generator().manual_seed(0))
    assert anchor.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert keep.tolist() == [[True, True, True], [True, False, False]]


def test_anchors_random_subset_is_the_smallest_keys_sorted():
    mask = torch.ones(1, 12, dtype=torch.long)
    mask[0, :2] = 0  # valid: 2..8 (a <= 12 - 4)
    anchor, keep = sample_anchors(mask, 4, 3, torch.Generator().manual_seed(5))
    keys = torch.rand(1, 12, generator=torch.Generator().manual_seed(5))[0]
    valid = [a for a in range(2, 9)]
    expect = sorted(sorted(valid, key=lambda a: float(keys[a]))[:3])
    assert anchor.tolist() == [expect] and keep.all()


def test_no_valid_anchor_raises_and_the_draft_skips_with_a_zero_loss():
    mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]])  # answers only in the last bs - 1 tokens
    with pytest.raises(NoValidAnchors):
        sample_anchors(mask, 4, 8)
    m = make_draft()
    sup = make_sup()
    sup.loss_mask = torch.zeros_like(sup.loss_mask)
    out = m(sup)
    out.loss.backward()
    assert float(out.loss.detach()) == 0.0 and int(out.sums["valid_blocks"]) == 0
    assert all(float(p.grad.abs().sum()) == 0.0 for p in m.parameters())


def test_block_inputs_by_hand():
    ids = torch.arange(10, 20)[None]  # token at t is 10 + t
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 1, 1, 0, 0]])
    anchor, keep = torch.tensor([[2, 0]]), torch.tensor([[True, False]])
    noise, pos, labels, lmask = block_inputs(ids, mask, anchor, keep, 4, MASK)
    assert noise.tolist() == [[[12, MASK, MASK, MASK], [MASK] * 4]]
    assert pos.tolist() == [[[2, 3, 4, 5], [0, 1, 2, 3]]]
    assert labels[0, 0].tolist() == [12, 13, 14, 15]
    assert lmask.tolist() == [[[False, True, True, False], [False] * 4]]  # 5 is not an answer token
    # Domino's shift: slot k predicts anchor + k + 1, slot 0 included
    _, _, labels, lmask = block_inputs(ids, mask, anchor, keep, 4, MASK, label_offset=1)
    assert labels[0, 0].tolist() == [13, 14, 15, 16] and lmask[0, 0].tolist() == [True, True, False, True]


# ---- mask ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
def test_visibility_matches_a_loop_predicate(causal):
    anchor, s, bs = torch.tensor([[2, 5, 0], [7, 1, 3]]), 9, 3
    vis = visibility(anchor, s, bs, causal)
    for b in range(2):
        for q in range(3 * bs):
            j, i = divmod(q, bs)
            for kv in range(s + 3 * bs):
                if kv < s:
                    want = kv < int(anchor[b, j])
                else:
                    j2, i2 = divmod(kv - s, bs)
                    want = j2 == j and (not causal or i2 <= i)
                assert bool(vis[b, q, kv]) == want, (b, q, kv)


def test_bool_mask_gives_the_old_additive_mask_output_bitwise():
    # training passes the bool visibility straight to SDPA (one byte tensor shared by every layer);
    # the old additive fp32 mask (0 / -inf) gave the same states, forward and backward
    m = make_draft(DFlashDraft, causal=True)
    sup = make_sup()
    anchor, keep = sample_anchors(sup.loss_mask, 4, 4, torch.Generator().manual_seed(3))
    noise, pos, _, _ = block_inputs(sup.input_ids, sup.loss_mask, anchor, keep, 4, MASK)
    vis = visibility(anchor, 16, 4, True)[:, None]
    add = torch.zeros(vis.shape).masked_fill(~vis, float("-inf"))
    outs = []
    for mask in (vis, add):
        m.zero_grad()
        kvs = m.context_kv(m.context(sup.aux_hidden), torch.arange(16).expand(2, 16))
        h = m.run_blocks(noise.flatten(1), pos.flatten(1), kvs, mask)
        h.square().sum().backward()
        outs.append((h.detach(), [p.grad.clone() for p in m.parameters()]))
    assert torch.equal(outs[0][0], outs[1][0])
    assert all(torch.equal(a, b) for a, b in zip(outs[0][1], outs[1][1]))


# ---- forward -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls,causal", [(DFlashDraft, False), (jetspec.JetSpecDraft, True)])
def test_block_forward_equals_one_block_at_a_time(cls, causal):
    m = make_draft(cls, causal=causal).eval()
    sup = make_sup()
    with torch.no_grad():
        h, labels, lmask, anchor = m.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask,
                                            torch.Generator().manual_seed(3))
        _, keep = sample_anchors(sup.loss_mask, 4, 4, torch.Generator().manual_seed(3))
        ctx = m.context(sup.aux_hidden)
        for b in range(2):
            for j in range(anchor.shape[1]):
                if not keep[b, j]:
                    continue
                a = int(anchor[b, j])
                kvs = m.context_kv(ctx[b : b + 1, :a], torch.arange(a)[None])  # only positions < a
                ids = torch.tensor([[int(sup.input_ids[b, a])] + [MASK] * 3])
                vis = torch.ones(4, 4, dtype=torch.bool)
                vis = vis.tril() if causal else vis
                mask = torch.cat([torch.ones(4, a, dtype=torch.bool), vis], 1)
                add = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))[None, None]
                ref = m.run_blocks(ids, torch.arange(a, a + 4)[None], kvs, add)[0]
                torch.testing.assert_close(h[b, j], ref, atol=1e-5, rtol=1e-5)
                # inference drafts the same rows 1..3 (its mask: none, or the causal index rule)
                logits = m.propose(kvs, int(sup.input_ids[b, a]), a, 3)
                torch.testing.assert_close(logits, m.logits(ref[1:]).float(), atol=1e-4, rtol=1e-5)


def test_propose_with_fewer_tokens_is_a_shorter_block():
    m = make_draft(jetspec.JetSpecDraft, causal=True).eval()
    ctx = m.context(make_sup().aux_hidden[:1, :6])
    kvs = m.context_kv(ctx, torch.arange(6)[None])
    full, short = m.propose(kvs, 3, 6, 3), m.propose(kvs, 3, 6, 2)
    torch.testing.assert_close(short, full[:2], atol=1e-5, rtol=1e-5)  # causal: later MASK slots are unseen


# ---- loss ----------------------------------------------------------------------------------------


def test_decay_weights_by_hand():
    assert decay_weights(4, 2.0).tolist() == pytest.approx([0.0, 1.0, math.exp(-0.5), math.exp(-1.0)])
    assert decay_weights(3, None).tolist() == [0.0, 1.0, 1.0]
    assert decay_weights(3, 1.0, first=0).tolist() == pytest.approx([1.0, math.exp(-1), math.exp(-2)])


def test_dflash_loss_is_the_decay_weighted_ce_by_hand():
    m = make_draft(loss_decay_gamma=2.0)
    sup = make_sup()
    torch.manual_seed(11)
    out = m(sup)
    torch.manual_seed(11)
    h, labels, lmask, anchor = m.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask)
    num = den = 0.0
    for b, j, k in lmask.nonzero().tolist():
        logp = torch.log_softmax(h[b, j, k] @ m.lm_head.T, -1)
        w = math.exp(-(k - 1) / 2.0)
        num += w * -float(logp[labels[b, j, k]].detach())
        den += w
    assert float(out.loss.detach()) == pytest.approx(num / (den + 1e-6), rel=1e-5)


def test_block_metrics_by_hand():
    # one row, 3 blocks of bs 4 (position 0 never counts):
    #  block 0: correct [_, 1, 0, 1], all supervised       -> run 1, accept 2
    #  block 1: correct [_, 1, ., 1], position 2 unsupervised -> run 2 (skipped), accept 3
    #  block 2: nothing supervised                          -> not a valid block
    c = torch.tensor([[[0, 1, 0, 1], [0, 1, 0, 1], [0, 0, 0, 0]]], dtype=torch.bool)
    m = torch.tensor([[[0, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]]], dtype=torch.bool)
    s = block_metrics(c, m)
    assert s["pos_correct"].tolist() == [2, 0, 2] and s["pos_count"].tolist() == [2, 1, 2]
    assert s["pos_prefix"].tolist() == [2, 0, 1]
    assert int(s["accept_len_sum"]) == 5 and int(s["valid_blocks"]) == 2
    summary = dflash.summarize(s)
    assert summary["accept_len"] == 2.5
    # denominators are the supervised label positions: [2, 1, 2]; prefix rates 2/2, 0/1, 1/2;
    # conditional = rate_k / rate_{k-1}: 1, 0/1, and 0 where no chain reached k-1 (rate_1 = 0)
    assert summary["step_accuracy"] == pytest.approx([1.0, 0.0, 1.0])
    assert summary["prefix_rate"] == pytest.approx([1.0, 0.0, 0.5])
    assert summary["conditional_acceptance"] == pytest.approx([1.0, 0.0, 0.0])
    assert dflash.scalars(summary)["cond1"] == 1.0 and dflash.scalars(summary)["acc3"] == 1.0
    assert "conditional [1.000 0.000 0.000]" in dflash.describe(summary)


def test_jetspec_teacher_is_the_target_at_anchor_plus_k_minus_1():
    assert jetspec.teacher_positions(torch.tensor([[5, 1]]), 4).tolist() == [[[4, 5, 6, 7], [0, 1, 2, 3]]]
    m = make_draft(jetspec.JetSpecDraft, causal=True, extra={"kd_temperature": 2.0})
    sup = make_sup()
    torch.manual_seed(4)
    out = m(sup)
    torch.manual_seed(4)
    h, _, lmask, anchor = m.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask)
    # the target's logits as the engines rebuild them from id L (targets/contract.py)
    logits = rebuild_logits(sup.last_hidden, m.teacher_norm, m.lm_head, m.teacher_eps)  # (B, S, V)
    kls = []
    for b, j, k in lmask.nonzero().tolist():
        t = torch.softmax(logits[b, int(anchor[b, j]) + k - 1] / 2.0, -1)  # the target's next-token dist
        s = torch.log_softmax((h[b, j, k] @ m.lm_head.T) / 2.0, -1)
        kls.append(float((t * (t.log() - s)).sum()) * 4.0)
    assert float(out.loss) == pytest.approx(sum(kls) / len(kls), rel=1e-5)


# ---- Domino --------------------------------------------------------------------------------------


def test_domino_lambda_schedule():
    assert domino.lambda_at(0, 100, 1.0, 0.5) == 1.0
    assert domino.lambda_at(25, 100, 1.0, 0.5) == 0.5
    assert domino.lambda_at(50, 100, 1.0, 0.5) == 0.0 and domino.lambda_at(90, 100, 1.0, 0.5) == 0.0
    assert domino.lambda_at(10, 100, 0.8, 0.5) == pytest.approx(0.64)
    assert domino.lambda_at(1, 1, 1.0, 0.5) == 0.0  # int(0.5) = 0 -> span 1


def test_domino_starts_as_dflash_and_walks_its_gru_greedily():
    m = make_draft(domino.DominoDraft, extra=dict(DOMINO)).eval()
    kvs = m.context_kv(m.context(make_sup().aux_hidden[:1, :6]), torch.arange(6)[None])
    logits = m.propose(kvs, 3, 6, 4)  # shift_label: 4 slots draft 4 tokens
    h = m.run_blocks(torch.tensor([[3] + [MASK] * 3]), torch.arange(6, 10)[None], kvs, torch.zeros(1, 1, 4, 10))
    base = m.logits(h)
    torch.testing.assert_close(logits, base[0].float())  # embed_proj's last layer starts at 0
    torch.nn.init.normal_(m.embed_proj[2].weight)
    logits = m.propose(kvs, 3, 6, 4)
    toks, state, tok = [], None, torch.tensor([[3]])
    for r in range(4):  # reference walk
        g, state = m.prefix_gru(m.embed(tok), state)
        fix = m.embed_proj(torch.cat([h[0, r : r + 1], g[0]], -1))
        row = base[0, r] + fix[0]
        torch.testing.assert_close(logits[r], row.float(), atol=1e-4, rtol=1e-5)
        tok = row.argmax()[None, None]


def test_domino_loss_mixes_final_and_base_by_lambda():
    m = make_draft(domino.DominoDraft, extra=dict(DOMINO))
    torch.nn.init.normal_(m.embed_proj[2].weight)
    sup = make_sup()
    losses = {}
    for step in (0, 5, 10):
        m.set_progress(step, 20)  # lambda 1, 0.5, 0
        torch.manual_seed(9)
        losses[step] = float(m(sup).loss)
    assert losses[5] == pytest.approx(0.5 * losses[0] + 0.5 * losses[10], rel=1e-5)
    assert losses[0] != pytest.approx(losses[10])


# ---- config and export ---------------------------------------------------------------------------


@pytest.mark.parametrize("kw,match", [
    ({"block_size": 1}, "block_size=1 must be an int >= 2"),
    ({"mask_token_id": V}, f"mask_token_id={V} must be an int in 0..{V - 1}"),
    ({"target_layer_ids": [1, L]}, "target_layer_ids=\\[1, 6\\] must be distinct decoder-layer outputs in 0..5"),
])
def test_bad_config_values_are_one_line_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        make_cfg(**kw)


def test_export_keys_and_config_key_for_key():
    m = make_draft(num_hidden_layers=1)
    layer = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
             "mlp.up_proj.weight", "mlp.down_proj.weight"] + [f"self_attn.{p}.weight" for p in
                                                             ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")]
    assert sorted(m.state_dict()) == sorted(["fc.weight", "hidden_norm.weight", "norm.weight"]
                                            + [f"layers.0.{n}" for n in layer])
    assert m.state_dict()["fc.weight"].shape == (H, 2 * H)
    assert m.export_config([2, 4]) == {
        "architectures": ["Qwen3DFlashDraftModel"], "model_type": "qwen3", "hidden_size": H,
        "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "num_hidden_layers": 1, "num_target_layers": L, "vocab_size": V, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 2048, "hidden_act": "silu",
        "attention_bias": False, "tie_word_embeddings": False, "layer_types": ["full_attention"],
        "use_sliding_window": False, "max_window_layers": 1, "is_causal": False, "block_size": 4,
        "dflash_config": {"block_size": 4, "mask_token_id": MASK, "target_layer_ids": [1, 3]},
        "torch_dtype": "float32", "draftsmith": {"draft_type": "dflash", "num_anchors": 4, "loss_decay_gamma": 7.0},
    }
    assert dflash.layer_ids_from_export(m.export_config([2, 4])) == [2, 4]  # engine ids = on-disk + 1


@pytest.mark.parametrize("module,extra,causal", [(dflash, {}, False), (jetspec, {"kd_temperature": 2.0}, True),
                                                 (domino, DOMINO, False)])
def test_export_round_trip(module, extra, causal):
    m = make_draft(module.Model, causal=causal, extra=dict(extra))
    config = m.export_config([2, 4])
    assert config["is_causal"] is causal and config["dflash_config"].get("causal", False) is causal
    back = module.load_exported(config, m.state_dict(), m.embed_tokens, m.lm_head)
    assert type(back) is module.Model and back.export_config([2, 4]) == config
    from draftsmith.drafts import family_of_config
    assert family_of_config(config) == module.Model.__name__.replace("Draft", "").lower()


def test_a_dflash_checkpoint_does_not_load_as_eagle3():
    from draftsmith.drafts.eagle3 import api as eagle3

    config = make_draft().export_config([2, 4])
    with pytest.raises(ValueError) as err:
        eagle3.load_exported(config, make_draft().state_dict())
    assert "\n" not in str(err.value)
