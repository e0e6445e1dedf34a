"""drafts/layers.py against HF Llama's reference implementations and hand formulas (every rope type against
transformers and vLLM: test_rope.py, test_rope_vllm.py)."""

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as hf

from draftsmith.drafts.layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary, conditional_rates, repeat_kv

HEAD_DIM = 16

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def _hf_rotary(theta, rope_scaling, max_pos=2048):
    cfg = LlamaConfig(
        hidden_size=2 * HEAD_DIM,
        num_attention_heads=2,
        head_dim=HEAD_DIM,
        rope_theta=theta,
        rope_scaling=rope_scaling,
        max_position_embeddings=max_pos,
    )
    return hf.LlamaRotaryEmbedding(cfg)


@pytest.mark.parametrize(
    "theta,rope_scaling",
    [
        (10000.0, None),
        (10000.0, {"rope_type": "default"}),
        (500000.0, LLAMA3),
        (10000.0, {"type": "linear", "factor": 4.0}),
    ],
)
def test_rotary_matches_hf(theta, rope_scaling):
    torch.manual_seed(0)
    ours = RotaryEmbedding(HEAD_DIM, theta=theta, rope_scaling=rope_scaling)
    ref = _hf_rotary(theta, rope_scaling)
    # linear divides the position (vLLM's table), transformers the frequency: one for a factor of 4
    torch.testing.assert_close(ours.inv_freq / ours.position_divisor, ref.inv_freq, rtol=0, atol=0)
    positions = torch.tensor([[0, 1, 2, 7, 100, 4000], [3, 3, 9, 50, 2047, 12]])
    q = torch.randn(2, 2, 6, HEAD_DIM)
    k = torch.randn(2, 1, 6, HEAD_DIM)
    cos, sin = ours(positions)
    assert cos.dtype == torch.float32 and cos.shape == (2, 6, HEAD_DIM)
    ref_cos, ref_sin = ref(q, positions)
    torch.testing.assert_close(cos, ref_cos, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sin, ref_sin, rtol=1e-6, atol=1e-6)
    ref_q, ref_k = hf.apply_rotary_pos_emb(q, k, ref_cos, ref_sin)
    torch.testing.assert_close(apply_rotary(q, cos, sin), ref_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(apply_rotary(k, cos, sin), ref_k, rtol=1e-5, atol=1e-5)


def test_llama3_rope_covers_all_bands():
    inv = RotaryEmbedding(HEAD_DIM, theta=500000.0, rope_scaling=LLAMA3).inv_freq
    plain = RotaryEmbedding(HEAD_DIM, theta=500000.0).inv_freq
    ratio = plain / inv
    assert torch.isclose(ratio, torch.tensor(1.0)).any()  # high frequencies kept
    assert torch.isclose(ratio, torch.tensor(8.0)).any()  # low frequencies divided by factor
    assert ((ratio > 1.001) & (ratio < 7.999)).any()  # smoothed band in between


def test_rotary_hand_values():
    # One pair (dims 0 and d/2) at position p rotates by angle p * theta^0 = p radians.
    rot = RotaryEmbedding(HEAD_DIM)
    x = torch.zeros(1, 1, 1, HEAD_DIM)
    x[..., 0] = 1.0
    cos, sin = rot(torch.tensor([[3]]))
    y = apply_rotary(x, cos, sin)
    assert y[0, 0, 0, 0].item() == pytest.approx(math.cos(3.0), abs=1e-6)
    assert y[0, 0, 0, HEAD_DIM // 2].item() == pytest.approx(math.sin(3.0), abs=1e-6)


def test_inv_freq_stays_fp32_after_cast():
    rot = RotaryEmbedding(HEAD_DIM, theta=500000.0, rope_scaling=LLAMA3)
    before = rot.inv_freq.clone()
    holder = torch.nn.Sequential(rot, torch.nn.Linear(4, 4)).to(torch.bfloat16)
    assert holder[1].weight.dtype == torch.bfloat16
    assert rot.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rot.inv_freq, before, rtol=0, atol=0)  # recomputed, not round-tripped
    rot.half()
    assert rot.inv_freq.dtype == torch.float32
    assert "inv_freq" not in rot.state_dict()
    cos, sin = rot(torch.tensor([[1000, 1001]]))
    assert cos.dtype == torch.float32


def test_unsupported_rope_type_is_rejected():
    with pytest.raises(ValueError, match="rope_type 'foo' .* draftsmith supports rope_type default, linear, llama3, "
                                         "yarn, longrope, dynamic"):
        RotaryEmbedding(HEAD_DIM, rope_scaling={"rope_type": "foo", "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type 'longrope' needs long_factor"):
        RotaryEmbedding(HEAD_DIM, rope_scaling={"rope_type": "longrope", "short_factor": [1.0] * (HEAD_DIM // 2)})


def test_rmsnorm_matches_hf_and_formula():
    torch.manual_seed(0)
    ours = RMSNorm(8, eps=1e-5)
    ref = hf.LlamaRMSNorm(8, eps=1e-5)
    with torch.no_grad():
        ours.weight.copy_(torch.linspace(0.5, 2.0, 8))
        ref.weight.copy_(ours.weight)
    x = torch.randn(3, 5, 8) * 4
    torch.testing.assert_close(ours(x), ref(x))
    manual = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * ours.weight
    torch.testing.assert_close(ours(x), manual, rtol=1e-5, atol=1e-6)
    xb = x.bfloat16()
    torch.testing.assert_close(ours.bfloat16()(xb), ref.bfloat16()(xb))


def test_repeat_kv_matches_hf_grouping():
    x = torch.randn(2, 3, 4, 5)
    torch.testing.assert_close(repeat_kv(x, 2), hf.repeat_kv(x, 2))
    torch.testing.assert_close(repeat_kv(x, 2), x.repeat_interleave(2, dim=1))
    assert repeat_kv(x, 1) is x


def test_swiglu_formula():
    torch.manual_seed(0)
    mlp = SwiGLU(6, 10)
    x = torch.randn(2, 3, 6)
    g, u = x @ mlp.gate_proj.weight.T, x @ mlp.up_proj.weight.T
    manual = (g * torch.sigmoid(g) * u) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), manual, rtol=1e-5, atol=1e-6)
    assert sorted(mlp.state_dict()) == ["down_proj.weight", "gate_proj.weight", "up_proj.weight"]


def test_conditional_rates_by_hand():
    # 10 chains per position, prefix hits 6, 3, 3: P(accept k | 0..k-1 accepted) = .6, 3/6, 3/3,
    # the ratio vLLM's per-position counters give (accepted_per_pos_k / accepted_per_pos_{k-1})
    assert conditional_rates(torch.tensor([6, 3, 3]), torch.tensor([10, 10, 10])) == pytest.approx([0.6, 0.5, 1.0])
    # a deeper position with fewer positions (a sequence's tail): ratio of rates, so rate_k = prod cond_j
    cond = conditional_rates(torch.tensor([8, 4]), torch.tensor([10, 5]))
    assert cond == pytest.approx([0.8, (4 / 5) / (8 / 10)]) and cond[0] * cond[1] == pytest.approx(4 / 5)
    # no chain reached position 0: 0, not nan; no positions at all: 0 (clamped count)
    assert conditional_rates(torch.tensor([0, 0]), torch.tensor([4, 4])) == [0.0, 0.0]
    assert conditional_rates(torch.tensor([0]), torch.tensor([0])) == [0.0]
    # float (weighted) sums, as the trainer aggregates them
    assert conditional_rates(torch.tensor([1.5, 0.75]), torch.tensor([3.0, 3.0])) == pytest.approx([0.5, 0.5])
