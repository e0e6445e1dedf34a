"""The cache's on-disk format: shards round-trip by key, bytes are deterministic, writes are atomic."""

import json

import pytest
import torch

from draftsmith import atomic
from draftsmith.cache import store
from draftsmith.cache.store import CacheError, CacheReader


def rows(n=3, H=8, n_aux=2, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 3 + 2 * i
        out.append({"input_ids": torch.randint(0, 100, (T,), generator=g, dtype=torch.int32),
                    "loss_mask": (torch.rand(T, generator=g) > 0.5).to(torch.uint8),
                    "aux": torch.randn(T, n_aux, H, generator=g).to(dtype),
                    "last": torch.randn(T, H, generator=g).to(dtype)})
    return out


def write_cache(tmp_path, shards):
    entries = []
    for s, rs in enumerate(shards):
        data, _, tokens = store.encode_shard(rs)
        atomic.write_bytes(tmp_path / store.shard_name(s), data)
        entries.append({"file": store.shard_name(s), "rows": len(rs), "tokens": tokens, "bytes": len(data)})
    store.write_manifest(tmp_path, {"format": store.FORMAT, "version": store.VERSION, "shards": entries,
                                    "complete": True})


def test_rows_round_trip_by_key_in_any_order(tmp_path):
    a, b = rows(3, seed=0), rows(2, seed=1)
    write_cache(tmp_path, [a, b])
    reader = CacheReader(tmp_path)
    assert len(reader) == 5
    for r in reversed(a + b):
        got = reader.row(store.row_key(r["input_ids"]))
        for name in r:
            assert got[name].dtype == r[name].dtype and torch.equal(got[name], r[name]), name
    assert store.row_key([1, 2, 3]) == store.row_key(torch.tensor([1, 2, 3]))  # list or any int tensor
    assert store.row_key([1, 2]) != store.row_key([1, 2, 0])
    assert not list(tmp_path.glob("*.tmp"))  # atomic writes leave no temporaries


def test_shard_bytes_are_deterministic():
    assert store.encode_shard(rows())[0] == store.encode_shard(rows())[0]


def test_a_shard_not_in_the_manifest_does_not_count(tmp_path):
    write_cache(tmp_path, [rows(2)])
    extra = rows(1, seed=5)
    atomic.write_bytes(tmp_path / store.shard_name(1), store.encode_shard(extra)[0])  # killed before the manifest
    assert store.row_key(extra[0]["input_ids"]) not in CacheReader(tmp_path)


def test_missing_and_foreign_caches_are_one_line_errors(tmp_path):
    with pytest.raises(CacheError, match="draftsmith cache CONFIG --out") as e:
        CacheReader(tmp_path / "nowhere")
    assert "\n" not in str(e.value)
    (tmp_path / store.MANIFEST).write_text(json.dumps({"format": "other", "version": 9}))
    with pytest.raises(CacheError, match="expected 'draftsmith-feature-cache' v1"):
        CacheReader(tmp_path)


def test_bytes_per_token():
    assert store.bytes_per_token(3, 576, "bfloat16") == 4 + 1 + 4 * 576 * 2  # SmolLM2: ~4.6 KB a token
