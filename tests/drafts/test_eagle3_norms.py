"""The speculators norms on EAGLE-3 (norm_before_fc, norm_before_residual) and a frozen lm_head: module
math against hand formulas, the TTT step against the inference path, and the keys vLLM 0.32 reads."""

import math

import pytest
import torch
from transformers import LlamaConfig

from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.drafts.eagle3.export import load_exported
from draftsmith.drafts.eagle3.infer import extend
from draftsmith.drafts.layers import DraftKVCache
from draftsmith.serve.export import vllm_key

V, VD, H, HT, N = 50, 20, 32, 24, 3
ALL = {"norm_before_fc": True, "norm_before_residual": True, "fc_norm": True, "norm_output": True}


def make_draft(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=H, target_hidden_size=HT, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       intermediate_size=48, vocab_size=V, draft_vocab_size=VD, num_aux=N, ttt_steps=3, **kw)
    d = Eagle3Draft(cfg)
    with torch.no_grad():  # norms away from 1, so a norm applied in the wrong place shows
        for name, p in d.named_parameters():
            if p.dim() == 1:
                p.copy_(torch.rand(p.shape) + 0.5)
    return d


def rms(x, w, eps=1e-6):
    """RMSNorm over the last dim, by hand: w * x / sqrt(mean(x^2) + eps)."""
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def aux_batch(b=2, t=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, N, HT, generator=g) * 3, torch.randint(0, V, (b, t), generator=g)


def test_norm_before_fc_is_one_norm_over_all_aux_states_before_fc_norm():
    d = make_draft(norm_before_fc=True, fc_norm=True)
    aux, _ = aux_batch()
    m = d.model
    a = rms(aux.flatten(-2), m.input_norm.weight)  # (B, T, n*Ht): ONE norm across the n states
    chunks = [rms(a[..., i * HT:(i + 1) * HT], m.fc_norm[i].weight) for i in range(N)]  # then fc_norm per state
    want = torch.cat(chunks, -1) @ m.fc.weight.T
    torch.testing.assert_close(d.combine(aux), want, atol=1e-5, rtol=1e-5)
    plain = make_draft(fc_norm=True)  # same seed, same fc and fc_norm, no input_norm
    assert not hasattr(plain.model, "input_norm")
    assert (plain.combine(aux) - d.combine(aux)).abs().max() > 1e-3


@torch.no_grad()
def test_norm_before_residual_step0_matches_a_hand_computed_layer():
    d = make_draft(norm_before_residual=True)
    aux, ids = aux_batch()
    lay, at, cfg = d.model.layers[0], d.model.layers[0].self_attn, d.cfg
    step0 = next(d.iter_steps(aux, ids))
    h = d.combine(aux)  # (B, T, H)
    x = torch.cat([rms(d.model.embed_tokens(ids), lay.input_layernorm.weight), rms(h, lay.hidden_norm.weight)], -1)
    b, t, _ = x.shape
    cos, sin = d.rotary(torch.arange(t).expand(b, t))

    def rot(v):  # (B, heads, T, d) rotate_half convention
        v1, v2 = v.chunk(2, -1)
        return v * cos[:, None] + torch.cat([-v2, v1], -1) * sin[:, None]

    q = rot(at.q_proj(x).view(b, t, 2, 16).transpose(1, 2))
    k = rot(at.k_proj(x).view(b, t, 1, 16).transpose(1, 2)).expand(b, 2, t, 16)
    v = at.v_proj(x).view(b, t, 1, 16).transpose(1, 2).expand(b, 2, t, 16)
    s = (q @ k.transpose(-1, -2)) / math.sqrt(16)
    s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    o = at.o_proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1))
    r = rms(h, lay.hidden_norm.weight) + o  # the residual is hidden_norm(h), not h
    y = rms(r, lay.post_attention_layernorm.weight)
    want = r + lay.mlp.down_proj(torch.nn.functional.silu(lay.mlp.gate_proj(y)) * lay.mlp.up_proj(y))
    torch.testing.assert_close(step0.hidden, want, atol=1e-5, rtol=1e-5)
    off = next(make_draft().iter_steps(aux, ids))  # same weights, residual h
    assert (off.hidden - step0.hidden).abs().max() > 1e-3


