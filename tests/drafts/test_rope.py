"""The draft's RoPE (drafts/rope.py, layers.RotaryEmbedding) for every type draftsmith trains, against
transformers' ROPE_INIT_FUNCTIONS, with the places where draftsmith follows vLLM instead (the engine that
serves the draft) asserted explicitly; vLLM's own tables are tests/drafts/test_rope_vllm.py. A target whose
rope_type no draft can copy is one ConfigError line, in build_draft and in ``draftsmith train`` (exit 2)."""

import json
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from draftsmith.cli import EXIT_BAD_INPUT, main
from draftsmith.config import ConfigError, build_config
from draftsmith.drafts import get_family
from draftsmith.drafts.layers import RotaryEmbedding, apply_rotary
from draftsmith.drafts.rope import ROPE_TYPES, draft_rope, rope_of_config
from draftsmith.targets import TargetInfo
from draftsmith.train.loop import build_draft
from fixtures import make_tiny_llama, make_tokenizer

HD = 16
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
YARN_CASES = {
    "plain": (HD, 10000.0, 256, YARN),
    "mscale_only": (HD, 10000.0, 256, {**YARN, "mscale": 0.707}),  # without mscale_all_dim: m = g(factor)
    "deepseek": (HD, 10000.0, 256, {**YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32,
                                    "beta_slow": 1}),
    "attention_factor": (HD, 10000.0, 256, {**YARN, "attention_factor": 1.25}),
    "gpt_oss": (64, 150000.0, 131072, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                       "truncate": False, "original_max_position_embeddings": 4096}),
}
SHORT = [1.0 + 0.01 * i for i in range(HD // 2)]
LONG = [1.0 + 0.5 * i for i in range(HD // 2)]
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 64}


def hf(rope: dict, theta: float, head_dim: int, max_pos: int, seq_len=None):
    """transformers' (inv_freq, attention_factor) for a Llama config with these RoPE parameters."""
    params = {"rope_theta": theta, **json.loads(json.dumps(rope))}  # a copy: transformers edits it in place
    cfg = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                      max_position_embeddings=max_pos, rope_parameters=params)
    return ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu", seq_len=seq_len)


def tables(rot: RotaryEmbedding, n: int):
    """cos, sin (n, d) at positions 0..n-1."""
    cos, sin = rot(torch.arange(n)[None])
    return cos[0], sin[0]


@pytest.mark.parametrize("case", list(YARN_CASES))
def test_yarn_matches_transformers(case):
    head_dim, theta, max_pos, rope = YARN_CASES[case]
    rot = RotaryEmbedding(head_dim, theta, rope, max_pos)
    inv, m = hf(rope, theta, head_dim, max_pos)
    torch.testing.assert_close(rot.inv_freq, inv, rtol=0, atol=0)
    assert rot.inv_freq.dtype == torch.float32
    assert rot.attention_scaling == pytest.approx(m, rel=1e-12)
    if case == "mscale_only":  # mscale alone is ignored (both engines): m = 1 + 0.1 ln factor
        assert rot.attention_scaling == pytest.approx(1 + 0.1 * math.log(4.0))
    if case == "deepseek":
        assert rot.attention_scaling == pytest.approx((1 + 0.1 * math.log(40)) / (1 + 0.08 * math.log(40)))
    cos, sin = tables(rot, 300)
    # the attention factor scales cos and sin (vLLM's cache, transformers' attention_scaling)
    torch.testing.assert_close(cos * cos + sin * sin, torch.full_like(cos, rot.attention_scaling ** 2))
    ang = torch.arange(300).float()[:, None] * inv
    torch.testing.assert_close(cos[:, : head_dim // 2], ang.cos() * m, rtol=0, atol=0)


def test_yarn_truncate_false_keeps_a_fractional_ramp():
    head_dim, theta, max_pos, rope = YARN_CASES["gpt_oss"]
    truncated = RotaryEmbedding(head_dim, theta, {**rope, "truncate": True}, max_pos).inv_freq
    assert not torch.equal(RotaryEmbedding(head_dim, theta, rope, max_pos).inv_freq, truncated)


def test_yarn_null_factor_is_written_out():
    """transformers takes M / L for a null factor; vLLM needs the number, so the draft's config has it."""
    rope = {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64}
    assert draft_rope(rope, 256) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    rot = RotaryEmbedding(HD, 10000.0, draft_rope(rope, 256), 256)
    torch.testing.assert_close(rot.inv_freq, hf(rope, 10000.0, HD, 256)[0], rtol=0, atol=0)


def test_longrope_uses_the_factors_vllm_serves():
    """vLLM picks long_factor once when its max_model_len (default M) exceeds L; transformers switches by
    sequence length (short up to L). The draft trains with what vLLM serves: the long factors for M > L."""
    rot = RotaryEmbedding(HD, 10000.0, LONGROPE, 512)
    long_inv, m = hf(LONGROPE, 10000.0, HD, 512, seq_len=65)
    short_inv, _ = hf(LONGROPE, 10000.0, HD, 512)
    torch.testing.assert_close(rot.inv_freq, long_inv, rtol=0, atol=0)
    assert not torch.allclose(rot.inv_freq, short_inv)  # transformers' choice at short lengths differs
    assert rot.attention_scaling == pytest.approx(m) == pytest.approx(math.sqrt(1 + math.log(8) / math.log(64)))
    short = RotaryEmbedding(HD, 10000.0, LONGROPE, 64)  # M = L: vLLM serves the short factors, m = 1
    torch.testing.assert_close(short.inv_freq, hf(LONGROPE, 10000.0, HD, 64)[0], rtol=0, atol=0)
    assert short.attention_scaling == 1.0
    # transformers reads longrope's attention_factor; vLLM does not, nor does the draft
    with_factor = RotaryEmbedding(HD, 10000.0, {**LONGROPE, "attention_factor": 2.0}, 512)
    assert with_factor.attention_scaling == rot.attention_scaling
    assert hf({**LONGROPE, "attention_factor": 2.0}, 10000.0, HD, 512)[1] == 2.0


def test_longrope_draft_carries_one_factor_list():
    """Whatever --max-model-len vLLM gets, it serves the draft's trained factors: both lists are them."""
    out = draft_rope({**LONGROPE, "long_mscale": 1.3, "short_mscale": 1.0, "attention_factor": 2.0}, 512)
    assert out == {"rope_type": "longrope", "short_factor": LONG, "long_factor": LONG,
                   "original_max_position_embeddings": 64, "short_mscale": 1.3, "long_mscale": 1.3}
    assert draft_rope(LONGROPE, 64)["long_factor"] == SHORT
    assert RotaryEmbedding(HD, 10000.0, out, 512).attention_scaling == 1.3


def test_dynamic_is_vllms_fixed_table():
    """vLLM's dynamic NTK is one table at theta' = theta * (f M / T - (f - 1))^(d / (d - 2)) (T defaults to
    M: theta' = theta); transformers recomputes theta' per sequence length beyond M. The draft follows vLLM."""
    rope = {"rope_type": "dynamic", "factor": 4.0}
    rot = RotaryEmbedding(HD, 10000.0, rope, 128)
    torch.testing.assert_close(rot.inv_freq, hf(rope, 10000.0, HD, 128)[0], rtol=0, atol=0)  # up to M: the same
    torch.testing.assert_close(rot.inv_freq, RotaryEmbedding(HD, 10000.0).inv_freq, rtol=0, atol=0)
    assert not torch.allclose(rot.inv_freq, hf(rope, 10000.0, HD, 128, seq_len=512)[0])  # transformers grows theta'
    cos, _ = tables(rot, 512)  # positions past M keep the one table
    ang = torch.arange(512).float()[:, None] * rot.inv_freq
    torch.testing.assert_close(cos[:, : HD // 2], ang.cos(), rtol=0, atol=0)
    power = HD / (HD - 2)
    trained = RotaryEmbedding(HD, 10000.0, {**rope, "max_trained_positions": 64}, 128)
    want = 1.0 / ((10000.0 * (4.0 * 128 / 64 - 3.0) ** power) ** (torch.arange(0, HD, 2).float() / HD))
    torch.testing.assert_close(trained.inv_freq, want, rtol=1e-6, atol=0)
    alpha = RotaryEmbedding(HD, 10000.0, {"rope_type": "dynamic", "alpha": 2.0}, 128)  # NTK-alpha (vLLM: alpha first)
    want = 1.0 / ((10000.0 * 2.0 ** power) ** (torch.arange(0, HD, 2).float() / HD))
    torch.testing.assert_close(alpha.inv_freq, want, rtol=1e-6, atol=0)


def test_linear_divides_the_position():
    """vLLM's linear table is (p / factor) * w; transformers' p * (w / factor): equal up to rounding."""
    rot = RotaryEmbedding(HD, 10000.0, {"rope_type": "linear", "factor": 3}, 2048)  # an int factor too
    pos = torch.tensor([[0, 1, 7, 100, 2047, 4000]])
    cos, sin = rot(pos)
    base = RotaryEmbedding(HD, 10000.0).inv_freq
    ang = (pos[0].float() / 3.0)[:, None] * base
    torch.testing.assert_close(cos[0, :, : HD // 2], ang.cos(), rtol=0, atol=0)
    ref = pos[0].float()[:, None] * hf({"rope_type": "linear", "factor": 3.0}, 10000.0, HD, 2048)[0]
    torch.testing.assert_close(sin[0, :, HD // 2:], ref.sin(), rtol=0, atol=1e-4)
    assert draft_rope({"type": "linear", "factor": 3}, 2048) == {"rope_type": "linear", "factor": 3.0}


ALL_TYPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": YARN,
    "longrope": LONGROPE,
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "max_trained_positions": 128},
}


@pytest.mark.parametrize("kind", list(ALL_TYPES))
def test_inv_freq_and_scaling_stay_fp32_after_cast(kind):
    rot = RotaryEmbedding(HD, 500000.0, ALL_TYPES[kind], 256)
    before, m = rot.inv_freq.clone(), rot.attention_scaling
    holder = torch.nn.Sequential(rot, torch.nn.Linear(4, 4)).to(torch.bfloat16)
    assert holder[1].weight.dtype == torch.bfloat16 and rot.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rot.inv_freq, before, rtol=0, atol=0)  # recomputed, not round-tripped
    assert rot.attention_scaling == m and "inv_freq" not in rot.state_dict()
    cos, sin = rot(torch.tensor([[1000, 1001]]))
    assert cos.dtype == sin.dtype == torch.float32
    x = torch.randn(1, 2, 2, HD, dtype=torch.bfloat16)
    assert apply_rotary(x, cos, sin).dtype == torch.bfloat16


def test_draft_rope_keeps_what_the_type_reads():
    assert draft_rope(None, 512) is None and draft_rope({"rope_type": "default", "rope_theta": 1.0}, 512) is None
    rope = {**YARN, "rope_theta": 5e5, "partial_rotary_factor": 0.5, "mrope_section": [2, 3, 3], "beta_fast": 32}
    assert draft_rope(rope, 256) == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                                     "beta_fast": 32.0}
    llama3 = {"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}  # L: M, as transformers
    assert draft_rope(llama3, 512) == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 512}
    bare = RotaryEmbedding(HD, 10000.0, {"rope_type": "yarn", "factor": 2.0}, 256)  # L = M, as the config loads
    torch.testing.assert_close(bare.inv_freq, RotaryEmbedding(HD, 10000.0, {**YARN, "factor": 2.0,
                                                                            "original_max_position_embeddings": 256},
                                                              256).inv_freq, rtol=0, atol=0)


def test_rope_of_config_reads_either_transformers_style():
    phi3 = {"rope_theta": 10000.0, "rope_scaling": {"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
            "original_max_position_embeddings": 64, "max_position_embeddings": 512}
    assert rope_of_config(phi3) == (10000.0, {"type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                               "original_max_position_embeddings": 64})
    v5 = {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                              "rope_theta": 1e6}}
    assert rope_of_config(v5) == (1e6, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    nested = {"text_config": {"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                                                  "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                     "rope_theta": 1e6}}}}
    assert rope_of_config(nested) == (1e6, {"rope_type": "linear", "factor": 8.0})
    assert rope_of_config({"rope_theta": 5e5, "rope_scaling": None}) == (5e5, None)


# ---- types no draft can copy: one ConfigError line -------------------------------------------


def info(rope_scaling, **kw):
    base = dict(num_layers=4, hidden_size=32, vocab_size=64, dtype="float32", model_type="llama", tied=False,
                num_attention_heads=2, num_key_value_heads=1, head_dim=HD, intermediate_size=48,
                max_position_embeddings=512, rope_scaling=rope_scaling)
    return TargetInfo(**{**base, **kw})


def run_config(tmp_path, draft=None):
    return build_config({"target": {"path": str(tmp_path)}, "draft": draft or {"type": "eagle3"},
                         "output": {"dir": str(tmp_path / "out")}})


@pytest.mark.parametrize("kind", ["mrope", "foo"])
def test_unsupported_rope_type_is_one_config_error(tmp_path, kind):
    with pytest.raises(ConfigError) as e:
        build_draft(run_config(tmp_path), info({"rope_type": kind, "factor": 2.0}), None, [1, 2, 3])
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("target: ")
    assert f"rope_type {kind!r}" in msg and "default, linear, llama3, yarn, longrope, dynamic" in msg


def test_missing_rope_key_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match="rope_type 'llama3' needs low_freq_factor"):
        build_draft(run_config(tmp_path), info({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                                                "original_max_position_embeddings": 64}), None, [1, 2, 3])
    with pytest.raises(ConfigError, match=r"long_factor .* has 3 values, expected head_dim / 2 = 8"):
        build_draft(run_config(tmp_path), info({**LONGROPE, "long_factor": [1.0, 2.0, 3.0]}), None, [1, 2, 3])


FAMILY_DRAFTS = {
    "eagle3": {"type": "eagle3"},
    "peagle": {"type": "peagle", "mask_token_id": 5, "num_depths": 2, "num_draft_layers": 2},
    "dflash": {"type": "dflash", "mask_token_id": 5, "block_size": 4, "num_draft_layers": 2},
}


@pytest.mark.parametrize("family", list(FAMILY_DRAFTS))
@pytest.mark.parametrize("kind", [k for k in ALL_TYPES if k != "default"])
def test_every_family_builds_and_exports_every_rope_type(tmp_path, family, kind):
    rope = ALL_TYPES[kind]
    cfg = run_config(tmp_path, FAMILY_DRAFTS[family])
    fam = get_family(cfg.draft.type)
    model_cfg = fam.config_from_target(info(rope), cfg.draft, draft_vocab_size=64, num_layer_ids=3, layer_ids=[1, 2, 3])
    model = fam.Model(model_cfg)
    assert model.rotary.rope_scaling == draft_rope(rope, 512)
    exported = model.export_config([1, 2, 3], "float32")
    assert exported["rope_scaling"] == draft_rope(rope, 512) and exported["rope_theta"] == 10000.0
    assert fam.config_from_export(json.loads(json.dumps(exported))) == model_cfg


# ---- the CLI: `draftsmith train` on such a target ------------------------------------------


def tiny_target(path, **rope_parameters):
    """A tiny Llama target whose config.json says ``rope_parameters`` (built in code, no download)."""
    make_tiny_llama(path, make_tokenizer("chatml"), num_layers=4)
    cfg = json.loads((path / "config.json").read_text())
    for key in ("rope_scaling", "rope_theta"):
        cfg.pop(key, None)
    cfg["rope_parameters"] = {"rope_theta": 10000.0, **rope_parameters}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def train_args(tmp_path, target):
    chats = tmp_path / "chats.jsonl"
    row = {"messages": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "hello to you"}]}
    chats.write_text((json.dumps(row) + "\n") * 6)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "target": {"path": str(target)}, "draft": {"ttt_steps": 2},
        "data": {"sources": [str(chats)], "max_length": 48, "eval_size": 1, "draft_vocab_size": 64},
        "train": {"max_steps": 1, "num_threads": 1}, "output": {"dir": str(tmp_path / "out"), "tensorboard": False},
    }))
    return ["train", str(cfg), "--no-progress"]


@pytest.mark.parametrize("kind", ["mrope", "foo"])
def test_train_on_an_unsupported_rope_target_exits_2_with_one_line(tmp_path, capsys, kind):
    target = tiny_target(tmp_path / "target", rope_type=kind, factor=2.0)
    args = train_args(tmp_path, target)
    capsys.readouterr()  # the fixture's own output
    code = main(args)
    err = capsys.readouterr().err.strip()
    assert code == EXIT_BAD_INPUT, err
    assert err.startswith("draftsmith: error: target: ") and "\n" not in err, err
    assert f"rope_type {kind!r}" in err and str(target / "config.json") in err
    assert "draftsmith supports rope_type " + ", ".join(ROPE_TYPES) in err


@pytest.mark.usefixtures("restore_threads")
def test_train_on_a_yarn_target_exports_its_rope(tmp_path, capsys):
    target = tiny_target(tmp_path / "target", rope_type="yarn", factor=4, original_max_position_embeddings=128,
                         beta_fast=32, truncate=False)
    assert main(train_args(tmp_path, target)) == 0, capsys.readouterr().err
    configs = sorted((tmp_path / "out" / "checkpoints").glob("*/model/consolidated/config.json"))
    assert configs
    exported = json.loads(configs[-1].read_text())
    assert exported["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                        "beta_fast": 32.0, "truncate": False}
    assert exported["rope_theta"] == 10000.0 and exported["max_position_embeddings"] == 512
