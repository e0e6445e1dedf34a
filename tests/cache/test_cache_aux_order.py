"""`draftsmith cache` stores a run's aux ids ascending (as training reads them), and a cache built before
the sort, with its ids in the listed order, is read by id: the run's ascending features come out right."""

import json

import pytest
import torch

from cache_helpers import config, tiny_setup
from draftsmith.cache.build import build_cache
from draftsmith.cache.store import CacheError
from draftsmith.data.dataset import collate
from draftsmith.targets import open_engine
from draftsmith.targets.hf import HFEngine
from draftsmith.train.loop import Trainer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("aux_order")
    return tiny_setup(root, n_chats=6)


def test_the_manifest_holds_the_ids_ascending_and_says_so(tiny, tmp_path):
    target, data = tiny
    cfg = config(target, data, tmp_path / "run")
    cfg.target.aux_layer_ids = [1, 0]
    lines = []
    m = build_cache(cfg, tmp_path / "c", batch_size=2, progress=False, log=lines.append)
    assert m["aux_layer_ids"] == [0, 1]
    assert lines[0] == ("cache: target.aux_layer_ids [1, 0] sorted to [0, 1]: vLLM and SGLang read aux states in "
                        "ascending layer order")


def test_a_cache_built_in_the_listed_order_is_read_by_id(tiny, tmp_path, monkeypatch):
    target, data = tiny
    cfg = config(target, data, tmp_path / "run")
    cfg.target.aux_layer_ids = [1, 0]
    import draftsmith.inputs as inputs  # where the cache build takes the ids from

    with monkeypatch.context() as mp:  # the build as it was before ids were sorted: [1, 0] as listed
        mp.setattr(inputs, "aux_layer_ids", lambda cfg, L: list(cfg.target.aux_layer_ids))
        old = build_cache(cfg, tmp_path / "old", batch_size=2, progress=False, log=lambda s: None)
    assert old["aux_layer_ids"] == [1, 0]
    tr = Trainer(config(target, data, tmp_path / "run"), progress=False)
    tr.engine.close()
    cache = open_engine("cache", str(target), dtype="float32", cache_dir=str(tmp_path / "old"))
    hf = HFEngine(target)
    for ex in tr.train_set[:3]:
        b = collate([ex], tr.pad_id)
        assert torch.equal(cache.features(b, [0, 1], logits=False).aux_hidden,
                           hf.features(b, [0, 1], logits=False).aux_hidden)
    # resuming that build now would mix orders in one cache: refused by name
    with pytest.raises(CacheError, match=r"built with aux layer ids \[1, 0\], this run has \[0, 1\]; pass a new --out"):
        build_cache(cfg, tmp_path / "old", batch_size=2, progress=False, log=lambda s: None)
    assert json.loads((tmp_path / "old" / "manifest.json").read_text())["aux_layer_ids"] == [1, 0]
