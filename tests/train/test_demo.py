"""run_demo's closing figures: its time per phase and the plain vLLM decode speed of the same run, printed
and in demo_summary.json. Data, training, export and the real check are stand-ins on a fake clock (the
real demo takes minutes and starts vLLM); the timing arithmetic is run_demo's own."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

import draftsmith.models
import draftsmith.serve.export
import draftsmith.train.loop
from draftsmith.train import demo


@pytest.fixture
def fake_demo(monkeypatch, tmp_path):
    clock = [1000.0]

    def spend(seconds):
        clock[0] += seconds

    def prepare_data(rows, progress):
        spend(183.0 + 76.0)
        return tmp_path / "regen", tmp_path / "cache", {"regenerate": 183.0, "cache": 76.0}

    class Trainer:
        def __init__(self, cfg, progress):
            self.cfg, self.engine = cfg, SimpleNamespace(close=lambda: None)
            Path(cfg.output.dir).mkdir(parents=True)  # as the trainer's setup does
            spend(12.0)

        def describe(self):
            return ["budget: ..."]

        def run(self):
            spend(515.0)  # a 495 s loop, then the final eval and save
            return SimpleNamespace(checkpoint=tmp_path / "run" / "checkpoints" / "step_692", step=692, epoch=4,
                                   tokens=581_967, tokens_per_s=1176.0, wall_s=495.0,
                                   eval={"step_accuracy": [0.342, 0.269, 0.232], "simulated_tau": 1.476,
                                         "conditional_acceptance": [0.342, 0.5, 0.25],
                                         "draft_vocab_coverage": 0.9871, "loss": 5.1, "positions": 9000})

    def export_vllm(src, dst):
        spend(5.0)
        return dst

    def real_check(ckpt, output):
        spend(170.0)
        return "real speed ...", {"none": {"tokens_per_s": 22.7, "k": 0}, "draft": {"tokens_per_s": 24.2, "k": 1}}

    monkeypatch.setattr(demo, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(demo, "prepare_data", prepare_data)
    monkeypatch.setattr(demo, "real_check", real_check)
    monkeypatch.setattr(draftsmith.train.loop, "Trainer", Trainer)
    monkeypatch.setattr(draftsmith.serve.export, "export_vllm", export_vllm)
    monkeypatch.setattr(draftsmith.models, "resolve_target", lambda name: "/models/smollm2")
    return tmp_path / "run"


def test_demo_ends_with_its_phases_and_the_plain_decode_speed(fake_demo, capsys):
    summary = demo.run_demo(output=str(fake_demo), progress=False)
    lines = capsys.readouterr().out.splitlines()
    # 259 s one-time + 12 setup + 515 run() (495 loop + 20 eval/save) + 5 export + 170 check
    assert lines[-2] == ("demo wall time 961 s (16.0 min; 702 s without the one-time data and cache): regenerate 183 s, "
                         "feature cache 76 s, setup 12 s, train loop 495 s, eval+save+export 25 s, real check 170 s")
    assert lines[-1] == "machine speed: plain vLLM decode 22.7 tok/s in this run (the real check's no speculation, batch 1)"
    expected = {"regenerate": 183.0, "cache": 76.0, "setup": 12.0, "train_loop": 495.0, "eval_save_export": 25.0,
                "real_check": 170.0}
    saved = json.loads((fake_demo / "demo_summary.json").read_text())
    for got in (summary, saved):
        assert got["phases_s"] == expected and got["plain_decode_tok_s"] == 22.7 and got["wall_s"] == 961.0
    assert '"num_speculative_tokens": 1' in saved["serve_command"]  # the check's best K


def test_demo_without_the_check_says_the_speed_was_not_measured(fake_demo, capsys):
    summary = demo.run_demo(output=str(fake_demo), progress=False, check=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("demo wall time 791 s (13.2 min; 532 s without the one-time data and cache): ")
    assert lines[-2].endswith("train loop 495 s, eval+save+export 25 s")
    assert lines[-1] == "machine speed: plain decode speed not measured (--no-check)"
    saved = json.loads((Path(fake_demo) / "demo_summary.json").read_text())
    assert "real_check" not in saved["phases_s"] and saved["plain_decode_tok_s"] is None
    assert summary["phases_s"] == saved["phases_s"]


def test_demo_prints_both_rates_and_the_held_out_coverage(fake_demo, capsys):
    demo.run_demo(output=str(fake_demo), progress=False, check=False)
    out = capsys.readouterr().out
    assert "held-out per-TTT-step accuracy: step0 0.342  step1 0.269  step2 0.232" in out
    assert "held-out conditional acceptance (step k | steps < k accepted): step0 0.342  step1 0.500  step2 0.250" in out
    assert "held-out simulated tau: 1.476   (loss 5.1000, 9000 positions, draft-vocab coverage 0.987)" in out
