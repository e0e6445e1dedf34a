"""bench/peer_specforge.py's conversions: our feature cache into SpecForge 0.2.0's offline rows, and its
``--to hf`` export into the directory vLLM serves as EAGLE-3.

The tiny hand-made cache of test_peer_speculators_convert.py (3 rows, 2 aux layers, hidden 8) and a
hand-made target (a ``config.json`` and a ``model.safetensors`` holding the final norm) go through
``convert``; each ``.ckpt`` is read back as SpecForge's offline reader does (``torch.load``; ``input_ids``,
``loss_mask``, ``aux_hidden_state`` (1, T, n H), ``hidden_state`` (1, T, H) after the final norm). A
hand-made export with SpecForge's key names goes through ``vllm_draft``. Neither SpecForge nor vLLM runs.
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def peer():
    return SimpleNamespace(**runpy.run_path(str(BENCH / "peer_specforge.py")))  # not as __main__: nothing runs


@pytest.fixture(scope="module")
def tiny_cache():
    return runpy.run_path(str(Path(__file__).with_name("test_peer_speculators_convert.py")))["tiny_cache"]


def tiny_target(root: Path, hidden: int = 8, eps: float = 1e-5) -> tuple[Path, torch.Tensor]:
    from safetensors.torch import save_file

    target = root / "target"
    target.mkdir()
    norm = torch.linspace(0.5, 1.5, hidden)
    (target / "config.json").write_text(json.dumps({"rms_norm_eps": eps, "hidden_size": hidden}))
    save_file({"model.norm.weight": norm, "model.embed_tokens.weight": torch.ones(16, hidden)},
              str(target / "model.safetensors"))
    return target, norm


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_specforge_sample_is_aux_concatenated_and_normed_last(peer):
    aux = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    last = torch.tensor([[1.0, -2.0, 3.0, 0.5], [0.0, 1.0, 1.0, 1.0]])
    w = torch.tensor([1.0, 2.0, 0.5, 1.0])
    row = {"input_ids": torch.tensor([3, 4], dtype=torch.int32), "loss_mask": torch.tensor([0, 1], dtype=torch.uint8),
           "aux": aux, "last": last}
    s = peer.specforge_sample(row, w, 1e-6)
    assert s["aux_hidden_state"].shape == (1, 2, 12) and torch.equal(s["aux_hidden_state"][0, :, 4:8], aux[:, 1])
    assert torch.allclose(s["hidden_state"][0], rms_norm(last, w, 1e-6))
    assert s["input_ids"].dtype == s["loss_mask"].dtype == torch.int64 and s["loss_mask"].tolist() == [0, 1]
    half = peer.specforge_sample({**row, "aux": aux.bfloat16(), "last": last.bfloat16()}, w, 1e-6)
    assert half["hidden_state"].dtype == half["aux_hidden_state"].dtype == torch.bfloat16  # the cache's dtype
    with pytest.raises(ValueError):
        peer.specforge_sample({**row, "last": torch.ones(3, 4)}, w, 1e-6)


def test_convert_writes_specforge_rows(peer, tiny_cache, tmp_path):
    cache, pairs = tiny_cache(tmp_path)
    target, norm = tiny_target(tmp_path)
    examples = [ex for ex, _ in pairs]
    out = tmp_path / "peer_data"
    manifest = peer.convert(cache, examples[:2], out, target)
    assert manifest["train_rows"] == 2 and manifest["tokens"] == 9
    files = sorted((out / "rows").iterdir())
    assert [f.name for f in files] == ["data_000000.ckpt", "data_000001.ckpt"]  # its reader: sorted *.ckpt
    for f, (ex, row) in zip(files, pairs):
        d = torch.load(f, weights_only=True)
        assert d["input_ids"].tolist() == ex.input_ids and d["loss_mask"].tolist() == ex.loss_mask
        assert torch.equal(d["aux_hidden_state"][0], row["aux"].flatten(1))
        want = rms_norm(row["last"].float(), norm, 1e-5).to(row["last"].dtype)
        assert torch.equal(d["hidden_state"][0], want)
    stamp = files[0].stat().st_mtime_ns  # the same rows again: reused as written; other rows: rewritten
    assert peer.convert(cache, examples[:2], out, target) == json.loads((out / peer.DATA_MARK).read_text())
    assert files[0].stat().st_mtime_ns == stamp
    assert peer.convert(cache, examples[:1], out, target)["train_rows"] == 1
    assert len(list((out / "rows").iterdir())) == 1


def test_indexed_target_links_every_file_and_indexes_every_tensor(peer, tmp_path):
    target, _ = tiny_target(tmp_path)
    out = peer.indexed_target(target, tmp_path / "indexed")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == {"model.norm.weight": "model.safetensors", "model.embed_tokens.weight": "model.safetensors"}
    assert (out / "config.json").resolve() == (target / "config.json").resolve()
    assert peer.indexed_target(target, out) == out  # a second call keeps what is there


def fake_export(root: Path, **config) -> tuple[Path, dict]:
    from safetensors.torch import save_file

    export = root / "export"
    export.mkdir()
    weights = {"midlayer.self_attn.q_proj.weight": torch.randn(4, 8), "fc.weight": torch.randn(4, 12),
               "norm.weight": torch.ones(4), "lm_head.weight": torch.randn(6, 4), "d2t": torch.arange(6),
               "t2d": torch.ones(10, dtype=torch.bool), "embed_tokens.weight": torch.randn(10, 4).bfloat16()}
    save_file(weights, str(export / "model.safetensors"))
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 6, "vocab_size": 10, **config}
    (export / "config.json").write_text(json.dumps(cfg))
    return export, weights


def test_vllm_draft_drops_the_bf16_embedding_and_names_the_aux_layers(peer, tmp_path):
    from safetensors.torch import load_file

    export, weights = fake_export(tmp_path)
    info = peer.vllm_draft(export, tmp_path / "vllm", (2, 15, 27))
    assert info["dropped"] == ["embed_tokens.weight"] and info["tensors"] == len(weights) - 1
    got = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert set(got) == set(weights) - {"embed_tokens.weight"}  # vLLM then shares the target's embedding
    assert all(torch.equal(got[k], weights[k]) for k in got)  # nothing else renamed or cast
    cfg = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}
    assert cfg["draft_vocab_size"] == 6 and cfg["architectures"] == ["LlamaForCausalLMEagle3"]


@pytest.mark.parametrize("config, match", [({"architectures": ["LlamaForCausalLM"]}, "architectures"),
                                           ({"norm_output": False}, "norm_output")])
def test_vllm_draft_refuses_what_vllm_would_serve_wrongly(peer, tmp_path, config, match):
    export, _ = fake_export(tmp_path, **config)
    with pytest.raises(ValueError, match=match):
        peer.vllm_draft(export, tmp_path / "vllm", (2, 15, 27))


def test_launcher_loss_is_the_masked_soft_cross_entropy(peer):
    """The torch loss the launcher puts in place of SpecForge's Triton LogSoftmaxLoss."""
    ns: dict = {"__name__": "launcher"}
    exec(compile(peer.LAUNCHER, "launcher.py", "exec"), ns)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=g, requires_grad=True)
    target = torch.softmax(torch.randn(2, 3, 5, generator=g), -1)
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]]).unsqueeze(-1)
    loss = ns["TorchLogSoftmaxLoss"].apply(logits, target, mask)
    per = -(target * torch.log_softmax(logits, -1)).sum(-1) * mask.squeeze(-1)
    assert torch.allclose(loss, per.sum() / 6)  # 0 where masked, mean over every (b, t)
    loss.backward()
    assert logits.grad is not None and torch.equal(logits.grad[0, 1], torch.zeros(5))


def test_run_launcher_writes_files_beside_the_launcher(peer, tmp_path):
    ok = ("import json, pathlib, sys\n"
          "json.dump({'cfg': (pathlib.Path(sys.argv[0]).parent / 'run.yaml').read_text()}, open(sys.argv[1], 'w'))\n")
    out = peer.run_launcher("toy", Path(sys.executable), ok, tmp_path / "run", tmp_path / "s.json", 1.0, [], {},
                            files={"run.yaml": "a: 1\n"})
    assert out["cfg"] == "a: 1\n"
