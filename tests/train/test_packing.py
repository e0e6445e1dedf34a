"""data.packing: conversations packed into rows of the draft's supervision give the loss, metrics and
gradients of the same conversations one per row, with less padding; a packed run trains the weights an
unpacked one does and resumes bitwise."""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.data.advice import data_seen
from draftsmith.config import build_config
from draftsmith.targets import Batch, Features
from draftsmith.targets.contract import supervision_to
from draftsmith.drafts.eagle_supervision import Eagle3Supervision, eagle3_supervision
from draftsmith.train.loop import train
from draftsmith.train.packing import pack, packed_class, padding, plan_rows
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "drafts"))
from test_eagle3 import HT, V, VD, make_draft  # noqa: E402

pytestmark = pytest.mark.usefixtures("restore_threads")

LENGTHS = [7, 5, 9]  # three conversations, right-padded to S = 9 unpacked


def test_plan_rows_minimise_the_positions():
    assert plan_rows([7, 5, 9], 14) == [[0, 1], [2]]
    assert plan_rows([7, 5, 9], 21) == [[0, 1, 2]]
    assert plan_rows([9, 7, 5, 2], 12) == [[0, 3], [1, 2]]  # the 2 fits beside the 9: first fit, not next fit
    assert plan_rows([20, 3], 8) == [[0], [1]]  # longer than a row: a row of its own
    # 3 + 1 in rows of 128 would pad 1 row of 114 in 2; the narrowest 2 rows are 2 + 2 (76 positions each)
    assert plan_rows([38, 37, 39, 36], 128) == [[0, 1], [2, 3]]
    # equal lengths have no padding to remove: the rows stay short (a longer row only costs attention)
    assert plan_rows([30, 30, 30], 128) == [[0], [1], [2]] and plan_rows([64, 64, 64], 128) == [[0], [1], [2]]
    pad = padding([[7, 5, 9], [4]], 14)
    assert (pad.real, pad.unpacked, pad.packed, pad.conversations, pad.packed_rows, pad.batches) == \
        (25, 27 + 4, 2 * 12 + 4, 4, 3, 2)
    assert pad.packed_fraction < pad.unpacked_fraction
    assert "data: padding 10.7% of the draft's positions packed (1.3 conversations per row), 19.4% unpacked" \
        in pad.describe(True, True)
    assert pad.describe(False, True) == ("data: padding 19.4% of the draft's positions (data.packing off; "
                                         "data.packing would make it 10.7%; 2 micro-batches of epoch 0)")
    assert pad.describe(False, False) == "data: padding 19.4% of the draft's positions (data.packing off; " \
                                         "2 micro-batches of epoch 0)"


