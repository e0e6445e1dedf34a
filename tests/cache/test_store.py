"""The cache's on-disk format: shards round-trip by key, bytes are deterministic, writes are atomic."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

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
        store.write_atomic(tmp_path / store.shard_name(s), data)
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
    store.write_atomic(tmp_path / store.shard_name(1), store.encode_shard(extra)[0])  # killed before the manifest
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


def test_write_atomic_survives_a_second_writer_of_the_same_file(tmp_path, monkeypatch):
    """Two processes writing one manifest at once (two benches preparing the demo's data): the second
    writer runs between the first one's write and its rename. With one shared ``name.tmp`` the second
    rename moved the first writer's file away and the first rename raised FileNotFoundError."""
    path = tmp_path / "manifest.json"
    real_replace = os.replace
    calls = []

    def interleaved(src, dst):
        calls.append(Path(src).name)
        if len(calls) == 1:  # the first writer is about to rename: the second one writes all the way through
            store.write_atomic(path, b"second")
        real_replace(src, dst)

    monkeypatch.setattr(store.os, "replace", interleaved)
    store.write_atomic(path, b"first")
    assert path.read_bytes() == b"first"  # the last rename wins, whole
    assert len(set(calls)) == 2  # each writer renamed a file of its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_write_atomic_leaves_nothing_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    path.write_bytes(b"old")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        store.write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_stale_temps_go_and_a_write_in_flight_stays(tmp_path, monkeypatch):
    """A second process preparing the same dir clears temporaries while the first is between its write and
    its rename: the live temporary must stay, or the first writer's os.replace fails. A killed write's goes:
    its process is gone (this host), it is old (another host's), or it has no owner in its name."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that was a writer's and is no longer alive
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        old = time.time() - store.STALE_TEMP_S - 5
        names = {
            f".shard-000001.safetensors.{store._HOST}-{gone.pid}.a1b2.tmp": None,  # killed: goes
            f".shard-000002.safetensors.{store._HOST}-{live.pid}.c3d4.tmp": None,  # in flight: stays
            f".shard-000003.safetensors.{store._HOST}-{live.pid}.e5f6.tmp": old,  # stuck past the age: goes
            ".shard-000004.safetensors.other-host-7-8-9.g7h8.tmp": None,  # another host's, young: stays
            ".shard-000005.safetensors.other-host-7.i9j0.tmp": old,  # another host's, old: goes
            "shard-000006.safetensors.tmp": None,  # the unowned form: goes
        }
        for name, t in names.items():
            (tmp_path / name).write_bytes(b"half a shard")
            if t is not None:
                os.utime(tmp_path / name, (t, t))
        path = tmp_path / "manifest.json"
        real_replace, removed = os.replace, []

        def interleaved(src, dst):
            assert Path(src).name.startswith(f".manifest.json.{store._HOST}-{os.getpid()}.")
            removed.append(store.remove_stale_temps(tmp_path, "*.tmp"))  # the other process's clean-up, mid-write
            real_replace(src, dst)

        monkeypatch.setattr(store.os, "replace", interleaved)
        store.write_atomic(path, b"first")
        assert removed == [4] and path.read_bytes() == b"first"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [".shard-000002.safetensors." + f"{store._HOST}-{live.pid}.c3d4.tmp",
             ".shard-000004.safetensors.other-host-7-8-9.g7h8.tmp", "manifest.json"])
    finally:
        live.kill()
        live.wait()
    assert store.remove_stale_temps(tmp_path, "*.tmp") == 1  # the writer is gone now: its temporary goes
    assert store.remove_stale_temps(tmp_path / "gone", "*.tmp") == 0  # a dir not made yet holds none
