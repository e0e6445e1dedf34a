"""Shift semantics, layer-id defaults and draft-vocab projection (hand-built tensors)."""

import math

import pytest
import torch

from draftsmith.targets import Batch, Features
from draftsmith.targets.contract import TargetError, default_aux_layer_ids, shift_left, validate_layer_ids
from draftsmith.drafts.block_supervision import DFlashKDSupervision, DFlashSupervision, dflash_ids_to_engine, dflash_kd_supervision, dflash_layer_ids, dflash_supervision, engine_ids_to_dflash
from draftsmith.drafts.eagle_supervision import eagle3_supervision

LN = math.log


# ---------------------------------------------------------------- layer ids
@pytest.mark.parametrize(
    "L, expected",
    [
        (30, [2, 15, 27]),  # SmolLM2: vLLM's (2, L//2, L-3)
        (32, [2, 16, 29]),
        (7, [2, 3, 4]),  # smallest L where vLLM's triple is already distinct
        (6, [1, 3, 5]),  # vLLM gives {2, 3}: spread over 1..5
        (5, [1, 3, 4]),  # vLLM gives {2}: spread over 1..4 (1 + round-half-up(1.5) = 3)
        (4, [1, 2, 3]),  # vLLM gives {1, 2}: spread over 1..3
        (3, [0, 1, 2]),  # vLLM's (2, 1, 0) is distinct and below L
    ],
)
def test_default_aux_layer_ids(L, expected):
    assert default_aux_layer_ids(L) == expected


@pytest.mark.parametrize("L", [2, 1, 0])
def test_default_aux_layer_ids_too_few_layers(L):
    with pytest.raises(TargetError, match=r"target\.aux_layer_ids"):
        default_aux_layer_ids(L)


def test_validate_layer_ids_accepts_0_to_L_in_request_order():
    assert validate_layer_ids([4, 0, 2], 4) == [4, 0, 2]
    assert validate_layer_ids((1,), 1) == [1]


@pytest.mark.parametrize(
    "ids, pattern",
    [
        ([0, 5], r"target\.aux_layer_ids: layer id 5 .*0\.\.4"),
        ([-1], r"target\.aux_layer_ids: layer id -1 .*0\.\.4"),
        ([1, 2, 1], r"target\.aux_layer_ids: layer id 1 is repeated"),
        ([1.0], r"target\.aux_layer_ids: 1\.0 is not an integer"),
        ([True], r"target\.aux_layer_ids: True is not an integer"),
        ([], r"target\.aux_layer_ids: no layer ids"),
    ],
)
def test_validate_layer_ids_errors(ids, pattern):
    with pytest.raises(TargetError, match=pattern):
        validate_layer_ids(ids, 4)


def test_validate_layer_ids_custom_key():
    with pytest.raises(TargetError, match=r"dflash_config\.target_layer_ids"):
        validate_layer_ids([9], 4, key="dflash_config.target_layer_ids")


@pytest.mark.parametrize(
    "L, n, expected",
    [
        # Reference hook ids round(1 + i * (L - 4) / (n - 1)), then + 1 for engine ids.
        (36, 5, [2, 10, 18, 26, 34]),  # Qwen3-8B: hook [1, 9, 17, 25, 33] (step 8)
        (30, 1, [16]),  # n == 1: hook [L // 2] = [15]
        (30, 3, [2, 15, 28]),  # step 13: hook [1, 14, 27]
        (30, 5, [2, 9, 15, 21, 28]),  # step 6.5: 1, round(7.5)=8, 14, round(20.5)=20 (half to even), 27
        (6, 3, [2, 3, 4]),  # step 1: hook [1, 2, 3]
        (1, 1, [1]),  # hook [0]: the only decoder layer's output = engine id L
    ],
)
def test_dflash_layer_ids_are_engine_ids(L, n, expected):
    assert dflash_layer_ids(L, n) == expected
    assert engine_ids_to_dflash(expected, L) == [i - 1 for i in expected]


