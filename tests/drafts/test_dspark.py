"""DSpark's math against reference loops written out slot by slot, its greedy Markov walk, its config
both ways, and what its serving writers and doctor checks say (drafts/dspark/)."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from draftsmith.drafts import family_of_config, get_family
from draftsmith.drafts.dspark.config import DSparkConfig, DSparkDraftConfig, config_from_export
from draftsmith.drafts.dspark.model import DSparkDraft
from draftsmith.drafts.dspark.serving import doctor_problems, speculators_fields, vllm_config
from draftsmith.serve.resolve import ServeError
from draftsmith.serve.vllm import vllm_config as serve_vllm_config

V, H, R, BS, MASK = 40, 32, 6, 3, 1


def tiny(confidence=True, with_markov=True, gamma=2.0):
    cfg = DSparkConfig(hidden_size=H, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=48,
                       vocab_size=V, num_target_layers=4, target_layer_ids=[0, 2], mask_token_id=MASK, markov_rank=R,
                       confidence_head=confidence, confidence_with_markov=with_markov and confidence,
                       num_hidden_layers=2, block_size=BS, num_anchors=3, loss_decay_gamma=gamma)
    torch.manual_seed(0)
    model = DSparkDraft(cfg)
    torch.nn.init.normal_(model.markov_head.markov_w2.weight, std=0.5)  # a non-zero bias to check
    if model.confidence_head is not None:
        torch.nn.init.normal_(model.confidence_head.proj.weight, std=0.3)
    emb, head = torch.randn(V, H), torch.randn(V, H)
    model.attach_target(emb, head)
    model.attach_teacher(1.0 + 0.1 * torch.randn(H), 1e-6)
    return model


def supervision(b=2, s=14):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, V, (b, s), generator=g)
    mask = torch.ones(b, s)
    mask[:, :3] = 0  # a prompt
    return SimpleNamespace(aux_hidden=torch.randn(b, s, 2, H, generator=g), input_ids=ids, loss_mask=mask,
                           last_hidden=torch.randn(b, s, H, generator=g))


def reference_loss(model, sup, anchor, lmask, h):
    """The module docstring's loss, one slot at a time."""
    with torch.no_grad():
        return _reference_loss(model, sup, anchor, lmask, h)


def _reference_loss(model, sup, anchor, lmask, h):
    cfg, lm = model.cfg, model.lm_head
    w1, w2 = model.markov_head.markov_w1.weight, model.markov_head.markov_w2.weight
    num = {"ce": 0.0, "tv": 0.0, "bce": 0.0}
    den = 0.0
    for b, j, k in lmask.nonzero().tolist():
        a = int(anchor[b, j])
        prev = int(sup.input_ids[b, a + k])  # slot 0: the anchor; slot k: the data token a + k
        logits = h[b, j, k] @ lm.T + w2 @ w1[prev]
        x = sup.last_hidden[b, a + k]  # the target's state that predicts token a + k + 1
        teacher = (model.teacher_norm * (x * torch.rsqrt(x.pow(2).mean() + model.teacher_eps))) @ lm.T
        p, q = logits.softmax(-1), teacher.softmax(-1)
        tv = 0.5 * (p - q).abs().sum()
        alpha = torch.minimum(p, q).sum()
        assert float(alpha) == pytest.approx(1 - float(tv), abs=1e-5)  # sum min(p, q) = 1 - TV
        feats = torch.cat([h[b, j, k], w1[prev]]) if cfg.confidence_with_markov else h[b, j, k]
        conf = model.confidence_head.proj(feats)[0] if model.confidence_head is not None else torch.tensor(0.0)
        weight = math.exp(-k / cfg.loss_decay_gamma)
        num["ce"] += weight * float(F.cross_entropy(logits[None], sup.input_ids[b, a + k + 1][None]))
        num["tv"] += weight * float(tv)
        num["bce"] += weight * float(F.binary_cross_entropy_with_logits(conf, alpha.detach()))
        den += weight
    conf_w = cfg.confidence_weight if model.confidence_head is not None else 0.0
    return (cfg.ce_weight * num["ce"] + cfg.tv_weight * num["tv"] + conf_w * num["bce"]) / den


