"""`torchrun --nproc-per-node 2 -m draftsmith cache`: the ranks split the shards (shard i: rank i % 2)
and merge ONE manifest whose files equal a one-process build's, byte for byte; after a kill -9 of
one rank the same command finishes the cache without redoing a finished shard or listing one twice."""

import json
import os
import re
import shutil
import signal
import subprocess
import time

import pytest

from cache_helpers import tiny_run_config
from deadline import HANG_S
from draftsmith.cache import store
from torchrun_helpers import assert_same_dirs, env, launcher, one_process, run_job, torchrun, worker_pid

ARGS = ("--shard-rows", 2, "--batch-size", 1, "--no-progress")
N_SHARDS = 20  # 40 unique chats, 2 rows a shard


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The run config and the cache a single process builds from it (the reference)."""
    root = tmp_path_factory.mktemp("ranks")
    _, _, path = tiny_run_config(root, n_chats=40)
    whole = root / "whole"
    r = subprocess.run(one_process("cache", path, "--out", whole, *ARGS), env=env(), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(json.loads((whole / store.MANIFEST).read_text())["shards"]) == N_SHARDS
    return path, whole


def cache_2(path, out):
    return run_job(torchrun(2, "cache", path, "--out", out, *ARGS), env())


def listed(out) -> list[str]:
    return [e["file"] for e in json.loads((out / store.MANIFEST).read_text())["shards"]]


@pytest.mark.slow  # launches torchrun (two python processes)
def test_two_ranks_write_the_files_of_one_process(setup, tmp_path):
    path, whole = setup
    r = cache_2(path, tmp_path / "two")
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_dirs(tmp_path / "two", whole)  # manifest included: one merged listing, in shard order
    assert listed(tmp_path / "two") == [store.shard_name(i) for i in range(N_SHARDS)]
    assert r.stdout.count("cache: ") == 1 and "on 2 ranks" in r.stdout  # rank 0 alone prints the summary


@pytest.mark.slow  # launches torchrun (two python processes)
def test_kill_9_of_one_rank_then_rerun_finishes_without_redoing_a_shard(setup, tmp_path):
    path, whole = setup
    out = tmp_path / "killed"
    launcher = subprocess.Popen(torchrun(2, "cache", path, "--out", out, *ARGS), env=env(),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        rank1 = worker_pid(launcher.pid, 1)
        first = out / store.shard_name(1)  # rank 1's first shard
        deadline = time.monotonic() + HANG_S
        while not first.exists() and launcher.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        os.kill(rank1, signal.SIGKILL)
        assert launcher.wait(timeout=HANG_S) != 0  # torchrun stops rank 0 too and reports the failure
    finally:
        if launcher.poll() is None:
            launcher.kill()
    on_disk = sorted(p.name for p in out.glob("shard-*.safetensors"))
    manifest = json.loads((out / store.MANIFEST).read_text())
    assert not manifest["complete"] and len(on_disk) < N_SHARDS, on_disk  # killed part-way
    assert all(int(f[6:12]) % 2 == 0 for f in listed(out))  # only rank 0 writes the manifest
    before = {name: (out / name).stat().st_ino for name in on_disk}
    r = cache_2(path, out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"after {len(on_disk)} of {N_SHARDS} complete shard(s)" in r.stdout
    # os.replace gives a rewritten shard a new inode: every shard on disk before the rerun was kept
    assert {name: (out / name).stat().st_ino for name in on_disk} == before
    assert_same_dirs(out, whole)
    assert listed(out) == [store.shard_name(i) for i in range(N_SHARDS)]


@pytest.mark.slow  # launches torchrun (two python processes)
def test_rerun_skips_what_a_kill_leaves_and_redoes_an_unreadable_shard(setup, tmp_path):
    """The state a kill leaves, built by hand: the manifest lists a prefix of rank 0's shards, some of
    rank 1's shards are on disk unlisted, a temporary is half-written; plus a shard file that is not a
    safetensors file (never written by draftsmith, but it must not count)."""
    path, whole = setup
    out = tmp_path / "state"
    shutil.copytree(whole, out)
    manifest = json.loads((out / store.MANIFEST).read_text())
    manifest["shards"], manifest["complete"] = manifest["shards"][:1], False  # lists shard 0 only
    manifest["rows"] = manifest["tokens"] = 0  # stale totals: the merge recomputes them
    (out / store.MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    for i in (2, 4, 5, 7, 8, 9, 11, 19):  # both ranks' shards missing
        (out / store.shard_name(i)).unlink()
    (out / (store.shard_name(9) + ".tmp")).write_bytes(b"half a shard")
    (out / store.shard_name(13)).write_bytes(b"not a safetensors file")
    r = cache_2(path, out)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"after {N_SHARDS - 9} of {N_SHARDS} complete shard(s)" in r.stdout
    assert_same_dirs(out, whole)
    # a changed setting: rank 0 refuses, and every rank stops with its one-line error (no rank hangs)
    r = run_job(torchrun(2, "cache", path, "--out", out, *ARGS, "--set", "data.max_length=40"), env())
    # both ranks share one stderr, so their lines may run together: split on the prefix, not on newlines
    errors = ["draftsmith: error" + e for e in r.stderr.split("draftsmith: error")[1:]]
    assert r.returncode != 0 and len(errors) >= 1, r.stderr[-3000:]
    assert all(re.match(r"draftsmith: error \(rank [01]\): ", e) for e in errors), errors  # each names its rank
    assert all(f"{out / store.MANIFEST}: this cache was built with data.max_length 48, this run has 40" in e
               for e in errors), errors
    assert_same_dirs(out, whole)


# ------------------------------------------------------------------------------ ranked helpers, no launch
def test_ranks_that_disagree_refuse_by_setting_name(monkeypatch):
    from draftsmith import distributed, ranked
    from draftsmith.cache.store import CacheError
    from draftsmith.distributed import Ranks

    two = Ranks(rank=1, world=2)
    mine = {"target.path": "/t", "data.max_length": 40}
    monkeypatch.setattr(distributed, "all_gather_objects", lambda v: [{**v, "data.max_length": 48}, v])
    with pytest.raises(CacheError, match=r"draftsmith cache --out D: ranks disagree on data.max_length: rank 1 has "
                                         r"40, rank 0 has 48; run every rank with the same config"):
        ranked.agree(two, mine, "draftsmith cache --out D", CacheError)


def test_rank_0_setup_error_reaches_every_rank(monkeypatch):
    from draftsmith import distributed, ranked
    from draftsmith.cache.store import CacheError
    from draftsmith.distributed import Ranks

    sent = []
    err = CacheError("D/manifest.json: built with data.max_length 48; pass a new --out dir")
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj, src=0: sent.append(obj) or (None, err))
    with pytest.raises(CacheError, match="max_length 48"):  # rank 1 never runs the setup, raises rank 0's error
        ranked.main_first(Ranks(rank=1, world=2), lambda: pytest.fail("rank 1 ran rank 0's setup"))
    assert sent == [(None, None)]


def test_world_size_without_a_process_group_is_refused(monkeypatch):
    from draftsmith import ranked
    from draftsmith.cache.store import CacheError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(CacheError, match="WORLD_SIZE=2 but this process joined no process group"):
        ranked.job_ranks(CacheError)


def test_a_failed_rank_is_named_on_the_others(monkeypatch):
    from draftsmith import distributed, ranked
    from draftsmith.cache.store import CacheError
    from draftsmith.distributed import Ranks

    monkeypatch.setattr(distributed, "all_gather_objects", lambda v: [v, (None, "OSError: [Errno 28] disk full")])
    with pytest.raises(CacheError, match=r"rank 1 failed \(OSError: \[Errno 28\] disk full\); the shards every "
                                         r"rank finished are kept: rerun"):
        ranked.gather(Ranks(rank=0, world=2), lambda: {0: {}}, CacheError, "rerun")


SHUTDOWN_SCRIPT = """
import os
from draftsmith import distributed, ranked

ranks = distributed.ranks_from_env()
ranked.start(ranks)
import transformers.modeling_utils  # noqa: E402,F401  (imports torch modules with group=WORLD defaults)
distributed.all_gather_objects(ranks.rank)
distributed.shutdown()
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(f"rank {ranks.rank}: gloo threads left {sum(n.startswith(('pt_gloo', 'gloo')) for n in names)}")
"""


@pytest.mark.slow  # launches torchrun (two python processes)
def test_shutdown_joins_gloo_threads_after_transformers_is_imported(tmp_path):
    """A process group captured by modules imported after it was joined outlives shutdown, and a rank
    then aborts at exit now and then (SIGABRT); distributed.init imports them first."""
    script = tmp_path / "shutdown.py"
    script.write_text(SHUTDOWN_SCRIPT)
    r = run_job(launcher(2) + [str(script)], env())
    assert r.returncode == 0, r.stderr[-3000:]
    # the ranks share one stdout pipe, so their lines can interleave: match, do not split
    assert sorted(re.findall(r"rank (\d): gloo threads left (\d+)", r.stdout)) == [("0", "0"), ("1", "0")], r.stdout
