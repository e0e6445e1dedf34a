"""bf16 on a CPU without native bf16 (AVX2 only): the demo picks float32 for its target, cache and draft,
and a run that turns train.bf16 on there is told why it is slow (train/precision.py)."""

import torch

import draftsmith.train.precision as precision
from draftsmith.config import build_config
from draftsmith.train import demo


def test_the_note_is_only_for_emulated_bf16_on_the_cpu(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    note = precision.bf16_note(torch.device("cpu"), True)
    assert note.startswith("note: train.bf16 is on, but this CPU has no native bf16") and "train.bf16: false" in note
    assert precision.bf16_note(torch.device("cpu"), False) is None  # fp32 runs: nothing to say
    assert precision.bf16_note(torch.device("cuda"), True) is None  # GPUs run bf16 natively
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.bf16_note(torch.device("cpu"), True) is None


def test_the_demo_runs_in_float32_where_the_cpu_would_emulate_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for native, dtype, bf16, opt in ((False, "float32", False, "adamw"), (True, "bfloat16", True, "muon")):
        monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda native=native: native)
        raw = demo.demo_config("runs/x", ["data"])
        assert (raw["target"]["dtype"], raw["train"]["bf16"], raw["train"]["optimizer"]) == (dtype, bf16, opt)
        cfg = build_config(raw, "demo")  # a valid run config either way
        assert cfg.target.dtype == dtype and cfg.train.bf16 is bf16 and cfg.train.optimizer == opt


def test_muon_on_a_cpu_without_native_bf16_is_named(monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: False)
    assert "set train.optimizer: adamw" in precision.muon_note(torch.device("cpu"), "muon")
    assert precision.muon_note(torch.device("cpu"), "adamw") is None
    monkeypatch.setattr(precision, "cpu_has_native_bf16", lambda: True)
    assert precision.muon_note(torch.device("cpu"), "muon") is None


def test_torch_muon_still_orthogonalises_in_bf16():
    # the reason for the note: if torch's Muon stops casting to bf16, the note and the demo's choice can go
    import inspect

    from torch.optim import _muon

    assert ".bfloat16()" in inspect.getsource(_muon._zeropower_via_newtonschulz)


def test_the_check_is_onednns_own():
    assert precision.cpu_has_native_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