def supervision(seed=0):
    """eagle3 supervision of 3 right-padded conversations, as an engine builds it (random aux and logits;
    pads hold junk, as an engine's may)."""
    g = torch.Generator().manual_seed(seed)
    b, s = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(0, V, (b, s), generator=g)
    attn = torch.zeros(b, s, dtype=torch.long)
    loss = torch.zeros(b, s, dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        attn[i, :n] = 1
        loss[i, 2:n] = 1  # a 2-token prompt, then the answer
        ids[i, n:] = 3  # pad id
    batch = Batch(ids, attn, loss)
    feats = Features(aux_hidden=torch.randn(b, s, 3, HT, generator=g) * 3,
                     logits=torch.randn(b, s, V, generator=g) * 3)
    return batch, eagle3_supervision(batch, feats, torch.arange(VD))  # VD < V: some targets outside


def run(sup, blocked, flags):
    d = make_draft(seed=11, **flags)
    if blocked:  # one or two query rows per attention block, 3 rows per CE block, each TTT step recomputed
        d.max_score_elements, d.max_logit_elements = 2 * 2 * 21, 3 * VD
        d.activation_checkpointing = True
    out = d.supervised(sup)
    out.loss.backward()
    return out, {n: p.grad for n, p in d.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("capacity,rows", [(14, 2), (21, 1)])
@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("flags", [{}, dict(fc_norm=True, norm_output=True, norm_before_residual=True)])
def test_packed_equals_unpacked_loss_metrics_and_gradients(capacity, rows, blocked, flags):
    batch, sup = supervision()
    packed = pack(sup, batch.attention_mask.sum(1).tolist(), capacity)
    assert isinstance(packed, Eagle3Supervision) and packed.input_ids.shape[0] == rows
    assert int((packed.doc_ids >= 0).sum()) == sum(LENGTHS) and packed.input_ids.numel() < sup.input_ids.numel()
    ref, ref_grads = run(sup, False, flags)
    got, grads = run(packed, blocked, flags)
    torch.testing.assert_close(got.loss.detach(), ref.loss.detach(), rtol=1e-5, atol=0)
    torch.testing.assert_close(got.step_losses, ref.step_losses, rtol=1e-5, atol=1e-7)
    for name in ("step_correct", "prefix_correct", "step_count"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    assert torch.equal(got.parts.den, ref.parts.den)
    assert grads.keys() == ref_grads.keys() and grads
    for n in grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_packed_rows_layout():
    batch, sup = supervision(seed=1)
    p = pack(sup, [7, 5, 9], 14)
    assert p.doc_ids.tolist() == [[0] * 7 + [1] * 5, [2] * 9 + [-1] * 3]  # as wide as the fullest row
    assert torch.equal(p.input_ids[0, 7:12], sup.input_ids[1, :5]) and torch.equal(p.aux_hidden[1, :9], sup.aux_hidden[2])
    assert not p.loss_mask[1, 9:].any() and not p.position_mask[1, 9:].any() and not p.target_probs[1, 9:].any()
    moved = supervision_to(p, "meta")  # every field, doc_ids included, travels with the supervision
    assert type(moved) is packed_class(Eagle3Supervision) and moved.doc_ids.device.type == "meta"


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    words = ["cat", "dog", "sea", "fox", "spider", "France", "Paris", "mouse", "tide", "gull"]
    rows = []  # 1-4 answer sentences: conversations of 30-80 tokens, so a micro-batch pads unpacked
    for i in range(20):
        a, b = words[i % 10], words[(3 * i + 1) % 10]
        answer = " ".join([f"The {a} is quick and the {b} is lazy."] * (1 + (7 * i) % 4))
        rows.append({"messages": [{"role": "user", "content": f"Tell me about the {a} and the {b}."},
                                  {"role": "assistant", "content": answer}]})
    return target, write_jsonl(root / "chats.jsonl", rows)


# P-EAGLE's section: mask token 5 (<|start_header_id|>, never in chatml text), K = 3
PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}


def run_config(tiny, out, packing, draft=None, **train_over):
    return build_config(raw_config(tiny, out, packing, draft, **train_over))


def raw_config(tiny, out, packing, draft=None, **train_over):
    target, data = tiny
    return {
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 256, "eval_size": 4, "draft_vocab_size": 96,
                 "packing": packing},
        "draft": draft or {"ttt_steps": 3},
        "train": {"epochs": 1, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1, "num_threads": 1, "seed": 3,
                  **train_over},
        "output": {"dir": str(out), "tensorboard": False},
    }


def final_weights(res):
    return load_file(str(res.checkpoint / "model" / "consolidated" / "model.safetensors"))


@pytest.mark.slow
def test_packed_run_trains_the_unpacked_weights_with_less_padding(tiny, tmp_path):
    lines = {True: [], False: []}
    res = {p: train(run_config(tiny, tmp_path / str(p), p), progress=False, announce=lines[p].append)
           for p in (False, True)}
    off, on = res[False], res[True]
    assert on.step == off.step == 4 and on.tokens == off.tokens
    assert on.padding < off.padding / 2 and off.padding > 0.1, (on.padding, off.padding)
    pad_on = next(line for line in lines[True] if line.startswith("data: padding"))
    pad_off = next(line for line in lines[False] if line.startswith("data: padding"))
    assert "packed" in pad_on and "(data.packing on; 4 micro-batches of epoch 0)" in pad_on
    assert "(data.packing off; data.packing would make it" in pad_off
    for (_, a), (_, b) in zip(off.history, on.history):
        assert b == pytest.approx(a, rel=1e-5)
    assert on.eval["loss"] == pytest.approx(off.eval["loss"], rel=1e-5)
    assert on.eval["positions"] == off.eval["positions"] and on.eval["step_accuracy"] == off.eval["step_accuracy"]
    a, b = final_weights(off), final_weights(on)
    # atol 1e-5: AdamW turns float noise in a near-zero gradient element (m / (sqrt(v) + eps), eps 1e-8) into
    # up to ~6e-6 of weight on some machines (one element of fc and of down_proj on an AVX512 EPYC), still
    # under 0.1% of the 1.2e-2 that 4 steps at lr 3e-3 can move a weight
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)