def test_dflash_layer_ids_refusals():
    with pytest.raises(TargetError, match=r"target\.aux_layer_ids: a 5-layer target has only 2 DFlash default layers"):
        dflash_layer_ids(5, 3)  # hook 1..2 holds only 2 ids
    with pytest.raises(TargetError, match=r"count 0 must be an integer >= 1"):
        dflash_layer_ids(30, 0)


def test_dflash_layer_ids_distinct_and_in_range_for_every_size():
    for L in range(1, 80):
        for n in range(1, max(L - 2, 2)):
            ids = dflash_layer_ids(L, n)
            assert len(ids) == len(set(ids)) == n and all(1 <= i <= L for i in ids), (L, n, ids)


def test_dflash_id_conversions():
    assert dflash_ids_to_engine([1, 9, 17, 25, 33]) == [2, 10, 18, 26, 34]
    assert dflash_ids_to_engine([0]) == [1]
    assert engine_ids_to_dflash([2, 10, 18, 26, 34], 36) == [1, 9, 17, 25, 33]
    assert engine_ids_to_dflash([36, 1], 36) == [35, 0]  # order kept; id L = output of the last layer
    assert engine_ids_to_dflash(dflash_ids_to_engine([4, 0, 7]), 8) == [4, 0, 7]
    with pytest.raises(TargetError, match=r"^target\.aux_layer_ids: layer id 0 \(the embeddings\) in \[0, 3\] has no "
                                          r"DFlash target_layer_ids equivalent; DFlash reads decoder-layer outputs, "
                                          r"ids 1\.\.6: replace 0 with an id in 1\.\.6$"):
        engine_ids_to_dflash([0, 3], 6)
    with pytest.raises(TargetError, match=r"target\.aux_layer_ids: layer id 7 is out of range; valid ids are 0\.\.6"):
        engine_ids_to_dflash([7], 6)
    with pytest.raises(TargetError, match=r"dflash_config\.target_layer_ids: -1 is not a decoder-layer index"):
        dflash_ids_to_engine([-1])
    with pytest.raises(TargetError, match=r"dflash_config\.target_layer_ids: True is not"):
        dflash_ids_to_engine([True])


# ---------------------------------------------------------------- shift
def test_shift_left_int_bool_and_dims():
    x = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]])
    assert shift_left(x).tolist() == [[2, 3, 4, 0], [6, 7, 8, 0]]
    assert shift_left(x, 2).tolist() == [[3, 4, 0, 0], [7, 8, 0, 0]]
    assert shift_left(x, 4).tolist() == [[0] * 4] * 2
    assert shift_left(x, 0).tolist() == x.tolist()
    b = torch.tensor([[True, False, True]])
    out = shift_left(b)
    assert out.dtype == torch.bool and out.tolist() == [[False, True, False]]
    # Along the last dim of a 3-D tensor; the input is untouched.
    y = torch.arange(6.0).reshape(1, 2, 3)
    assert shift_left(y, dim=-1).tolist() == [[[1.0, 2.0, 0.0], [4.0, 5.0, 0.0]]]
    assert y.tolist() == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]]


# ---------------------------------------------------------------- EAGLE-3 supervision
def _hand_batch():
    """B=1, S=5, V=5, draft vocab = target ids [0, 2, 3] (ids 1 and 4 are outside it)."""
    input_ids = torch.tensor([[10, 11, 12, 13, 14]])
    loss_mask = torch.tensor([[1, 1, 0, 1, 1]])
    logits = torch.tensor(
        [
            [
                [0.0, 0.0, 0.0, 0.0, 7.0],  # pos 0: shifted away entirely
                [LN(4), 0.0, 0.0, LN(2), 0.0],  # pos 1: argmax 0 (in draft); draft [4, 1, 2] / 7
                [0.0, 0.0, LN(3), 0.0, 0.0],  # pos 2: argmax 2 (in draft), but loss_mask[2] = 0
                [0.0, 5.0, 0.0, 0.0, 0.0],  # pos 3: argmax 1 is OUT of the draft vocab
                [LN(3), 0.0, 0.0, LN(6), 0.0],  # pos 4: argmax 3 (in draft); draft [3, 1, 6] / 10
            ]
        ]
    )
    aux = torch.arange(1 * 5 * 2 * 3, dtype=torch.float32).reshape(1, 5, 2, 3)
    batch = Batch(input_ids, torch.ones_like(input_ids), loss_mask)
    return batch, Features(aux_hidden=aux, logits=logits)