@torch.no_grad()
@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])  # the Qwen3 shape: q/k norms per head
def test_training_step0_equals_the_inference_path_with_all_four_norms(qk_norm):
    d = make_draft(**ALL, qk_norm=qk_norm)
    aux, ids = aux_batch(b=1)
    step0 = next(d.iter_steps(aux, ids))
    served = extend(d, DraftKVCache(), d.combine(aux), ids, torch.arange(ids.shape[1])[None])
    torch.testing.assert_close(served.hidden, step0.hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(served.logits, step0.logits, atol=1e-4, rtol=1e-4)


def test_export_names_what_vllm_reads_and_round_trips():
    d = make_draft(**ALL)
    exported = d.export_config([1, 3, 5])
    assert exported["norm_before_residual"] is True and exported["eagle_config"]["norm_before_fc"] is True
    assert Eagle3Config.from_export(exported) == d.cfg
    hf = LlamaConfig(**exported)  # vLLM reads norm_before_residual off the HF config object
    assert getattr(hf, "norm_before_residual") is True and hf.eagle_config["norm_before_fc"] is True
    assert (hf.fc_norm, hf.norm_output) == (True, True)
    state = d.state_dict()
    assert tuple(state["model.input_norm.weight"].shape) == (N * HT,)
    assert vllm_key("model.input_norm.weight") == "input_norm.weight"  # vLLM adds `model.` back
    # norm_before_fc also at the top level (speculators' configs): read as vLLM does
    top = {**exported, "eagle_config": {k: v for k, v in exported["eagle_config"].items() if k != "norm_before_fc"},
           "norm_before_fc": True}
    assert Eagle3Config.from_export(top).norm_before_fc is True
    # a plain EAGLE-3 export is unchanged: no new keys
    plain = make_draft().export_config([1, 3, 5])
    assert "norm_before_residual" not in plain and "norm_before_fc" not in plain["eagle_config"]
    loaded = load_exported(exported, {k: v for k, v in state.items()})
    for k, v in state.items():
        assert torch.equal(loaded.state_dict()[k], v), k


def test_freeze_lm_head_keeps_the_target_rows_and_skips_their_gradient():
    from types import SimpleNamespace

    from draftsmith.drafts.eagle3 import api as eagle3

    d = make_draft()
    g = torch.Generator().manual_seed(3)
    target_head, final_norm = torch.randn(V, H, generator=g), torch.rand(H, generator=g) + 0.5
    ids = torch.arange(VD) * 2  # draft ids -> target ids 0, 2, 4, ...
    vocab = SimpleNamespace(draft_ids=ids, d2t=ids - torch.arange(VD), t2d=torch.zeros(V, dtype=torch.bool).index_fill_(0, ids, True))
    draft_cfg = SimpleNamespace(freeze_embeddings=None, init_from_target=True, freeze_lm_head=True, init_layer_from_target=None)
    eagle3.attach_target(d, draft_cfg, embeddings=torch.randn(V, H, generator=g),
                         head=lambda: (target_head, final_norm), vocab=vocab)
    assert not d.lm_head.weight.requires_grad and torch.equal(d.lm_head.weight, target_head[ids])
    aux, tok = aux_batch()
    probs = torch.softmax(torch.randn(2, 6, VD, generator=g), -1)
    d(aux, tok, probs, torch.ones(2, 6)).loss.backward()
    assert d.lm_head.weight.grad is None and d.model.fc.weight.grad is not None


def test_peagle_carries_the_norms_into_its_export_and_mask_slots():
    from dataclasses import fields

    from draftsmith.drafts.eagle_config import EagleConfig
    from draftsmith.drafts.peagle.config import PEagleConfig
    from draftsmith.drafts.peagle.model import PEagleDraft

    torch.manual_seed(0)
    base = make_draft(**ALL).cfg  # the shared EAGLE shape's fields (the TTT unroll is EAGLE-3's own)
    cfg = PEagleConfig(**{f.name: getattr(base, f.name) for f in fields(EagleConfig)}, mask_token_id=5, num_depths=3,
                       num_draft_layers=2)
    d = PEagleDraft(cfg)
    exported = d.export_config([1, 3, 5])
    assert exported["norm_before_residual"] is True and exported["eagle_config"]["norm_before_fc"] is True
    back = PEagleConfig.from_export(exported)
    assert [getattr(back, k) for k in ALL] == [True] * 4
    # the mask slots' state passes input_norm / fc_norm / fc like a real aux state (vLLM's combine_hidden_states)
    m = d.model
    a = rms(d.mask_hidden.flatten(), m.input_norm.weight)
    want = torch.cat([rms(a[i * HT:(i + 1) * HT], m.fc_norm[i].weight) for i in range(N)]) @ m.fc.weight.T
    torch.testing.assert_close(d.combine(d.mask_hidden).flatten(), want, atol=1e-5, rtol=1e-5)
