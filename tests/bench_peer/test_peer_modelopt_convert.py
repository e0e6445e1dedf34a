"""bench/peer_modelopt.py's conversion of our feature cache into ModelOpt's offline layout.

The tiny hand-made cache of test_peer_speculators_convert.py (3 rows, 2 aux layers, hidden 8) goes through
``convert``; each ``.pt`` is read back the way ModelOpt 0.47's ``OfflineSupervisedDataset`` reads it
(``torch.load(weights_only=True)``; ``input_ids``, ``hidden_states``, ``aux_hidden_states``, optional
``loss_mask``, ``hidden_states_prenorm``), and the draft vocab follows its ``calibrate_frequent_vocab`` rule
(``d2t[i] = token - i`` over the most common tokens), without ModelOpt installed.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peer():
    return load("peer_modelopt_bench", ROOT / "bench" / "peer_modelopt.py")


@pytest.fixture(scope="module")
def tiny_cache():
    return load("peer_speculators_convert_test", Path(__file__).with_name("test_peer_speculators_convert.py")).tiny_cache


def test_draft_vocab_is_most_common_then_unseen_ids(peer):
    chosen, seen = peer.draft_vocab([[5, 5, 7], [7, 5, 2]], 5, 10)
    assert chosen[:3] == [5, 7, 2] and seen == 3  # Counter.most_common order: count, then first seen
    assert chosen[3:] == [0, 1]  # the unseen ids fill the rest in id order
    assert peer.d2t_of(chosen).tolist() == [5, 6, 0, -3, -3]  # d2t[i] = token - i
    with pytest.raises(ValueError):
        peer.draft_vocab([[1]], 11, 10)


def test_modelopt_sample_concatenates_aux_in_layer_order(peer):
    aux = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    row = {"input_ids": torch.tensor([3, 4], dtype=torch.int32), "loss_mask": torch.tensor([0, 1], dtype=torch.uint8),
           "aux": aux, "last": torch.ones(2, 4)}
    s = peer.modelopt_sample(row)
    assert s["aux_hidden_states"].shape == (2, 12) and s["input_ids"].dtype == torch.int64
    assert torch.equal(s["aux_hidden_states"][:, 4:8], aux[:, 1]) and torch.equal(s["hidden_states"], row["last"])
    assert s["hidden_states_prenorm"] is True and s["loss_mask"].tolist() == [0, 1]
    with pytest.raises(ValueError):
        peer.modelopt_sample({**row, "last": torch.ones(3, 4)})


def test_convert_writes_modelopt_layout(peer, tiny_cache, tmp_path):
    cache, pairs = tiny_cache(tmp_path)
    examples = [ex for ex, _ in pairs]
    out = tmp_path / "peer_data"
    manifest = peer.convert(cache, examples[:2], out, 4, 16)
    assert manifest["train_rows"] == 2 and manifest["tokens"] == 9 and manifest["draft_vocab_seen_tokens"] == 4
    files = sorted((out / "offline").rglob("*.pt"))  # its loader globs every .pt under offline_data_path
    assert [f.name for f in files] == ["row_000000.pt", "row_000001.pt"]
    for f, (ex, row) in zip(files, pairs):
        d = torch.load(f, weights_only=True)
        assert d["input_ids"].tolist() == ex.input_ids and d["loss_mask"].tolist() == ex.loss_mask
        assert torch.equal(d["aux_hidden_states"], row["aux"].flatten(1)) and torch.equal(d["hidden_states"], row["last"])
        assert d["hidden_states_prenorm"] is True
    d2t = torch.load(out / "d2t.pt", weights_only=True)
    assert d2t.dtype == torch.int64 and (d2t + torch.arange(4)).tolist() == [5, 6, 7, 8]  # counts over all tokens
    # the same rows again: reused as written; other rows: rewritten
    stamp = files[0].stat().st_mtime_ns
    assert peer.convert(cache, examples[:2], out, 4, 16) == json.loads((out / peer.DATA_MARK).read_text())
    assert files[0].stat().st_mtime_ns == stamp
    assert peer.convert(cache, examples[:1], out, 4, 16)["train_rows"] == 1
    assert len(list((out / "offline").glob("*.pt"))) == 1


def test_convert_refuses_rows_missing_from_the_cache(peer, tiny_cache, tmp_path):
    from draftsmith.data.dataset import Example

    cache, pairs = tiny_cache(tmp_path)
    with pytest.raises(SystemExit, match="not in"):
        peer.convert(cache, [pairs[0][0], Example(input_ids=[1, 2, 3], loss_mask=[0, 1, 1])], tmp_path / "d", 4, 16)