def test_eagle3_supervision_hand_numbers():
    batch, feats = _hand_batch()
    sup = eagle3_supervision(batch, feats, torch.tensor([0, 2, 3]))
    # Aux states are NOT shifted: slot t keeps the state after token t.
    assert torch.equal(sup.aux_hidden, feats.aux_hidden)
    # Ids and loss mask shift left by one with a zero tail.
    assert sup.input_ids.tolist() == [[11, 12, 13, 14, 0]]
    assert sup.loss_mask.tolist() == [[1, 0, 1, 1, 0]]
    expected = torch.tensor(
        [
            [
                [4 / 7, 1 / 7, 2 / 7],  # slot 0 <- logits at pos 1
                [1 / 5, 3 / 5, 1 / 5],  # slot 1 <- pos 2
                [1 / 3, 1 / 3, 1 / 3],  # slot 2 <- pos 3 (draft columns all 0)
                [3 / 10, 1 / 10, 6 / 10],  # slot 3 <- pos 4
                [0.0, 0.0, 0.0],  # slot 4: zero tail
            ]
        ]
    )
    assert sup.target_probs.dtype == torch.float32
    torch.testing.assert_close(sup.target_probs, expected, atol=1e-6, rtol=0)
    # slot 1: loss mask 0; slot 2: target argmax (id 1) outside the draft vocab; slot 4: tail.
    assert sup.position_mask.dtype == torch.bool
    assert sup.position_mask.tolist() == [[True, False, False, True, False]]


def test_eagle3_supervision_full_vocab():
    batch, feats = _hand_batch()
    sup = eagle3_supervision(batch, feats, None)
    e5 = math.exp(5.0)
    torch.testing.assert_close(sup.target_probs[0, 2], torch.tensor([1, e5, 1, 1, 1]) / (e5 + 4))
    torch.testing.assert_close(sup.target_probs[0, 0], torch.tensor([4, 1, 1, 2, 1]) / 9.0)
    assert sup.target_probs[0, 4].tolist() == [0.0] * 5
    # With the full vocab only the (shifted) loss mask gates positions.
    assert sup.position_mask.tolist() == [[True, False, True, True, False]]


def test_eagle3_supervision_matches_plain_loop_reference():
    torch.manual_seed(0)
    B, S, V, n, H = 2, 6, 7, 3, 4
    logits = torch.randn(B, S, V, dtype=torch.bfloat16) * 3
    ids = torch.randint(0, V, (B, S))
    loss_mask = torch.randint(0, 2, (B, S))
    draft_ids = torch.tensor([1, 3, 4, 6])
    batch = Batch(ids, torch.ones_like(ids), loss_mask)
    sup = eagle3_supervision(batch, Features(torch.randn(B, S, n, H), logits), draft_ids)
    for b in range(B):
        for t in range(S):
            if t + 1 < S:
                row = logits[b, t + 1].float()
                ref = [math.exp(row[d]) for d in draft_ids.tolist()]
                ref = torch.tensor([r / sum(ref) for r in ref])
                top = int(max(range(V), key=lambda v: (row[v], -v)))
                keep = bool(loss_mask[b, t + 1]) and top in draft_ids.tolist()
                nxt, lm = int(ids[b, t + 1]), int(loss_mask[b, t + 1])
            else:
                ref, keep, nxt, lm = torch.zeros(len(draft_ids)), False, 0, 0
            # bf16 logits: the probs are stored in bf16 (supervision/head.py probs_dtype), each rounded by <= 2^-8 of itself
            assert sup.target_probs.dtype == torch.bfloat16
            torch.testing.assert_close(sup.target_probs[b, t].float(), ref, atol=1e-6, rtol=2 ** -8)
            assert bool(sup.position_mask[b, t]) == keep
            assert int(sup.input_ids[b, t]) == nxt and int(sup.loss_mask[b, t]) == lm


