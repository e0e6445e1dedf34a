"""EAGLE-3's depth curriculum (draft.ttt_ramp_fraction): the depth by hand, a shallow training forward is
the 1-step draft's, evaluation runs the full unroll, and the metric sums keep their (ttt_steps,) shape."""

import pytest
import torch

from draftsmith.config import ConfigError, build_config
from draftsmith.drafts.eagle3.config import Eagle3DraftConfig, ttt_depth
from draftsmith.drafts.eagle3.model import Eagle3Draft

from test_eagle3 import make_batch, make_cfg


@pytest.mark.parametrize("steps, ramp, step, total, depth", [
    (2, 0.5, 0, 100, 1), (2, 0.5, 49, 100, 1), (2, 0.5, 50, 100, 2), (2, 0.5, 99, 100, 2),
    # 7 steps over 0.6 of the run: one deeper every 0.1 (p 0.15 -> 2, 0.35 -> 4, 0.55 -> 6, 0.6 on -> 7)
    (7, 0.6, 15, 100, 2), (7, 0.6, 35, 100, 4), (7, 0.6, 55, 100, 6), (7, 0.6, 60, 100, 7), (7, 0.6, 100, 100, 7),
    (7, 0.6, 500, 100, 7),  # past the planned end (a run that outlives its estimate): the full unroll
    (7, 0.0, 0, 100, 7), (1, 0.5, 0, 100, 1), (3, 0.5, 0, 0, 3),  # no ramp, nothing to ramp, no plan
])
def test_depth_by_hand(steps, ramp, step, total, depth):
    assert ttt_depth(steps, ramp, step, total) == depth


def test_shallow_training_forward_is_the_one_step_draft_and_eval_is_the_full_unroll():
    torch.manual_seed(0)
    ramped = Eagle3Draft(make_cfg(ttt_steps=3, ttt_ramp_fraction=0.5))
    one, full = Eagle3Draft(make_cfg(ttt_steps=1)), Eagle3Draft(make_cfg(ttt_steps=3))
    one.load_state_dict(ramped.state_dict())
    full.load_state_dict(ramped.state_dict())
    batch = make_batch()
    ramped.train()
    ramped.set_progress(0, 10)  # p = 0: depth 1
    assert ramped.depth == 1
    shallow, single = ramped(*batch), one(*batch)
    torch.testing.assert_close(shallow.loss, single.loss)  # step 0 alone, weight 1
    # (3,) sums: the steps it did not run count no position, so they add to a full step's sums
    assert shallow.step_count.tolist() == [single.step_count.item(), 0, 0]
    assert shallow.prefix_correct.tolist()[1:] == [0, 0] and shallow.simulated_tau == single.simulated_tau
    shallow.loss.backward()  # gradients flow through the one step it ran, into the layer and the head
    for w in (ramped.model.layers[0].self_attn.q_proj.weight, ramped.lm_head.weight):
        assert w.grad is not None and torch.isfinite(w.grad).all() and w.grad.abs().sum() > 0
    ramped.set_progress(4, 10)  # p = 0.4: 1 + floor(0.4 * 2 / 0.5) = 2
    assert ramped.depth == 2 and len(ramped(*batch).step_losses) == 2
    ramped.set_progress(5, 10)  # p = 0.5: the full unroll, the unramped draft's loss
    torch.testing.assert_close(ramped(*batch).loss, full(*batch).loss)
    ramped.eval()
    ramped.set_progress(0, 10)
    with torch.no_grad():  # held-out evaluation measures the draft that is served: all 3 steps
        ev, ref = ramped(*batch), full.eval()(*batch)
    torch.testing.assert_close(ev.loss, ref.loss)
    assert ev.step_count.tolist() == ref.step_count.tolist() and ev.step_count[2] > 0


def test_the_run_config_carries_the_ramp_and_refuses_a_fraction_outside_0_1(tmp_path):
    assert Eagle3DraftConfig(ttt_ramp_fraction=0.5).problems() == []
    for bad in (-0.1, 1.0):
        (problem,) = Eagle3DraftConfig(ttt_ramp_fraction=bad).problems()
        assert problem.startswith(f"'draft.ttt_ramp_fraction' = {bad}: expected a fraction of the run in [0, 1)")
    raw = {"target": {"path": str(tmp_path)}, "data": {"sources": ["x.jsonl"]},
           "draft": {"type": "eagle3", "ttt_ramp_fraction": 1.5}}
    with pytest.raises(ConfigError, match=r"draft\.ttt_ramp_fraction' = 1\.5"):
        build_config(raw)
