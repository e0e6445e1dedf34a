"""draft.init_layer_from_target: the EAGLE layer 0 starts as one of the target's decoder layers.

Reference: with the token embedding zeroed (input_layernorm(0) = 0, so the fused input's embedding half
is 0) and fc passing one target state through, step 0 of the draft IS target layer i applied to the
stream it reads in the target: h_pre == hidden_states[i + 1] given hidden_states[i]."""

import pytest
import torch

from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.targets.contract import TargetError
from dataclasses import replace

from draftsmith.targets.runner import decoder_layer_weights, target_info
from fixtures import make_tiny_llama, make_tokenizer

LAYERS, HIDDEN = 4, 64


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("init_layer") / "target", make_tokenizer("chatml"),
                           num_layers=LAYERS, hidden=HIDDEN)


@pytest.fixture(scope="module")
def info(target):
    return target_info(target, "float32", tied=False)


def draft_like(model, **over) -> Eagle3Draft:
    c = model.config
    rope = c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else getattr(c, "rope_theta", 1e4)
    shape = dict(hidden_size=c.hidden_size, target_hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads,
                 num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads,
                 intermediate_size=c.intermediate_size, vocab_size=c.vocab_size, draft_vocab_size=c.vocab_size,
                 num_aux=1, rms_norm_eps=c.rms_norm_eps, rope_theta=float(rope),
                 max_position_embeddings=c.max_position_embeddings, ttt_steps=1)
    return Eagle3Draft(Eagle3Config(**{**shape, **over}))


@pytest.mark.parametrize("index", [1, -2])
def test_step_0_is_the_target_layer_on_the_stream_it_reads(target, info, index):
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target).eval()
    i = index % LAYERS
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states  # L + 1 of (B, T, H); [i] enters layer i
    d = draft_like(model)
    copied = d.init_layer_from_target(decoder_layer_weights(target, index, info))
    assert sorted(copied) == sorted(["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                                     "self_attn.o_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
                                     "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"])
    with torch.no_grad():
        d.model.embed_tokens.weight.zero_()  # the fused input's embedding half: input_layernorm(0) = 0
        d.model.fc.weight.copy_(torch.eye(HIDDEN))  # h = the target's stream entering layer i
        step = next(d.iter_steps(states[i].unsqueeze(2), ids, steps=1, logits=False))
    torch.testing.assert_close(step.hidden, states[i + 1], atol=1e-5, rtol=1e-5)
    # both halves of q/k/v hold the target's projection, both input norms its input_layernorm
    w = model.model.layers[i].self_attn.q_proj.weight
    assert torch.equal(d.model.layers[0].self_attn.q_proj.weight, torch.cat([w, w], 1))
    assert torch.equal(d.model.layers[0].input_layernorm.weight, d.model.layers[0].hidden_norm.weight)


def test_norm_offset_and_qk_norms(target, info):
    plain = decoder_layer_weights(target, 0, info)
    gemma = decoder_layer_weights(target, 0, replace(info, norm_offset=1.0))  # (1 + w) norms: the plain norm of w + 1
    assert torch.equal(gemma["input_layernorm.weight"], plain["input_layernorm.weight"] + 1)
    assert torch.equal(gemma["self_attn.q_proj.weight"], plain["self_attn.q_proj.weight"])
    from transformers import LlamaForCausalLM

    d = draft_like(LlamaForCausalLM.from_pretrained(target), qk_norm=True)
    hd = d.cfg.head_dim
    qk = {**plain, "self_attn.q_norm.weight": torch.full((hd,), 2.0), "self_attn.k_norm.weight": torch.full((hd,), 3.0)}
    assert "self_attn.q_norm.weight" in d.init_layer_from_target(qk)
    assert float(d.model.layers[0].self_attn.k_norm.weight.detach()[0]) == 3.0
    assert "self_attn.q_norm.weight" not in d.init_layer_from_target(plain)  # a Llama target: the norms stay at 1


def test_bad_index_and_shapes_name_the_key(target, info):
    with pytest.raises(TargetError, match=r"draft.init_layer_from_target: 4 is not a decoder layer .*0..3"):
        decoder_layer_weights(target, 4, info)
    with pytest.raises(TargetError, match=r"-5 is not a decoder layer"):
        decoder_layer_weights(target, -5, info)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(target)
    narrow = draft_like(model, intermediate_size=32)
    before = narrow.model.layers[0].self_attn.q_proj.weight.clone()
    with pytest.raises(ValueError, match=r"mlp.gate_proj.weight is \(\d+, 64\) but the draft's needs \(32, 64\); "
                                         r"leave draft.intermediate_size at 0"):
        narrow.init_layer_from_target(decoder_layer_weights(target, 0, info))
    assert torch.equal(narrow.model.layers[0].self_attn.q_proj.weight, before)  # checked before anything is copied