def test_eagle3_supervision_needs_logits():
    batch, feats = _hand_batch()
    with pytest.raises(TargetError, match="logits=True"):
        eagle3_supervision(batch, Features(feats.aux_hidden, None), None)


# ---------------------------------------------------------------- DFlash supervision
def test_dflash_supervision_is_unshifted():
    batch, feats = _hand_batch()
    sup = dflash_supervision(batch, feats)
    assert isinstance(sup, DFlashSupervision)
    # Nothing moves: position t keeps the state after token t, token t and its loss mask.
    assert sup.aux_hidden is feats.aux_hidden
    assert sup.input_ids.dtype == torch.int64 and sup.input_ids.tolist() == [[10, 11, 12, 13, 14]]
    assert sup.loss_mask.tolist() == [[1, 1, 0, 1, 1]]
    assert torch.equal(sup.input_ids, batch.input_ids) and torch.equal(sup.loss_mask, batch.loss_mask)
    # Logits are not part of this kind; features without them work.
    again = dflash_supervision(batch, Features(feats.aux_hidden, None))
    assert torch.equal(again.aux_hidden, sup.aux_hidden) and not hasattr(again, "logits")


def test_dflash_kd_supervision_keeps_the_last_state_unshifted_in_its_dtype():
    batch, feats = _hand_batch()
    last = torch.randn(1, 5, 3).to(torch.bfloat16)  # (B, S, H) the state at id L
    sup = dflash_kd_supervision(batch, Features(feats.aux_hidden, None), last)  # no logits needed or read
    assert isinstance(sup, DFlashKDSupervision)
    assert sup.last_hidden is last and sup.last_hidden.dtype == torch.bfloat16  # not upcast, not copied
    assert torch.equal(sup.aux_hidden, feats.aux_hidden) and not hasattr(sup, "logits")
    assert sup.input_ids.tolist() == [[10, 11, 12, 13, 14]] and sup.loss_mask.tolist() == [[1, 1, 0, 1, 1]]


def test_dflash_kd_supervision_needs_the_last_state():
    batch, feats = _hand_batch()
    with pytest.raises(TargetError, match=r"dflash_kd supervision needs last_hidden, the target's \(B, S, H\) state "
                                          r"at layer id L, not features\.logits; build it with targets\.supervision_for"):
        dflash_kd_supervision(batch, feats)  # features.logits alone are not enough


def test_supervision_for_hands_dflash_kd_the_layer_L_state_and_no_logits():
    import types

    from draftsmith.targets import supervision_for
    from draftsmith.targets.contract import TargetHead

    batch, _ = _hand_batch()
    calls = []

    class Engine:  # a fake engine over a 4-layer target: the state at id i is i everywhere
        def info(self):
            return types.SimpleNamespace(num_layers=4, rms_norm_eps=1e-6)

        def target_head(self):
            return TargetHead.from_weights(torch.ones(3), torch.ones(5, 3), 1e-6)

        def features(self, b, ids, *, logits):
            calls.append((list(ids), logits))
            return Features(torch.tensor(ids, dtype=torch.float32)[None, None, :, None].expand(1, 5, len(ids), 3))

    kd = supervision_for(Engine(), "dflash_kd", batch, [1, 3], None)
    assert calls == [([1, 3, 4], False)]  # id L asked for beside the draft's ids, no (B, S, V) logits
    assert kd.aux_hidden.shape == (1, 5, 2, 3) and kd.aux_hidden[0, 0, :, 0].tolist() == [1.0, 3.0]
    assert kd.last_hidden.shape == (1, 5, 3) and bool((kd.last_hidden == 4.0).all()) and not hasattr(kd, "logits")
    kd = supervision_for(Engine(), "dflash_kd", batch, [4, 2], None)  # the draft reads id L: asked for once
    assert calls[-1] == ([4, 2], False) and kd.aux_hidden.shape[2] == 2 and bool((kd.last_hidden == 4.0).all())