BLOCK = {"mask_token_id": 5, "block_size": 4, "num_draft_layers": 2, "num_anchors": 4}  # 5: never in chatml text
BLOCK_DRAFTS = {"dflash": {"type": "dflash", **BLOCK}, "jetspec": {"type": "jetspec", **BLOCK, "kd_temperature": 2.0},
                "domino": {"type": "domino", **BLOCK, "emb_dim": 16, "gru_hidden_dim": 8, "lambda_start": 1.0,
                           "lambda_decay_ratio": 0.5}}


def _packed_run_trains_the_unpacked_weights(tiny, tmp_path, draft: dict, eval_keys: tuple, atol: float) -> None:
    """A tiny run packed and unpacked: the same steps and tokens, less padding, the same loss history and
    held-out metrics (rel 1e-5) and final weights (rtol 1e-4, ``atol``)."""
    res = {p: train(run_config(tiny, tmp_path / str(p), p, draft), progress=False) for p in (False, True)}
    off, on = res[False], res[True]
    assert on.step == off.step == 4 and on.tokens == off.tokens and on.padding < off.padding
    for (_, a), (_, b) in zip(off.history, on.history):
        assert b == pytest.approx(a, rel=1e-5)
    assert on.eval["loss"] == pytest.approx(off.eval["loss"], rel=1e-5)
    assert all(on.eval[k] == off.eval[k] for k in eval_keys), eval_keys
    a, b = final_weights(off), final_weights(on)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=atol, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("family", list(BLOCK_DRAFTS))
def test_packed_block_draft_run_trains_the_unpacked_weights(tiny, tmp_path, family):
    """The DFlash family end to end: the trainer's per-conversation generators draw each packed
    document's anchors as its unpacked row's, so the loss history, held-out metrics and weights agree.
    atol 1e-4 (weights ~0.03): Adam divides each gradient by its own running size, so an element whose
    gradient is near 0 turns a rounding-level difference into a step of lr's order (DFlash, 4 steps:
    one k_proj element of 2048 moves 4e-5; every other element agrees to 1e-4 relative)."""
    _packed_run_trains_the_unpacked_weights(tiny, tmp_path, BLOCK_DRAFTS[family], ("positions", "blocks"), 1e-4)


@pytest.mark.slow
def test_packed_peagle_run_trains_the_unpacked_weights(tiny, tmp_path):
    """P-EAGLE's COD draws come from one generator per conversation (train/loop.py row_generators); packed,
    each document draws with its own in its own coordinates, so the run trains the unpacked weights."""
    _packed_run_trains_the_unpacked_weights(tiny, tmp_path, PEAGLE, ("positions", "step_accuracy"), 1e-6)


@pytest.mark.slow
def test_packed_run_resumes_bitwise(tiny, tmp_path):
    full = train(run_config(tiny, tmp_path / "full", True, epochs=2, save_every=3), progress=False)
    mid = tmp_path / "full" / "checkpoints" / "epoch_0_step_3"  # mid-epoch: 12 of 16 conversations done
    assert json.loads((mid / "meta.json").read_text())["row_pos"] == 12
    assert data_seen(json.loads((mid / "meta.json").read_text())) == (16, 0.75)  # what demo/advise quote from
    resumed = train(run_config(tiny, tmp_path / "resumed", True, epochs=2), resume=mid, progress=False)
    assert resumed.step == full.step == 8
    a, b = final_weights(full), final_weights(resumed)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [l for s, l in full.history if s > 3] == [l for _, l in resumed.history]


@pytest.mark.slow
def test_two_ranks_packed_equal_one_rank_unpacked(tiny, tmp_path):
    """DDP over 2 ranks x batch 2, each rank packing its share, reaches the weights of 1 rank x batch 4
    unpacked: packing changes rows, not the conversations a step trains on nor the loss's denominators."""
    from test_parallel import assert_close_weights, torchrun, weights

    one = train(run_config(tiny, tmp_path / "one", False), progress=False)
    out = torchrun(raw_config(tiny, tmp_path / "two", True, batch_size=2, device="cpu"), tmp_path / "two.yaml")
    assert "data.packing on" in out and f"trained {one.step} steps" in out
    assert_close_weights(weights(tmp_path / "one"), weights(tmp_path / "two"), rel=1e-5)
