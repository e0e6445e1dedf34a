"""The hf engine's ``device_map``: ``auto`` reaches transformers' ``from_pretrained`` (accelerate spreads
the target over the GPUs), features come back on the first device, and a machine that cannot honour it
gets a one-line error naming ``target.device_map`` before any weight loads."""

import importlib.util

import pytest
import torch
import transformers

import fixtures
from draftsmith.targets import Batch
from draftsmith.targets.contract import TargetError
from draftsmith.targets.hf import HFEngine

L = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return fixtures.make_tiny_llama(tmp_path_factory.mktemp("tiny_map"), num_layers=L)


def batch(vocab: int) -> Batch:
    ids = torch.randint(10, vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    attn = torch.ones_like(ids)
    attn[1, 4:] = 0
    return Batch(ids, attn, attn.clone())


@pytest.fixture
def loads(monkeypatch):
    """Every ``AutoModelForCausalLM.from_pretrained`` call's keyword arguments; the model itself is
    loaded without ``device_map`` (onto the CPU), so the rest of the engine runs here."""
    seen: list[dict] = []
    real = transformers.AutoModelForCausalLM.from_pretrained

    def spy(path, *args, **kwargs):
        seen.append(dict(kwargs))
        kwargs.pop("device_map", None)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    return seen


def test_auto_is_passed_to_from_pretrained_and_features_gather_on_the_first_device(tiny, loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the GPU check passes; the spy loads on CPU
    eng = HFEngine(tiny, device_map="auto", device="cuda:5")  # device is ignored under a device_map
    try:
        assert loads[-1]["device_map"] == "auto"
        assert eng.device == eng.model.get_input_embeddings().weight.device == torch.device("cpu")
        b = batch(eng.info().vocab_size)
        got = eng.features(b, [1, L], logits=True)
    finally:
        eng.close()
    ref_eng = HFEngine(tiny)
    try:
        assert "device_map" not in loads[-1]  # null: one device, the kwarg is not sent at all
        ref = ref_eng.features(b, [1, L], logits=True)
    finally:
        ref_eng.close()
    assert torch.equal(got.aux_hidden, ref.aux_hidden) and torch.equal(got.logits, ref.logits)


def test_auto_without_a_gpu_is_one_line_naming_the_key_before_loading(tiny, loads, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(TargetError) as e:
        HFEngine(tiny, device_map="auto")
    msg = str(e.value)
    assert msg.startswith("target.device_map (serve-target --device-map): 'auto' but this machine has no CUDA GPU")
    assert "set target.device_map: null (or drop --device-map)" in msg and "\n" not in msg
    assert loads == []  # refused before any weight loads


def test_unknown_map_and_missing_accelerate_are_refused(tiny, loads, monkeypatch):
    with pytest.raises(TargetError, match=r"'balanced' is not supported; use auto .* or null"):
        HFEngine(tiny, device_map="balanced")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    with pytest.raises(TargetError, match=r"'auto' needs accelerate, which is not installed; pip install accelerate"):
        HFEngine(tiny, device_map="auto")
    assert loads == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_auto_on_the_gpus_gives_the_one_device_features(tiny):
    one = HFEngine(tiny, device="cuda:0")
    b = batch(one.info().vocab_size)
    try:
        ref = one.features(b, [0, 1, L], logits=True)
    finally:
        one.close()
    spread = HFEngine(tiny, device_map="auto")
    try:
        assert spread.device.type == "cuda"
        assert {p.device.type for p in spread.model.parameters()} == {"cuda"}  # accelerate placed every layer
        got = spread.features(b, [0, 1, L], logits=True)
    finally:
        spread.close()
    assert got.aux_hidden.device == got.logits.device == spread.device  # gathered on the first device
    torch.testing.assert_close(got.aux_hidden.to(ref.aux_hidden.device), ref.aux_hidden, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.logits.to(ref.logits.device), ref.logits, rtol=1e-5, atol=1e-5)
