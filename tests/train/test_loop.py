"""End-to-end training on a tiny Llama target built in the test (head_dim 32)."""

import json
import math
import os

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from draftsmith.data.dataset import Example
from draftsmith.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from draftsmith.train.loop import Cosine, Trainer, train
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

SUBJECTS = ["cat", "dog", "sea", "fox", "spider", "France", "Paris", "mouse", "tide", "gull", "wind", "computer"]


def write_chats(path, n=24):
    rows = []
    for i in range(n):
        a, b = SUBJECTS[i % len(SUBJECTS)], SUBJECTS[(3 * i + 1) % len(SUBJECTS)]
        rows.append({"messages": [
            {"role": "user", "content": f"Tell me about the {a} and the {b}."},
            {"role": "assistant", "content": f"The {a} is quick and the {b} is lazy. The {a} jumps over the {b}."},
        ]})
    return write_jsonl(path, rows)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    data = write_chats(root / "chats.jsonl")
    return target, data


# P-EAGLE on the tiny chatml target: mask token 5 (<|start_header_id|>) never occurs in chatml text.
PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}
DRAFTS = {"eagle3": {}, "peagle": PEAGLE}


def run_config(target, data, out, draft=None, **train):
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 4, "draft_vocab_size": 96},
        "draft": {"ttt_steps": 3, **(draft or {})},
        "train": {"epochs": 3, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "log_every": 1, **train},
        "output": {"dir": str(out), "tensorboard": False},
    })


def test_lr_schedule_warmup_then_cosine():
    f = Cosine(warmup=4, total=12, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == pytest.approx(1.0)
    assert f(8) == pytest.approx(0.1 + 0.9 * 0.5)  # half-way through the cosine
    assert f(12) == pytest.approx(0.1) and f(20) == pytest.approx(0.1)


def test_schedule_refit_keeps_the_lr_continuous_and_fits_the_time_budget():
    from types import SimpleNamespace

    f = Cosine(warmup=4, total=12, min_ratio=0.1)
    assert f(8) == pytest.approx(0.55)  # p = 0.5
    f.refit(8, 10)  # from step 8 (p 0.5) the rest of the cosine is squeezed into 2 steps
    assert f(8) == pytest.approx(0.55)  # no jump at the refit step
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75)))  # p = 0.5 + 0.5 * 1/2
    assert f(10) == pytest.approx(0.1) and f(30) == pytest.approx(0.1)
    f.refit(9, 100)  # a longer budget later: the LR holds and keeps falling, it never climbs back
    assert f(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.75)))
    assert f(10) < f(9) and f(100) == pytest.approx(0.1)
    g = Cosine(warmup=4, total=12, min_ratio=0.1)
    g.refit(2, 8)  # during warmup: warmup unchanged, the cosine starts at step 4 and ends at 8
    assert g(2) == pytest.approx(0.75) and g(6) == pytest.approx(0.55) and g(8) == pytest.approx(0.1)

    sched = Cosine(warmup=5, total=1000, min_ratio=0.1)
    fake = SimpleNamespace(cfg=SimpleNamespace(train=SimpleNamespace(max_time_s=100.0, warmup_steps=5)),
                           step=25, total_steps=1000, schedule=sched)
    Trainer.fit_schedule(fake, elapsed=50.0, done=25)  # 2 s/step, 50 s left -> 25 more steps
    assert sched.end == 50 and sched.anchor_step == 25
    fake.step, fake.total_steps = 50, 60
    Trainer.fit_schedule(fake, elapsed=50.0, done=50)  # 50 more would fit, the data has 10 left
    assert sched.end == 60 and sched.anchor_step == 50
    fake.step = 51
    Trainer.fit_schedule(fake, elapsed=99.0, done=51)  # only every 25 steps
    assert sched.end == 60 and sched.anchor_step == 50


