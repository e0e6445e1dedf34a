"""The Qwen3-shaped EAGLE layer (draft.qk_norm): each head's q and k pass an RMSNorm over head_dim before RoPE,
as Qwen3's attention does; module math against a hand formula (training step 0 against the inference path:
test_eagle3_norms.py), and the config.json vLLM 0.32 reads (Eagle3Qwen3ForCausalLM, model_type qwen3) both ways, for both EAGLE
families and in the speculators format."""

from dataclasses import fields

import torch
from transformers import Qwen3Config

from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.export import load_exported
from draftsmith.drafts.eagle_config import EagleConfig
from draftsmith.serve.vllm import speculators_config, vllm_config
from test_eagle3_norms import ALL, aux_batch, make_draft, rms


@torch.no_grad()
def test_qk_norm_normalises_each_head_before_rope():
    d = make_draft(qk_norm=True)
    at, lay = d.model.layers[0].self_attn, d.model.layers[0]
    aux, ids = aux_batch()
    x = lay.fuse(d.model.embed_tokens(ids), d.combine(aux))  # (B, T, 2H)
    b, t, _ = x.shape
    cos, sin = d.rotary(torch.arange(t).expand(b, t))

    def rot(v):  # (B, heads, T, d), rotate_half
        v1, v2 = v.chunk(2, -1)
        return v * cos[:, None] + torch.cat([-v2, v1], -1) * sin[:, None]

    q, k, v = at.project(x, cos, sin)
    want_q = rot(rms(at.q_proj(x).view(b, t, 2, 16), at.q_norm.weight).transpose(1, 2))  # norm over each head's 16
    want_k = rot(rms(at.k_proj(x).view(b, t, 1, 16), at.k_norm.weight).transpose(1, 2))
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)
    # a rotated, normalised head keeps norm |w| scale: RoPE is a rotation, so ||q_h|| = ||q_norm(q_h)||
    assert torch.allclose(q.norm(dim=-1), rms(at.q_proj(x).view(b, t, 2, 16), at.q_norm.weight).transpose(1, 2).norm(dim=-1),
                          atol=1e-4)
    plain = make_draft()  # same seed and projections, no q/k norms
    assert not hasattr(plain.model.layers[0].self_attn, "q_norm")
    assert (plain.model.layers[0].self_attn.project(x, cos, sin)[0] - q).abs().max() > 1e-3
    assert at.q_norm.eps == at.k_norm.eps == d.cfg.rms_norm_eps  # Qwen3's q/k norms take the model's eps


def test_export_is_vllms_qwen3_eagle_layer_and_round_trips():
    d = make_draft(qk_norm=True, **ALL)
    exported = d.export_config([1, 3, 5])
    assert exported["architectures"] == ["Eagle3Qwen3ForCausalLM"] and exported["model_type"] == "qwen3"
    assert Eagle3Config.from_export(exported) == d.cfg and d.cfg.qk_norm
    state = d.state_dict()
    # under the names vLLM's Qwen3Attention gives them (q_norm / k_norm, per head_dim)
    assert tuple(state["model.layers.0.self_attn.q_norm.weight"].shape) == (16,)
    assert tuple(state["model.layers.0.self_attn.k_norm.weight"].shape) == (16,)
    loaded = load_exported(exported, dict(state))
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    hf = Qwen3Config(**exported)  # what vLLM builds Qwen3DecoderLayer from
    assert (hf.head_dim, hf.num_key_value_heads, hf.rms_norm_eps) == (16, 1, d.cfg.rms_norm_eps)
    # what serve vllm writes: vLLM's class with the q/k norms (its Llama class has none)
    served = vllm_config(exported)
    assert served["architectures"] == ["Eagle3Qwen3ForCausalLM"] and served["model_type"] == "qwen3"
    # the speculators format: the layer config says qwen3, which vLLM maps to Eagle3Qwen3ForCausalLM
    spec = speculators_config(exported, target="/m/target", k=3)
    assert spec["transformer_layer_config"]["model_type"] == "qwen3" and spec["speculators_model_type"] == "eagle3"
    # the Llama shape exports exactly as before
    plain = make_draft().export_config([1, 3, 5])
    assert plain["architectures"] == ["LlamaEagle3DraftModel"] and plain["model_type"] == "llama"
    assert vllm_config(plain)["architectures"] == ["LlamaForCausalLMEagle3"]
    assert Eagle3Config.from_export(plain).qk_norm is False


def test_sglang_is_refused_by_name_for_the_qwen3_shape():
    import pytest

    from draftsmith.serve.resolve import ServeError
    from draftsmith.serve.sglang import sglang_config

    exported = make_draft(qk_norm=True).export_config([1, 3, 5])
    with pytest.raises(ServeError, match=r"model_type 'qwen3': a Qwen3-shaped draft \(draft.qk_norm.*serve vllm"):
        sglang_config(exported)
    assert sglang_config(make_draft().export_config([1, 3, 5]))["architectures"] == ["LlamaForCausalLMEagle3"]


def test_third_party_qwen3_eagle_configs_read_as_the_qwen3_shape():
    d = make_draft(qk_norm=True)
    exported = d.export_config([1, 3, 5])
    by_arch = {k: v for k, v in exported.items() if k not in ("model_type", "draftsmith")}
    assert Eagle3Config.from_export(by_arch).qk_norm is True  # the architecture alone says so
    by_type = {**by_arch, "architectures": ["SomeEagle3Draft"], "model_type": "qwen3"}
    assert Eagle3Config.from_export(by_type).qk_norm is True


def test_peagle_takes_the_qwen3_shape_on_every_layer():
    from draftsmith.drafts.peagle.config import PEagleConfig
    from draftsmith.drafts.peagle.model import PEagleDraft

    base = make_draft(qk_norm=True).cfg
    cfg = PEagleConfig(**{f.name: getattr(base, f.name) for f in fields(EagleConfig)}, mask_token_id=5, num_depths=3,
                       num_draft_layers=2)
    d = PEagleDraft(cfg)
    names = set(d.state_dict())
    assert {f"model.layers.{i}.self_attn.{n}_norm.weight" for i in (0, 1) for n in "qk"} <= names
    exported = d.export_config([1, 3, 5])
    assert exported["model_type"] == "qwen3" and PEagleConfig.from_export(exported).qk_norm is True
    # vLLM registers PeagleQwen3ForCausalLM as the same class; parallel drafting comes from the spec config
    assert vllm_config(exported)["architectures"] == ["Eagle3Qwen3ForCausalLM"]
