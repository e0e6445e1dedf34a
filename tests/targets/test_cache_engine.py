"""The cache engine against the hf engine that built its cache (CPU fp32, batch 1): same supervision
bit for bit (eagle3, dflash, dflash_kd), same trained draft weights (eagle3, peagle), several epochs,
and its refusals."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "cache"))

from cache_helpers import AUX, config, final_weights, same_weights, tiny_setup  # noqa: E402
from draftsmith.cache.build import build_cache  # noqa: E402
from draftsmith.cache.store import CacheError  # noqa: E402
from draftsmith.data.dataset import collate  # noqa: E402
from draftsmith.targets import open_engine  # noqa: E402
from draftsmith.targets.contract import supervision_kind, TargetError, supervision_tensors  # noqa: E402
from draftsmith.targets.hf import HFEngine  # noqa: E402
from draftsmith.train.loop import Trainer, train  # noqa: E402

FIELDS = ("aux_hidden", "input_ids", "loss_mask", "target_probs", "position_mask")
PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache_engine")
    target, data = tiny_setup(root)
    build_cache(config(target, data, root / "unused"), root / "cache", batch_size=1, shard_rows=5, progress=False,
                log=lambda s: None)
    return target, data, root / "cache"


def examples(target, data, out):
    tr = Trainer(config(target, data, out), progress=False)
    tr.engine.close()
    return tr.train_set + tr.eval_set, tr.pad_id


def test_supervision_equals_the_hf_engine_bitwise(built, tmp_path):
    target, data, cache = built
    rows, pad = examples(target, data, tmp_path)
    hf, ce = HFEngine(target), open_engine("cache", str(target), dtype="float32", cache_dir=str(cache))
    assert ce.info() == hf.info()
    assert torch.equal(ce.embeddings(), hf.embeddings()) and torch.equal(ce.lm_head_weight(), hf.lm_head_weight())
    draft_ids = torch.tensor(sorted(set(range(0, 384, 5)) | {7, 11}))
    for eng in (hf, ce):
        eng.set_vocab_map(draft_ids)
    batches = [collate([ex], pad) for ex in rows]
    got = [s for _, s in ce.supervision("eagle3", iter(batches), AUX)]
    ref = [s for _, s in hf.supervision("eagle3", iter(batches), AUX)]
    for g, r in zip(got, ref):
        for f in FIELDS:
            assert getattr(g, f).dtype == getattr(r, f).dtype and torch.equal(getattr(g, f), getattr(r, f)), f
    # id L (= 2) is served from the stored pre-norm state; padded batches keep each row's values, zeros at pads
    pair = collate(rows[:2], pad)
    both = ce.features(pair, [2, 0], logits=True)
    for b, ex in enumerate(rows[:2]):
        one = hf.features(collate([ex], pad), [2, 0], logits=True)
        T = len(ex.input_ids)
        assert torch.equal(both.aux_hidden[b, :T], one.aux_hidden[0]) and torch.equal(both.logits[b, :T], one.logits[0])
        assert not both.aux_hidden[b, T:].any() and not both.logits[b, T:].any()


@pytest.mark.parametrize("kind", ["dflash", "dflash_kd"])
def test_dflash_supervision_equals_the_hf_engine_bitwise(built, tmp_path, kind):
    """Engine ids [1, 2] (DFlash hook ids [0, 1]): id 1 is a cached aux layer, id L = 2 the stored
    pre-norm state, which dflash_kd carries (the draft rebuilds the logits), so any cache can serve it."""
    target, data, cache = built
    rows, pad = examples(target, data, tmp_path)
    hf, ce = HFEngine(target), open_engine("cache", str(target), dtype="float32", cache_dir=str(cache))
    batches = [collate([ex], pad) for ex in rows]
    got = list(ce.supervision(kind, iter(batches), [1, 2]))  # no vocab map: the kind does not use one
    ref = list(hf.supervision(kind, iter(batches), [1, 2]))
    assert [b for b, _ in got] == batches
    for (_, g), (_, r) in zip(got, ref):
        assert type(g) is type(r) is supervision_kind(kind).cls
        gt, rt = supervision_tensors(g), supervision_tensors(r)
        assert tuple(gt) == tuple(rt) == supervision_kind(kind).tensor_names
        for f in rt:
            assert gt[f].dtype == rt[f].dtype and torch.equal(gt[f], rt[f]), f


def test_refusals_name_the_setting_and_the_fix(built, tmp_path):
    target, data, cache = built
    rows, pad = examples(target, data, tmp_path)
    cfg = config(target, data, tmp_path / "unused")
    cfg.target.aux_layer_ids = [1]  # a cache holding only id 1 (and L = 2)
    build_cache(cfg, tmp_path / "only1", batch_size=2, progress=False, log=lambda s: None)
    ce = open_engine("cache", str(target), dtype="float32", cache_dir=str(tmp_path / "only1"))
    one = collate(rows[:1], pad)
    assert ce.features(one, [2, 1], logits=False).aux_hidden.shape[2] == 2
    (_, kd), = ce.supervision("dflash_kd", iter([one]), [1])  # the teacher's state is id L, which every cache holds
    assert kd.aux_hidden.shape[2] == 1 and kd.last_hidden.dtype == torch.float32
    assert kd.last_hidden.shape == (*one.input_ids.shape, ce.info().hidden_size)
    with pytest.raises(TargetError, match=r"layer ids \[0\] are not in the cache .*holds \[1\] and 2"):
        ce.features(one, [0, 1], logits=False)
    with pytest.raises(CacheError, match="1 of 1 rows of this batch are not in the cache"):
        ce.features(collate([type(rows[0])([1, 2, 3], [0, 1, 1])], pad), [1], logits=True)
    with pytest.raises(CacheError, match=r"target.dtype 'float32', this run has 'bfloat16'"):
        open_engine("cache", str(target), dtype="bfloat16", cache_dir=str(cache))
    with pytest.raises(CacheError, match="build the cache first"):
        open_engine("cache", str(target), dtype="float32", cache_dir=str(tmp_path / "none"))


@pytest.mark.slow
@pytest.mark.parametrize("draft", [{}, PEAGLE], ids=["eagle3", "peagle"])
def test_training_from_the_cache_matches_co_located(built, tmp_path, draft):
    target, data, cache = built
    ref = train(config(target, data, tmp_path / "hf", draft=draft), progress=False)
    res = train(config(target, data, tmp_path / "cache", "cache", cache, draft=draft), progress=False)
    assert res.step == ref.step == 4 and res.history == ref.history
    assert same_weights(final_weights(res), final_weights(ref))


def test_several_epochs_from_the_cache(built, tmp_path):
    target, data, cache = built
    res = train(config(target, data, tmp_path / "ep", "cache", cache, epochs=3, max_steps=None), progress=False)
    assert res.epoch == 3 and res.step == 3 * 10 and res.eval["loss"] > 0  # 12 chats - 2 held out, batch 1