@pytest.mark.slow
def test_train_loss_falls_and_checkpoint_matches_design(tiny, tmp_path):
    target, data = tiny
    res = train(run_config(target, data, tmp_path / "run", save_every=5), progress=False)
    losses = [loss for _, loss in res.history]
    assert res.step == 30  # 20 train rows / batch 2 * 3 epochs
    # soft CE is floored by the target's entropy (~4 nats here), so compare absolute drops
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5, losses
    assert res.eval["simulated_tau"] >= 1.0 and len(res.eval["step_accuracy"]) == 3

    root = tmp_path / "run" / "checkpoints"
    assert (root / "LATEST").is_symlink() and latest_checkpoint(root) == res.checkpoint
    assert res.checkpoint.name == "epoch_2_step_30"
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "LATEST", "epoch_0_step_10", "epoch_0_step_5", "epoch_1_step_15", "epoch_1_step_20",
        "epoch_2_step_25", "epoch_2_step_30"]
    cons = res.checkpoint / "model" / "consolidated"
    assert sorted(os.listdir(cons)) == ["config.json", "model.safetensors"]
    for f in ("optim.pt", "rng.pt", "meta.json", "config.yaml", "vocab.safetensors"):
        assert (res.checkpoint / f).is_file()

    # docs/reference/layouts.md, key for key
    weights = load_file(str(cons / "model.safetensors"))
    assert sorted(weights) == sorted([
        "model.embed_tokens.weight", "model.fc.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.hidden_norm.weight",
        "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
        "model.layers.0.self_attn.v_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.down_proj.weight", "model.norm.weight", "lm_head.weight", "d2t", "t2d"])
    V = len(make_tokenizer("chatml"))
    assert weights["model.fc.weight"].shape == (64, 3 * 64)
    assert weights["model.layers.0.self_attn.q_proj.weight"].shape == (64, 128)  # 2H input
    assert weights["lm_head.weight"].shape == (96, 64)
    assert weights["d2t"].dtype == torch.int64 and weights["d2t"].shape == (96,)
    assert weights["t2d"].dtype == torch.bool and weights["t2d"].shape == (V,)
    # d2t and t2d describe the same selection: target = draft + d2t[draft]
    assert torch.equal(torch.arange(96) + weights["d2t"], weights["t2d"].nonzero().squeeze(1))
    cfg = json.loads((cons / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaEagle3DraftModel"]
    expected = {"draft_vocab_size": 96, "target_hidden_size": 64, "tie_word_embeddings": False,
                "num_hidden_layers": 1, "vocab_size": V, "hidden_size": 64, "head_dim": 32,
                "num_attention_heads": 2, "num_key_value_heads": 1}
    assert {k: cfg[k] for k in expected} == expected
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    meta = json.loads((res.checkpoint / "meta.json").read_text())
    assert meta["step"] == 30 and meta["aux_layer_ids"] == [1, 3, 4]
    # the frozen embedding is the target's
    from transformers import AutoModelForCausalLM

    tgt = AutoModelForCausalLM.from_pretrained(target)
    assert torch.equal(weights["model.embed_tokens.weight"], tgt.get_input_embeddings().weight.detach())


@pytest.mark.slow
@pytest.mark.parametrize("family", list(DRAFTS))
def test_resume_mid_run_is_bitwise_equal(tiny, tmp_path, family):
    # P-EAGLE's COD sampling draws from torch's global RNG, which every checkpoint saves: the
    # resumed run must draw the same element subsets as the uninterrupted one, or weights drift.
    target, data = tiny
    draft = DRAFTS[family]
    full = train(run_config(target, data, tmp_path / "full", draft, save_every=7, epochs=2), progress=False)
    mid = tmp_path / "full" / "checkpoints" / "epoch_0_step_7"  # mid-epoch: data position matters
    assert json.loads((mid / "meta.json").read_text())["batch_pos"] == 7
    assert json.loads((mid / "meta.json").read_text())["draft_type"] == family
    resumed = train(run_config(target, data, tmp_path / "resumed", draft, epochs=2), resume=mid, progress=False)
    assert resumed.step == full.step == 20
    a = load_file(str(full.checkpoint / "model" / "consolidated" / "model.safetensors"))
    b = load_file(str(resumed.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert a.keys() == b.keys()
    if family == "peagle":
        assert "mask_hidden" in a and "model.layers.1.mlp.down_proj.weight" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [l for s, l in full.history if s > 7] == [l for _, l in resumed.history]
    # tokens_seen counts from step 0 across the resume: the resumed run's final figure is the full run's
    seen = [json.loads((c / "meta.json").read_text())["tokens_seen"] for c in (full.checkpoint, resumed.checkpoint)]
    mid_seen = json.loads((mid / "meta.json").read_text())["tokens_seen"]
    assert seen[0] == seen[1] == full.tokens == mid_seen + resumed.tokens and 0 < mid_seen < full.tokens
    # A changed data order would make the position point elsewhere: refused by name, before training
    # (a changed batch size is not one: the same order of conversations continues, see test_parallel).
    with pytest.raises(CheckpointError, match=r"data order changed .*\(train.group_by_length False -> True\)"):
        train(run_config(target, data, tmp_path / "other", draft, epochs=2, batch_size=4, group_by_length=True),
              resume=mid, progress=False)
    # This real checkpoint cannot resume a run of the other family: refused by name, before training.
    other = "eagle3" if family == "peagle" else "peagle"
    with pytest.raises(CheckpointError, match=rf"a {family} checkpoint cannot resume a draft.type {other} run"):
        train(run_config(target, data, tmp_path / "other2", DRAFTS[other], epochs=2), resume=mid, progress=False)


def test_save_every_epoch_cuts_a_resumable_checkpoint_at_each_epoch_end(tiny, tmp_path):
    """train.save_every_epoch: epoch_<E>_step_<S> at every epoch's end (20 rows, batch 10: steps 2, 4, 6), once
    for a step save_every also saves (4), the last epoch's by the final save; one resumes where it was cut."""
    target, data = tiny
    full = train(run_config(target, data, tmp_path / "full", batch_size=10, save_every=4, save_every_epoch=True),
                 progress=False)
    root = tmp_path / "full" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "epoch_0_step_2", "epoch_1_step_4", "epoch_2_step_6"]
    assert latest_checkpoint(root) == full.checkpoint == root / "epoch_2_step_6"
    meta = json.loads((root / "epoch_0_step_2" / "meta.json").read_text())
    assert (meta["epoch"], meta["step"], meta["batch_pos"]) == (0, 2, 0)  # epoch 0 whole: the next starts at row 0
    resumed = train(run_config(target, data, tmp_path / "resumed", batch_size=10), resume=root / "epoch_0_step_2",
                    progress=False)
    assert resumed.step == 6 and [l for s, l in full.history if s > 2] == [l for _, l in resumed.history]
    a, b = (load_file(str(r.checkpoint / "model" / "consolidated" / "model.safetensors")) for r in (full, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert build_config({}).train.save_every_epoch is False  # off by default: the final checkpoint only


@pytest.mark.slow
def test_trailing_partial_window_equals_one_full_batch(tiny, tmp_path):
    target, data = tiny
    trainer = Trainer(run_config(target, data, tmp_path / "acc", grad_accum=4, max_grad_norm=0.0), progress=False)
    g = torch.Generator().manual_seed(0)
    # Equal lengths and equal supervised counts, so per-micro-batch normalisation equals the batch's.
    rows = [Example(torch.randint(20, 300, (24,), generator=g).tolist(), [0] * 8 + [1] * 16) for _ in range(2)]
    grads = []

    def capture():
        grads.append({n: p.grad.clone() for n, p in trainer.draft.named_parameters() if p.grad is not None})

    trainer.optimizer.step = capture
    trainer.train_window([[rows[0]], [rows[1]]])  # a trailing window of 2 micro-batches (accum 4)
    trainer.train_window([[rows[0], rows[1]]])  # one batch holding the same rows
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for n in grads[0]:
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-7, msg=n)


def test_depth_curriculum_follows_the_steps_the_run_plans(tiny, tmp_path, monkeypatch):
    # draft.ttt_ramp_fraction 0.5 over 3 TTT steps: depth 1 + floor(4 p), p = step / planned end. A 30-step
    # run trains steps 0-7 at 1 TTT step, 8-14 at 2, 15-29 at 3 (hand-counted), held-out evals at all 3.
    from draftsmith.drafts.eagle3.model import Eagle3Draft

    target, data = tiny
    seen = []
    forward = Eagle3Draft.forward

    def spy(self, *args, **kw):
        out = forward(self, *args, **kw)
        seen.append((self.training, len(out.step_losses)))
        return out

    monkeypatch.setattr(Eagle3Draft, "forward", spy)
    res = train(run_config(target, data, tmp_path / "ramp", {"ttt_ramp_fraction": 0.5}, eval_every=10), progress=False)
    assert res.step == 30
    assert [n for training, n in seen if training] == [1] * 8 + [2] * 7 + [3] * 15
    assert {n for training, n in seen if not training} == {3}
    assert len(res.eval["step_accuracy"]) == 3 and res.eval["step_accuracy"][2] > 0
    # A time-bound run plans fewer steps than its epochs hold: the depth follows the cosine's end (what
    # train.max_time_s is expected to reach), not the epochs' 30 steps, or a budget run would never deepen.
    trainer = Trainer(run_config(target, data, tmp_path / "budget", {"ttt_ramp_fraction": 0.5}), progress=False)
    try:
        trainer.schedule.refit(0, 8)  # what fit_schedule sets when the budget buys 8 steps
        trainer.step = 4  # p = 4 / 8 = 0.5: the full unroll (4 / 30 would still be 1 step)
        window = [trainer.train_set[:2]]
        trainer.train_window(window)
        assert trainer.draft.depth == 3
    finally:
        trainer.engine.close()


def test_held_out_metrics_count_every_loss_position_and_report_coverage(tiny, tmp_path, capsys):
    # A 24-token draft vocab chosen on the train split: some held-out targets fall outside it. The
    # held-out metrics still count every loss position (draft-vocab misses included), and the setup
    # line gives the held-out split's coverage next to the train split's.
    target, data = tiny
    cfg = run_config(target, data, tmp_path / "cov")
    cfg.data.draft_vocab_size = 24
    trainer = Trainer(cfg, progress=False)
    try:
        t2d = trainer.vocab.t2d
        held = [t for ex in trainer.eval_set for t, m in zip(ex.input_ids, ex.loss_mask) if m]
        expected = sum(bool(t2d[t]) for t in held) / len(held)  # counted token by token
        assert 0 < expected < 1 and trainer.held_out_coverage == pytest.approx(expected)
        setup = next(line for line in trainer.describe() if line.startswith("setup:"))
        assert f"(coverage {trainer.vocab.coverage:.3f} train, {expected:.3f} held-out)" in setup
        sups = [sup for _, sup in trainer.supervise([trainer.eval_set])]
        assert sum(int(x.position_mask.sum()) for x in sups) < sum(int(x.loss_mask.sum()) for x in sups)
        metrics = trainer.evaluate()
        # eagle3 supervision shifts the loss mask left by one: slot t is scored on token t+1's mask;
        # the old denominator (position_mask) left out the targets outside the draft vocab
        assert metrics["positions"] == sum(sum(ex.loss_mask[1:]) for ex in trainer.eval_set)
        assert metrics["draft_vocab_coverage"] == pytest.approx(expected)
        assert len(metrics["conditional_acceptance"]) == len(metrics["step_accuracy"]) == 3
        assert metrics["conditional_acceptance"][0] == pytest.approx(metrics["prefix_rate"][0])
    finally:
        trainer.engine.close()


def test_truncated_checkpoint_is_refused(tmp_path):
    ck = tmp_path / "epoch_0_step_5"
    (ck / "model" / "consolidated").mkdir(parents=True)
    (ck / "model" / "consolidated" / "config.json").write_text("{}")
    with pytest.raises(CheckpointError, match="incomplete .*model.safetensors"):
        load_checkpoint(ck)
