"""train.keep_best and train.early_stop_patience (train/held_out.py): the checkpoint a run dir resolves to is
the best held-out simulated tau's, a run stops after P evaluations without a better one, and both carry
across a resume."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import ConfigError, build_config
from draftsmith.eval.offline import resolve_draft_dir
from draftsmith.serve.resolve import resolve_draft
from draftsmith.train import held_out
from draftsmith.train.checkpoint import best_checkpoint, latest_checkpoint
from draftsmith.train.held_out import Best
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer
from test_loop import run_config, write_chats


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_best")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    return target, write_chats(root / "chats.jsonl")


def test_best_counts_evaluations_strictly_and_runs_out_of_patience():
    best = Best(keep=True, patience=2)
    seen = [(best.update({"simulated_tau": tau}, step), best.since, best.exhausted)
            for step, tau in [(3, 1.10), (6, 1.30), (9, 1.20), (12, 1.30)]]
    # 1.30 at step 12 ties the best: not better (the earlier, cheaper draft stays), the second miss in a row
    assert seen == [(True, 0, False), (True, 0, False), (False, 1, False), (False, 2, True)]
    assert (best.score, best.step) == (1.30, 6)
    assert Best(patience=0).update({"simulated_tau": 2.0}, 1) is False  # neither knob: nothing compared
    assert Best(keep=True).update({}, 1) is False  # no held-out split: no score, nothing changes
    again = Best.start(build_config({"train": {"keep_best": True, "early_stop_patience": 2, "eval_every": 3}}).train,
                       {"best": best.meta()})
    assert again == best  # what meta.json keeps restores the same state


def test_config_refuses_patience_it_cannot_count(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_config({"train": {"early_stop_patience": 3}})
    assert "'train.early_stop_patience' = 3 counts evaluations, but train.eval_every is 0" in str(e.value)
    with pytest.raises(ConfigError, match=r"'train.early_stop_patience' = -1: expected >= 0"):
        build_config({"train": {"early_stop_patience": -1}})
    with pytest.raises(ConfigError, match=r"compare held-out scores, but data.eval_size is 0"):
        build_config({"data": {"eval_size": 0}, "train": {"keep_best": True}})
    cfg = build_config({})
    assert (cfg.train.keep_best, cfg.train.early_stop_patience) == (False, 0)  # off by default


# held-out simulated tau per evaluation step: best at 6, then two evaluations without a better one
SCRIPT = {3: 1.10, 6: 1.30, 9: 1.20, 12: 1.30, 15: 1.50, 18: 1.50}


@pytest.fixture
def scripted(monkeypatch):
    """The real held-out evaluation, its score replaced by SCRIPT[step], so the run's best is known in advance."""
    real, steps = held_out.evaluate, []

    def evaluate(trainer):
        metrics = real(trainer)
        steps.append(trainer.step)
        return {**metrics, "simulated_tau": SCRIPT.get(trainer.step, 0.0)}

    monkeypatch.setattr(held_out, "evaluate", evaluate)
    return steps


def weights(ckpt):
    return load_file(str(ckpt / "model" / "consolidated" / "model.safetensors"))


def test_keep_best_and_early_stop_through_a_real_run_and_its_resume(tiny, tmp_path, scripted):
    target, data = tiny
    knobs = dict(eval_every=3, keep_best=True, early_stop_patience=2)
    full = train(run_config(target, data, tmp_path / "full", save_every=9, **knobs), progress=False)
    root = tmp_path / "full" / "checkpoints"
    # 20 rows at batch 2: 10 steps an epoch, 30 planned; stopped at the evaluation of step 12, which the
    # final evaluation does not repeat
    assert full.step == 12 and scripted == [3, 6, 9, 12]
    assert best_checkpoint(root) == root / "epoch_0_step_6" and latest_checkpoint(root) == root / "epoch_1_step_12"
    assert full.checkpoint == root / "epoch_1_step_12"
    assert (full.best.score, full.best.step, full.best.checkpoint) == (1.30, 6, str(root / "epoch_0_step_6"))
    assert "stopped early: 2 evaluations without a better one" in full.best.line()
    # the checkpoints say where the best stood when they were cut
    assert json.loads((root / "epoch_0_step_6" / "meta.json").read_text())["best"] == {
        "score": 1.30, "step": 6, "checkpoint": str(root / "epoch_0_step_6"), "since": 0}
    assert json.loads((root / "epoch_0_step_9" / "meta.json").read_text())["best"]["since"] == 1
    # the best draft is another draft than the last one, and a run dir means it for serve/export and eval
    best_w, last_w = weights(root / "epoch_0_step_6"), weights(full.checkpoint)
    assert any(not torch.equal(best_w[k], last_w[k]) for k in best_w)
    assert resolve_draft(tmp_path / "full").dir == root / "epoch_0_step_6" / "model" / "consolidated"
    assert resolve_draft_dir(tmp_path / "full") == root / "epoch_0_step_6" / "model" / "consolidated"

    # Resumed from step 9 (best at 6, one evaluation since): the same stop at 12, bitwise the same draft.
    scripted.clear()
    resumed = train(run_config(target, data, tmp_path / "resumed", **knobs), resume=root / "epoch_0_step_9",
                    progress=False)
    assert resumed.step == 12 and scripted == [12]
    assert all(torch.equal(w, weights(resumed.checkpoint)[k]) for k, w in last_w.items())
    assert resumed.best.checkpoint == str(root / "epoch_0_step_6")  # still the first run's, where it was saved
    assert best_checkpoint(tmp_path / "resumed" / "checkpoints") is None


def test_keep_best_moves_best_with_each_better_evaluation_and_the_final_one(tiny, tmp_path, scripted):
    target, data = tiny
    SCRIPT_FINAL = 2.0  # the final evaluation (step 20) scores above every periodic one
    SCRIPT[20] = SCRIPT_FINAL
    try:
        out = train(run_config(target, data, tmp_path / "run", epochs=2, eval_every=3, keep_best=True),
                    progress=False)
    finally:
        del SCRIPT[20]
    root = tmp_path / "run" / "checkpoints"
    assert out.step == 20 and scripted == [3, 6, 9, 12, 15, 18, 20]  # no patience: the whole run
    # each new best was saved as it came (3, 6, 15; 18 only ties), the final one is both BEST and LATEST
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("epoch")) == [
        "epoch_0_step_3", "epoch_0_step_6", "epoch_1_step_15", "epoch_1_step_20"]
    assert best_checkpoint(root) == latest_checkpoint(root) == out.checkpoint == root / "epoch_1_step_20"
    assert out.best.score == SCRIPT_FINAL


def test_without_the_knobs_nothing_changes(tiny, tmp_path, scripted):
    target, data = tiny
    out = train(run_config(target, data, tmp_path / "plain", epochs=1, eval_every=3), progress=False)
    root = tmp_path / "plain" / "checkpoints"
    assert out.best is None and best_checkpoint(root) is None
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "epoch_0_step_10"]
