"""Remote vs co-located on CPU fp32: supervision bitwise equal (1 and 2 servers, prefetch 0/1/2; the
eagle3, dflash and dflash_kd kinds) and a training run through the remote engine ends with the same
weights as a co-located one."""

import pytest
import torch

from draftsmith.remote.client import RemoteEngine
from draftsmith.targets import Batch, supervision_for
from draftsmith.targets.contract import supervision_kind, supervision_tensors
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine
from draftsmith.train.loop import train
from remote_helpers import AUX
from remote_train import final_weights, same_weights, tiny_target_and_servers, train_config

FIELDS = ("aux_hidden", "input_ids", "loss_mask", "target_probs", "position_mask")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    with tiny_target_and_servers(tmp_path_factory.mktemp("parity")) as got:
        yield got


def batches(n=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        S = 6 + 3 * i
        ids = torch.randint(0, 384, (2, S), generator=g)
        am = torch.ones_like(ids)
        am[1, S - 2 :] = 0  # right padding on the second row
        out.append(Batch(ids, am, (torch.rand(2, S, generator=g) > 0.4).long() * am))
    return out


@pytest.mark.parametrize("n_servers", [1, 2])
@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_supervision_bitwise_equal_to_co_located(setup, n_servers, prefetch):
    target, _, servers = setup
    hf = HFEngine(target)
    draft_ids = torch.tensor(sorted(set(range(0, 384, 5)) | {7, 11}))
    bs = batches()
    with RemoteEngine(str(target), urls=[s.url for s in servers[:n_servers]], prefetch_depth=prefetch) as eng:
        eng.set_vocab_map(draft_ids)
        got = list(eng.supervision("eagle3", iter(bs), AUX))
    assert len(got) == len(bs)
    for b, (rb, sup) in zip(bs, got):
        assert rb is b  # order kept
        ref = eagle3_supervision(b, hf.features(b, AUX, logits=True), draft_ids)
        for f in FIELDS:
            assert getattr(sup, f).dtype == getattr(ref, f).dtype and torch.equal(getattr(sup, f), getattr(ref, f)), f


@pytest.mark.parametrize("kind", ["dflash", "dflash_kd"])
def test_dflash_supervision_bitwise_equal_to_co_located(setup, kind):
    """Vocab-free kinds need no vocab map; dflash_kd's state at id L (not V logits a position) crosses the
    wire in its dtype."""
    target, _, servers = setup
    hf = HFEngine(target)
    ids = [2, 6, 4]  # engine ids (DFlash hook ids [1, 5, 3]), 6 = L, request order kept
    bs = batches()
    with RemoteEngine(str(target), urls=[s.url for s in servers], prefetch_depth=2) as eng:
        got = list(eng.supervision(kind, iter(bs), ids))  # no set_vocab_map: the kind does not use one
    assert len(got) == len(bs)
    k = supervision_kind(kind)
    for b, (rb, sup) in zip(bs, got):
        assert rb is b and type(sup) is k.cls
        ref = supervision_tensors(supervision_for(hf, kind, b, ids, None))
        got_t = supervision_tensors(sup)
        assert tuple(got_t) == tuple(ref) == k.tensor_names
        for f, r in ref.items():
            assert got_t[f].dtype == r.dtype and torch.equal(got_t[f], r), f
    if kind == "dflash_kd":
        assert sup.last_hidden.dtype == torch.float32 and sup.last_hidden.shape == (*bs[-1].input_ids.shape, 64)
        assert torch.equal(sup.last_hidden, sup.aux_hidden[:, :, 1])  # 6 = L is also one of the draft's ids


# P-EAGLE learns from the same `eagle3` supervision kind, so it trains through the remote engine
# too (the reference recipe gates it to a co-located target; we do not).
PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}
# JetSpec's KD teacher crosses the wire as the state at id L (not among AUX: asked for beside it) and
# becomes logits in the draft, with the final norm and lm_head from /embeddings
JETSPEC = {"type": "jetspec", "mask_token_id": 5, "block_size": 4, "num_draft_layers": 2, "num_anchors": 4,
           "kd_temperature": 2.0}
# DSpark reads the same dflash_kd supervision, and its Markov and confidence heads train on it
DSPARK = {"type": "dspark", "mask_token_id": 5, "block_size": 3, "num_draft_layers": 2, "num_anchors": 4,
          "markov_rank": 8}


@pytest.mark.slow
@pytest.mark.parametrize("draft", [{}, PEAGLE, JETSPEC, DSPARK], ids=["eagle3", "peagle", "jetspec", "dspark"])
def test_training_through_remote_matches_co_located(setup, tmp_path, draft):
    target, data, servers = setup
    before = [s.get("/health") for s in servers]
    ref = train(train_config(target, data, tmp_path / "co", draft=draft), progress=False)
    res = train(train_config(target, data, tmp_path / "remote", "remote", [s.url for s in servers], prefetch_depth=2,
                             draft=draft), progress=False)
    assert res.step == ref.step == 6 and res.history == ref.history
    assert same_weights(final_weights(res), final_weights(ref))
    after = [s.get("/health") for s in servers]
    assert all(a["features_served"] > b["features_served"] for a, b in zip(after, before))  # both used
    assert all(a["disconnects"] == b["disconnects"] + 1 for a, b in zip(after, before))  # /disconnect on exit


def test_raw_features_and_weights_equal_co_located(setup):
    target, _, servers = setup
    hf, b = HFEngine(target), batches(1)[0]
    with RemoteEngine(str(target), urls=[servers[0].url]) as eng:
        got, ref = eng.features(b, [0, 6], logits=True), hf.features(b, [0, 6], logits=True)
        assert torch.equal(got.aux_hidden, ref.aux_hidden) and torch.equal(got.logits, ref.logits)
        assert eng.features(b, [2], logits=False).logits is None
        assert eng.info() == hf.info()
        assert torch.equal(eng.embeddings(), hf.embeddings()) and torch.equal(eng.lm_head_weight(), hf.lm_head_weight())
        assert torch.equal(eng.final_norm_weight(), hf.final_norm_weight())