@pytest.mark.parametrize("confidence,with_markov", [(True, True), (True, False), (False, False)])
def test_loss_equals_the_slot_by_slot_reference(confidence, with_markov):
    model, sup = tiny(confidence, with_markov), supervision()
    gen = [torch.Generator().manual_seed(i) for i in range(2)]
    with torch.no_grad():
        h, labels, lmask, anchor = model.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask,
                                                [torch.Generator().manual_seed(i) for i in range(2)])
        out = model(sup, gen)
    assert lmask.any() and (labels[lmask] == sup.input_ids.gather(1, (anchor[..., None] + 1 + torch.arange(BS)).clamp(
        max=13).flatten(1)).view_as(labels)[lmask]).all()  # slot k's label: token anchor + k + 1
    assert float(out.loss) == pytest.approx(reference_loss(model, sup, anchor, lmask, h), rel=1e-5, abs=1e-6)
    assert len(out.sums["pos_count"]) == BS  # every slot drafts


def test_loss_and_gradients_are_the_same_in_chunks_of_rows():
    model, sup = tiny(), supervision()
    gen = lambda: [torch.Generator().manual_seed(i) for i in range(2)]  # noqa: E731
    whole = model(sup, gen())
    grads = torch.autograd.grad(whole.loss, [model.markov_head.markov_w2.weight, model.fc.weight])
    model.max_logit_elements = 2 * V  # two rows a chunk
    chunked = model(sup, gen())
    grads2 = torch.autograd.grad(chunked.loss, [model.markov_head.markov_w2.weight, model.fc.weight])
    assert float(chunked.loss) == pytest.approx(float(whole.loss), rel=1e-5)
    for a, b in zip(grads, grads2):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.equal(whole.sums["pos_correct"], chunked.sums["pos_correct"])


def test_the_markov_walk_conditions_each_slot_on_the_token_drafted_before_it():
    # lm_head 0: the logits are the Markov bias alone; W2 W1[t] is one-hot on the successor t + 3 (mod V),
    # so from anchor a the walk drafts a+3, a+6, a+9: each slot reads the token drafted at the slot before
    model = tiny(confidence=False)
    succ = {t: (t + 3) % V for t in range(V)}
    big = DSparkDraft(DSparkConfig(**{**model.cfg.__dict__, "markov_rank": V}))
    big.attach_target(model.embed_tokens, torch.zeros(V, H))
    with torch.no_grad():
        big.markov_head.markov_w1.weight.copy_(torch.eye(V))
        big.markov_head.markov_w2.weight.copy_(10 * torch.eye(V)[[succ[t] for t in range(V)]].T)
    logits = big.head_logits(torch.randn(BS, H), anchor_token=7)
    assert logits.argmax(-1).tolist() == [10, 13, 16]


def test_proposer_drafts_block_size_tokens_from_k_slots():
    from draftsmith.drafts.block_infer import BlockProposer
    from draftsmith.drafts.proposer import DecodeState

    model = tiny().eval()
    prop = BlockProposer(model)
    assert prop.max_k == prop.default_k == BS  # K = block_size: vLLM's default for dspark
    seen = []
    real = model.run_blocks
    model.run_blocks = lambda ids, pos, kvs, mask: seen.append((ids.tolist(), pos.tolist())) or real(ids, pos, kvs, mask)
    tokens = [3, 4, 5, 6, 7]
    state = DecodeState(tokens=tokens, aux=torch.randn(len(tokens) - 1, 2, H), prompt_len=3, k=BS)
    out = prop.propose(state)
    assert len(out.tokens) == BS
    # K slots [anchor, MASK x K-1] at positions n .. n+K-1 (n = 4: the anchor is the newest token, no state yet)
    assert seen == [([[7, MASK, MASK]], [[4, 5, 6]])]
    with pytest.raises(ValueError, match=f"use 1 <= k <= {BS}"):
        prop.propose(DecodeState(tokens=tokens, aux=state.aux, prompt_len=3, k=BS + 1))


