"""The cache engine returns its features on the configured device: rows are read from the mapped cache
on the CPU and moved once, logits are rebuilt there. ``meta`` stands in for a GPU on a CPU machine
(every op runs, shapes only), so the test fails if anything stays behind on the CPU."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "cache"))

from cache_helpers import AUX, config, tiny_setup  # noqa: E402
from draftsmith.cache.build import build_cache  # noqa: E402
from draftsmith.data.dataset import collate  # noqa: E402
from draftsmith.targets import open_engine  # noqa: E402
from draftsmith.train.loop import Trainer  # noqa: E402

L, H = 2, 32  # cache_helpers' tiny target


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_device")
    target, data = tiny_setup(root, n_chats=6)
    cfg = config(target, data, root / "run", device="cpu")
    build_cache(cfg, root / "cache", batch_size=1, shard_rows=4, progress=False, log=lambda s: None)
    tr = Trainer(cfg, progress=False)
    tr.engine.close()
    return target, root / "cache", collate((tr.train_set + tr.eval_set)[:2], tr.pad_id)


def open_cache(target, cache, **kw):
    return open_engine("cache", str(target), dtype="float32", cache_dir=str(cache), **kw)


def test_features_come_back_on_the_configured_device(built):
    target, cache, batch = built
    eng = open_cache(target, cache, device="meta")
    try:
        assert eng.device == torch.device("meta")
        f = eng.features(batch, [AUX[1], L], logits=True)
        B, S = batch.input_ids.shape
        assert f.aux_hidden.device.type == "meta" and f.aux_hidden.shape == (B, S, 2, H)
        assert f.logits.device.type == "meta" and f.logits.shape == (B, S, eng.info().vocab_size)
        assert eng.embeddings().device.type == "cpu"  # the weights the draft copies stay where they were read
    finally:
        eng.close()


def test_cpu_and_no_device_give_the_same_tensors(built):
    target, cache, batch = built
    default, cpu = open_cache(target, cache), open_cache(target, cache, device="cpu")
    try:
        assert default.device == torch.device("cpu")
        a, b = default.features(batch, AUX, logits=True), cpu.features(batch, AUX, logits=True)
        assert torch.equal(a.aux_hidden, b.aux_hidden) and torch.equal(a.logits, b.logits)
    finally:
        default.close()
        cpu.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_features_on_cuda_equal_the_cpu_ones(built):
    target, cache, batch = built
    cpu, gpu = open_cache(target, cache, device="cpu"), open_cache(target, cache, device="cuda")
    try:
        a, b = cpu.features(batch, AUX, logits=True), gpu.features(batch, AUX, logits=True)
    finally:
        cpu.close()
        gpu.close()
    assert b.aux_hidden.device.type == "cuda" and b.logits.device.type == "cuda"
    assert torch.equal(b.aux_hidden.cpu(), a.aux_hidden)  # stored values, only moved
    torch.testing.assert_close(b.logits.cpu(), a.logits, rtol=1e-5, atol=1e-5)  # rebuilt by CUDA kernels


def test_supervision_head_lives_on_the_engine_device(tmp_path):
    """Chunked supervision projects the layer-L state with the head on the cache engine's device."""
    from draftsmith.targets import target_head
    from draftsmith.targets.cache import CacheEngine

    eng = CacheEngine.__new__(CacheEngine)
    eng.device, eng._head_on_device = torch.device("meta"), None
    from draftsmith.supervision.head import HeadForm

    eng._info = type("I", (), {"rms_norm_eps": 1e-6, "head_form": lambda self: HeadForm()})()
    eng.final_norm_weight = lambda: torch.ones(4)
    eng.lm_head_weight = lambda: torch.ones(6, 4)
    out = target_head(eng).project(torch.zeros(3, 4, device="meta"))
    assert out.device.type == "meta" and tuple(out.shape) == (3, 6)
