"""TargetInfo's draft MLP width and head form from real-size configs (built in code, no download)."""

import pytest

from draftsmith.supervision.head import HeadForm, head_form_of
from draftsmith.targets.hf import draft_mlp_width


def _cfg(name, **kw):
    import transformers

    return getattr(transformers, name)(**kw)


@pytest.mark.parametrize("name,kw,want", [
    ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336), 14336),  # dense: the target's own
    ("Qwen3MoeConfig", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                            num_experts_per_tok=8), 6144),
    # was 18,432 (the dense layers' width): a 0.4 B-parameter draft MLP
    ("DeepseekV3Config", dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                              n_routed_experts=256, num_experts_per_tok=8), 16384),
    # was 2,880 (one expert = 1 x hidden)
    ("GptOssConfig", dict(hidden_size=2880, intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4),
     11520),
    ("MixtralConfig", dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2),
     16384),  # 2 x 14,336 capped at 4 x hidden
])
def test_draft_mlp_width(name, kw, want):
    assert draft_mlp_width(_cfg(name, **kw)) == want


def test_head_forms_from_configs():
    assert head_form_of(_cfg("LlamaConfig")) == HeadForm()
    assert head_form_of(_cfg("Gemma3TextConfig", final_logit_softcapping=30.0)) == HeadForm(1.0, 1.0, 30.0)
    assert head_form_of(_cfg("Gemma2Config")).norm_offset == 1.0
    assert head_form_of(_cfg("GraniteConfig", logits_scaling=8.0)) == HeadForm(0.0, 0.125, None)
    assert head_form_of(_cfg("CohereConfig", logit_scale=0.0625)) == HeadForm(0.0, 0.0625, None)
    # a dict (config.json as read) gives the same
    assert head_form_of({"model_type": "granite", "logits_scaling": 8.0}) == HeadForm(0.0, 0.125, None)


@pytest.mark.parametrize("family", ["eagle3", "dflash"])
def test_draft_intermediate_size_key_sets_the_mlp_width(family):
    """draft.intermediate_size: 0 takes the target's (MoE: the active width above); a width overrides it; a
    negative one is a ConfigError naming the key."""
    from draftsmith.config import ConfigError, build_config
    from draftsmith.drafts import get_family
    from draftsmith.targets.hf import info_from_config

    info = info_from_config(_cfg("DeepseekV3Config", hidden_size=256, intermediate_size=1024, moe_intermediate_size=64,
                                 n_routed_experts=8, num_experts_per_tok=4, num_attention_heads=4,
                                 num_key_value_heads=4, num_hidden_layers=4), dtype="float32", tied=False)
    extra = {"type": "dflash", "mask_token_id": 5} if family == "dflash" else {}
    for key, want in ((0, 256), (96, 96)):
        cfg = build_config({"target": {"path": "t"}, "data": {"sources": ["x.jsonl"]},
                            "draft": {**extra, "intermediate_size": key}})
        model_cfg = get_family(family).config_from_target(info, cfg.draft, draft_vocab_size=64, num_layer_ids=2,
                                                          layer_ids=[1, 3])
        assert model_cfg.intermediate_size == want, (family, key)
    with pytest.raises(ConfigError, match="draft.intermediate_size"):
        build_config({"target": {"path": "t"}, "data": {"sources": ["x.jsonl"]},
                      "draft": {**extra, "intermediate_size": -1}})
