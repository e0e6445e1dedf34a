"""The hf engine on a tiny random Llama: layer-id mapping, logits, info, errors, supervision."""

import sys
import pathlib

import pytest
import torch

try:
    import fixtures
except ImportError:  # until the lead's conftest puts tests/ on sys.path
    sys.path.insert(0, str(pathlib.Path(__file__).parents[1]))
    import fixtures

from draftsmith.targets import Batch, open_engine
from draftsmith.targets.contract import TargetError, rebuild_logits, shift_left
from draftsmith.drafts.block_supervision import dflash_ids_to_engine, dflash_layer_ids
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine

L = 3  # decoder layers of the tiny target


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return fixtures.make_tiny_llama(tmp_path_factory.mktemp("tiny"), num_layers=L)


@pytest.fixture(scope="module")
def engine(tiny):
    eng = HFEngine(tiny)
    yield eng
    eng.close()


def _batch(vocab: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (2, 7), generator=g)
    attn = torch.ones_like(ids)
    attn[1, 5:] = 0  # right padding on row 1
    loss = torch.zeros_like(ids)
    loss[:, 3:6] = 1
    return Batch(ids, attn, loss)


def _layer_outputs(model, batch: Batch) -> list[torch.Tensor]:
    """Residual stream after each decoder layer, captured by our own forward hooks (plain reference)."""
    outs: list[torch.Tensor] = []
    hooks = [
        layer.register_forward_hook(lambda _m, _a, out: outs.append(out[0] if isinstance(out, tuple) else out))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    finally:
        for h in hooks:
            h.remove()
    return outs


def test_layer_ids_follow_vllm_convention(engine):
    batch = _batch(engine.info().vocab_size)
    feats = engine.features(batch, list(range(L + 1)), logits=True)
    assert feats.aux_hidden.shape == (2, 7, L + 1, 64)
    # id 0 = embedding output
    torch.testing.assert_close(feats.aux_hidden[:, :, 0], engine.model.get_input_embeddings()(batch.input_ids), rtol=0, atol=0)
    # id i = output of decoder layer i-1; id L = last layer output, before the final norm
    layer_outs = _layer_outputs(engine.model, batch)
    for i in range(1, L + 1):
        torch.testing.assert_close(feats.aux_hidden[:, :, i], layer_outs[i - 1], rtol=0, atol=0)
    # norm(id L) @ lm_head.T reproduces the target's logits
    normed = engine.model.model.norm(feats.aux_hidden[:, :, L])
    torch.testing.assert_close(normed @ engine.lm_head_weight().T, feats.logits, rtol=1e-5, atol=1e-5)
    assert feats.logits.shape == (2, 7, engine.info().vocab_size) and feats.logits.dtype == torch.float32


def test_request_order_and_no_logits(engine):
    batch = _batch(engine.info().vocab_size, seed=1)
    full = engine.features(batch, [0, 1, 2, 3], logits=False)
    assert full.logits is None
    picked = engine.features(batch, [3, 0, 2], logits=False)
    torch.testing.assert_close(picked.aux_hidden, full.aux_hidden[:, :, [3, 0, 2]], rtol=0, atol=0)


def test_features_feed_autograd(engine):
    # Features must be ordinary tensors: a trainable layer on top of them can backpropagate.
    feats = engine.features(_batch(engine.info().vocab_size), [1, 2, 3], logits=True)
    fc = torch.nn.Linear(3 * 64, 8)
    out = fc(feats.aux_hidden.flatten(2)) * feats.logits[..., :8]
    out.sum().backward()
    assert fc.weight.grad is not None and feats.aux_hidden.grad is None


def test_info(engine, tiny):
    info = engine.info()
    assert (info.num_layers, info.hidden_size, info.vocab_size) == (L, 64, len(engine.tokenizer))
    assert (info.dtype, info.model_type, info.tied) == ("float32", "llama", False)
    assert (info.num_attention_heads, info.num_key_value_heads, info.head_dim) == (2, 1, 32)
    assert (info.intermediate_size, info.rms_norm_eps, info.max_position_embeddings) == (128, 1e-6, 512)
    assert (info.rope_theta, info.rope_scaling) == (10000.0, None)
    assert engine.embeddings().shape == (info.vocab_size, 64)
    assert torch.equal(engine.final_norm_weight(), engine.model.model.norm.weight)
    assert engine.lm_head_weight().data_ptr() != engine.embeddings().data_ptr()


def test_tied_bf16_target(tmp_path):
    path = fixtures.make_tiny_llama(tmp_path / "tied", num_layers=2, tied=True)
    eng = open_engine("hf", str(path), dtype="bfloat16")
    info = eng.info()
    assert info.tied and info.dtype == "bfloat16"
    assert eng.lm_head_weight().data_ptr() == eng.embeddings().data_ptr()
    feats = eng.features(_batch(info.vocab_size), [2, 1], logits=True)
    assert feats.aux_hidden.dtype == torch.bfloat16 and feats.logits.dtype == torch.bfloat16
    eng.close()


def test_rope_scaling_reported(tmp_path):
    from transformers import LlamaForCausalLM

    tok = fixtures.make_tokenizer("chatml")
    cfg = fixtures.tiny_llama_config(len(tok), num_layers=1)
    cfg.rope_parameters = {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    info = HFEngine(tmp_path).info()
    assert info.rope_theta == 5e5
    assert info.rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_errors(tmp_path, engine):
    missing = tmp_path / "nope"
    with pytest.raises(TargetError, match=r"target\.path: '.*nope' does not exist; .*`smollm2`"):
        HFEngine(missing)
    with pytest.raises(TargetError, match=r"target\.path: '.*' has no config\.json"):
        HFEngine(tmp_path)
    with pytest.raises(TargetError, match=r"target\.dtype: 'fp8'"):
        HFEngine(tmp_path, dtype="fp8")
    with pytest.raises(TargetError, match=r"target\.aux_layer_ids: layer id 4 .*0\.\.3"):
        engine.features(_batch(engine.info().vocab_size), [1, 4], logits=False)


def test_eagle3_supervision_from_engine_matches_raw_hf(engine):
    vocab = engine.info().vocab_size
    batch = _batch(vocab, seed=2)
    feats = engine.features(batch, [1, 2, 3], logits=True)
    # Draft vocab: every 7th id plus row 0's argmaxes, so row 0 is kept and row 1 partly dropped.
    draft_ids = torch.unique(torch.cat([torch.arange(0, vocab, 7), feats.logits[0].argmax(-1)]))
    sup = eagle3_supervision(batch, feats, draft_ids)

    # By hand from the raw HF outputs: hidden_states[1..2], id 3 from a hook on the last layer.
    with torch.no_grad():
        raw = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=True)
    last = _layer_outputs(engine.model, batch)[-1]
    aux = torch.stack([raw.hidden_states[1], raw.hidden_states[2], last], dim=2)
    logits_next = torch.cat([raw.logits[:, 1:], torch.zeros_like(raw.logits[:, :1])], dim=1)  # (B, S, V)
    probs = torch.softmax(logits_next[..., draft_ids], dim=-1)
    probs[:, -1] = 0.0
    in_draft = torch.isin(logits_next.argmax(-1), draft_ids)
    loss_next = torch.cat([batch.loss_mask[:, 1:], torch.zeros_like(batch.loss_mask[:, :1])], dim=1)

    torch.testing.assert_close(sup.aux_hidden, aux, rtol=0, atol=0)
    torch.testing.assert_close(sup.target_probs, probs, rtol=1e-6, atol=1e-7)
    assert torch.equal(sup.loss_mask, loss_next)
    assert torch.equal(sup.input_ids, shift_left(batch.input_ids))
    assert torch.equal(sup.position_mask, loss_next.bool() & in_draft)
    assert sup.position_mask[0].tolist() == loss_next[0].bool().tolist()
    assert not sup.position_mask[:, -1].any()


def test_colocated_supervision_stream_uses_the_vocab_map(engine):
    """Engine.supervision(kind, ...) = features + contract, with the map set_vocab_map gave (None = full)."""
    vocab = engine.info().vocab_size
    batches = [_batch(vocab, seed=s) for s in (3, 4)]
    draft_ids = torch.arange(0, vocab, 5)
    for ids in (draft_ids, None):
        engine.set_vocab_map(ids)
        got = list(engine.supervision("eagle3", iter(batches), [1, 3]))
        assert [b for b, _ in got] == batches
        for b, sup in got:
            ref = eagle3_supervision(b, engine.features(b, [1, 3], logits=True), ids)
            assert torch.equal(sup.target_probs, ref.target_probs) and torch.equal(sup.position_mask, ref.position_mask)
    with pytest.raises(TargetError, match="supervision kind 'nope' is unknown"):
        next(engine.supervision("nope", iter(batches), [1, 3]))


def test_dflash_kinds_read_decoder_layer_outputs_unshifted(engine):
    """DFlash hook id j (output of decoder layer j) is engine id j + 1; nothing is shifted; kd carries the
    pre-norm state at id L, from which the target's own logits rebuild bitwise."""
    batch = _batch(engine.info().vocab_size, seed=5)
    outs = _layer_outputs(engine.model, batch)  # outs[j] = output of decoder layer j, (B, S, H)
    hook_ids = [0, 2, 1]
    ids = dflash_ids_to_engine(hook_ids)
    assert ids == [1, 3, 2] and dflash_layer_ids(L, 1) == [2]  # L = 3: hook [L // 2] = [1]
    engine.set_vocab_map(torch.arange(0, engine.info().vocab_size, 5))  # ignored by vocab-free kinds
    (b, sup), = engine.supervision("dflash", iter([batch]), ids)
    (_, kd), = engine.supervision("dflash_kd", iter([batch]), ids)
    assert b is batch and not hasattr(sup, "logits")
    torch.testing.assert_close(sup.aux_hidden, torch.stack([outs[j] for j in hook_ids], dim=2), rtol=0, atol=0)
    assert torch.equal(sup.input_ids, batch.input_ids) and torch.equal(sup.loss_mask, batch.loss_mask)
    with torch.no_grad():
        raw = engine.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    assert torch.equal(kd.last_hidden, outs[L - 1])  # id L: the last decoder layer's output, before the norm
    rebuilt = rebuild_logits(kd.last_hidden, engine.final_norm_weight(), engine.lm_head_weight(), engine.info().rms_norm_eps)
    assert rebuilt.dtype == raw.logits.dtype and torch.equal(rebuilt, raw.logits)  # unshifted
    assert torch.equal(kd.aux_hidden, sup.aux_hidden) and torch.equal(kd.input_ids, batch.input_ids)
    engine.set_vocab_map(None)


def test_dflash_kd_state_stays_in_the_engine_dtype(tiny):
    eng = HFEngine(tiny, dtype="bfloat16")
    try:
        batch = _batch(eng.info().vocab_size)
        (_, kd), = eng.supervision("dflash_kd", iter([batch]), [1])  # id L asked for beside [1]
        assert kd.last_hidden.dtype == kd.aux_hidden.dtype == torch.bfloat16  # not upcast
        assert kd.last_hidden.shape == (*batch.input_ids.shape, eng.info().hidden_size) and kd.aux_hidden.shape[2] == 1
    finally:
        eng.close()
