"""TPRunner: every tensor-parallel rank runs each command, rank 0's features are the engine's, and a rank
that fails is named instead of leaving rank 0 waiting (real processes and gloo all-reduces, no GPU)."""

from __future__ import annotations

import pytest
import torch

from draftsmith.serve.process import free_port
from draftsmith.targets.contract import TargetError
from draftsmith.targets.runner import TPRunner
from tp_ranks import GlooRank


def test_every_rank_runs_and_rank_0_returns_the_all_reduced_features():
    runner = TPRunner(GlooRank, (2, f"tcp://127.0.0.1:{free_port()}", 4), 2)
    try:
        runner.set_capture_layers([1, 3])
        out = runner.run([[1, 2, 3], [5]])
        # rank 0's share (1 x t) + rank 1's (2 x t) = 3t: rank 1 ran the same run with the same ids
        assert [o.shape for o in out] == [(3, 2, 4), (1, 2, 4)]
        assert torch.equal(out[0][:, 0, 0], torch.tensor([3.0, 6.0, 9.0])) and torch.equal(out[1], torch.full((1, 2, 4), 15.0))
        assert len(runner.procs) == 1 and runner.procs[0].is_alive()
    finally:
        runner.close()
    assert runner.procs == []


def test_a_rank_that_fails_to_load_is_named():
    init = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(TargetError, match=r"TP rank 1 of 2 failed: RuntimeError: CUDA error: no device 1"):
        TPRunner(GlooRank, (2, init, 4, 1, 5.0), 2)


def test_one_rank_runs_in_this_process():
    runner = TPRunner(GlooRank, (1, f"tcp://127.0.0.1:{free_port()}", 2), 1)
    try:
        assert runner.procs == []
        runner.set_capture_layers([0])
        assert torch.equal(runner.run([[4]])[0], torch.full((1, 1, 2), 4.0))
    finally:
        runner.close()