def test_sampling_is_refused_in_one_line():
    from draftsmith.drafts import DraftError
    from draftsmith.drafts.block_infer import BlockProposer
    from draftsmith.drafts.proposer import DecodeState

    prop = BlockProposer(tiny().eval())
    with pytest.raises(DraftError, match="DSpark drafts are evaluated greedily.*--temperature 0"):
        prop.propose(DecodeState(tokens=[3, 4], aux=torch.randn(1, 2, H), prompt_len=1, k=1, temperature=0.7))


def test_state_dict_is_vllms_on_disk_names():
    model = tiny()
    names = set(model.state_dict())
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "confidence_head.proj.bias", "fc.weight", "hidden_norm.weight", "norm.weight"} <= names
    assert not any(n.startswith(("model.", "embed_tokens", "lm_head")) or "teacher" in n for n in names)
    sd = model.state_dict()
    assert tuple(sd["markov_head.markov_w1.weight"].shape) == (V, R)  # nn.Embedding(V, r), vLLM's markov_w1
    assert tuple(sd["markov_head.markov_w2.weight"].shape) == (V, R)  # ParallelLMHead(V_draft, r)
    assert tuple(sd["confidence_head.proj.weight"].shape) == (1, H + R)
    assert "confidence_head.proj.weight" not in tiny(confidence=False).state_dict()


def test_export_config_round_trips_and_states_the_layout():
    model = tiny()
    cfg = model.export_config([1, 3])  # engine ids -> on-disk target_layer_ids [0, 2]
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["target_layer_ids"] == [0, 2]
    assert cfg["sample_from_anchor"] is True and cfg["dspark_bonus_anchor"] is False  # always written
    assert cfg["enable_confidence_head"] is True and cfg["confidence_head_with_markov"] is True
    assert cfg["block_size"] == BS and cfg["mask_token_id"] == MASK and cfg["markov_rank"] == R
    back = config_from_export(cfg)
    for key in ("block_size", "mask_token_id", "markov_rank", "confidence_head", "confidence_with_markov",
                "target_layer_ids", "loss_decay_gamma", "num_hidden_layers"):
        assert getattr(back, key) == getattr(model.cfg, key), key
    assert family_of_config(cfg) == "dspark"
    # a DFlash config is not DSpark's, nor the other way round
    dflash = {"architectures": ["Qwen3DFlashDraftModel"], "dflash_config": {"block_size": 4}}
    assert family_of_config(dflash) == "dflash"
    assert not get_family("dflash").recognises(cfg)


def test_serving_writers_state_every_flag():
    cfg = tiny().export_config([1, 3])
    for key in ("sample_from_anchor", "dspark_bonus_anchor", "use_aux_hidden_state"):
        cfg.pop(key)
    out = dict(cfg)
    vllm_config(out)
    assert out["sample_from_anchor"] is True and out["dspark_bonus_anchor"] is False and out["use_aux_hidden_state"]
    # DSpark declares no serve flag: serve's vllm_config refuses DFlash's --dflash-causal for it by name
    with pytest.raises(ServeError, match="--dflash-causal applies to DFlash drafts only; this draft is a DSpark"):
        serve_vllm_config(dict(cfg), dflash_causal=True)
    top = speculators_fields(out, {}, "dspark")
    assert top["sample_from_anchor"] is True  # speculators defaults it to False: the other layout
    assert top["aux_hidden_state_layer_ids"] == [1, 3] and top["speculators_model_type"] == "dspark"
    assert top["markov_rank"] == R and top["block_size"] == BS


def test_doctor_flags_a_missing_layout_flag():
    cfg = tiny().export_config([1, 3])
    assert doctor_problems(cfg) == []
    cfg.pop("sample_from_anchor")
    (line,) = doctor_problems(cfg)
    assert "'sample_from_anchor' is None" in line and "set it to true" in line
    cfg.update(sample_from_anchor=True, markov_head_type="rnn")
    assert any("'markov_head_type' is 'rnn'" in p for p in doctor_problems(cfg))


def test_draft_section_problems_name_the_key():
    bad = DSparkDraftConfig(mask_token_id=None, block_size=0, markov_rank=0, ce_weight=-1.0, confidence_head=False)
    problems = bad.problems()
    for key in ("draft.mask_token_id", "draft.block_size", "draft.markov_rank", "draft.ce_weight",
                "draft.confidence_with_markov"):
        assert any(key in p for p in problems), (key, problems)