def test_dflash_supervision_refuses_features_of_another_batch():
    batch, feats = _hand_batch()
    with pytest.raises(TargetError, match=r"dflash supervision: features\.aux_hidden has shape \(1, 4, 2, 3\), "
                                          r"the batch is \(1, 5\)"):
        dflash_supervision(batch, Features(feats.aux_hidden[:, :4], None))
    with pytest.raises(TargetError, match=r"dflash_kd supervision: last_hidden has shape \(1, 3, 3\)"):
        dflash_kd_supervision(batch, feats, torch.zeros(1, 3, 3))


@pytest.mark.parametrize("kind, cls, logits, names", [
    ("dflash", DFlashSupervision, False, ("aux_hidden", "input_ids", "loss_mask")),
    ("dflash_kd", DFlashKDSupervision, True, ("aux_hidden", "input_ids", "loss_mask", "last_hidden")),
])
def test_dflash_kinds_round_trip_through_tensors(kind, cls, logits, names):
    from draftsmith.targets.contract import supervision_kind, supervise, supervision_from_tensors, supervision_tensors

    k = supervision_kind(kind)
    assert k.cls is cls and k.logits is logits and k.vocab is False and k.tensor_names == names
    assert k.last is (kind == "dflash_kd")
    batch, feats = _hand_batch()
    last = {"last_hidden": torch.randn(1, 5, 3)} if k.last else {}  # the state at id L: dflash_kd's teacher
    sup = supervise(kind, batch, feats, torch.tensor([0, 2, 3]), **last)  # a vocab-free kind ignores the map
    ref = k.build(batch, feats, **last)
    tensors = supervision_tensors(sup)
    assert tuple(tensors) == names
    back = supervision_from_tensors(kind, {n: t.clone() for n, t in tensors.items()})
    assert type(back) is cls
    for name, t in supervision_tensors(ref).items():
        assert getattr(back, name).dtype == t.dtype and torch.equal(getattr(back, name), t), name
    with pytest.raises(TargetError, match=rf"{kind} supervision: got tensors .*expected \['aux_hidden'"):
        supervision_from_tensors(kind, {**tensors, "target_probs": sup.aux_hidden})


# ---------------------------------------------------------------- supervision kinds, layer-id rules
def test_supervision_table_names_the_wire_tensors():
    from dataclasses import fields

    from draftsmith.targets.contract import supervision_kind
    from draftsmith.drafts.eagle_supervision import Eagle3Supervision

    kind = supervision_kind("eagle3")
    assert kind.cls is Eagle3Supervision and kind.logits and kind.vocab
    assert kind.tensor_names == tuple(f.name for f in fields(Eagle3Supervision)) == \
        ("aux_hidden", "input_ids", "loss_mask", "target_probs", "position_mask")


def test_supervise_round_trips_through_tensors_and_rejects_bad_names():
    from draftsmith.targets.contract import supervise, supervision_from_tensors, supervision_tensors

    batch, feats = _hand_batch()
    sup = supervise("eagle3", batch, feats, torch.tensor([0, 2, 3]))
    ref = eagle3_supervision(batch, feats, torch.tensor([0, 2, 3]))
    back = supervision_from_tensors("eagle3", supervision_tensors(sup))
    for name, t in supervision_tensors(ref).items():
        assert torch.equal(getattr(back, name), t), name
    with pytest.raises(TargetError, match=r"eagle3 supervision: got tensors .*expected \['aux_hidden'"):
        supervision_from_tensors("eagle3", {"aux_hidden": sup.aux_hidden})
    with pytest.raises(TargetError, match=r"supervision kind 'medusa' is unknown; "
                                          r"expected one of \['dflash', 'dflash_kd', 'eagle3'\]"):
        supervise("medusa", batch, feats, None)


def test_default_layer_ids_by_rule():
    from draftsmith.targets.contract import default_layer_ids

    assert default_layer_ids("eagle3", 30) == default_aux_layer_ids(30) == [2, 15, 27]
    assert default_layer_ids("dflash", 30, 5) == dflash_layer_ids(30, 5) == [2, 9, 15, 21, 28]
    assert default_layer_ids("dflash", 30) == [16]  # no count: one layer
    with pytest.raises(TargetError, match="layer-id rule 'medusa' is unknown"):
        default_layer_ids("medusa", 30)
