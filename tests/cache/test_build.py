"""`draftsmith cache`: builds every trainer row once, resumes after kill -9 to the same bytes, refuses
changed settings by name, and its errors (and the cache engine's) are one line with exit 2."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from cache_helpers import tiny_run_config
from deadline import HANG_S
from draftsmith.cache import store
from draftsmith.cache.build import build_cache
from draftsmith.cache.store import CacheError
from draftsmith.cli import main
from draftsmith.config import build_config
from fixtures import artifacts

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_run_config(tmp_path_factory.mktemp("build"), n_chats=80)


def quiet(_):
    pass


def test_build_holds_every_row_and_a_rerun_is_a_no_op(tiny, tmp_path):
    target, data, path = tiny
    cfg = build_config(yaml.safe_load(path.read_text()))
    m = build_cache(cfg, tmp_path / "c", batch_size=3, shard_rows=32, progress=False, log=quiet)
    assert m["complete"] and m["rows"] == m["data"]["rows"] == m["data"]["examples"] == 80
    assert [e["rows"] for e in m["shards"]] == [32, 32, 16] and m["bytes_per_token"] == 4 + 1 + 3 * 32 * 4
    assert m["target"]["dtype"] == "float32" and m["aux_layer_ids"] == [0, 1] and m["num_layers"] == 2
    before = {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()}
    lines = []
    build_cache(cfg, tmp_path / "c", batch_size=3, shard_rows=32, progress=False, log=lines.append)
    assert "already complete" in lines[0] and before == {p.name: p.read_bytes() for p in (tmp_path / "c").iterdir()}
    cfg.data.max_length = 40
    with pytest.raises(CacheError, match=r"built with data.max_length 48, this run has 40; pass a new --out"):
        build_cache(cfg, tmp_path / "c", shard_rows=32, progress=False, log=quiet)
    cfg.data.max_length, cfg.target.aux_layer_ids = 48, [1, 0]  # the same ids: runs read them ascending
    lines = []
    build_cache(cfg, tmp_path / "c", batch_size=3, shard_rows=32, progress=False, log=lines.append)
    assert "sorted to [0, 1]" in lines[0] and "already complete" in lines[1]
    cfg.target.aux_layer_ids = [0, 2]
    with pytest.raises(CacheError, match=r"aux layer ids \[0, 1\], this run has \[0, 2\]"):
        build_cache(cfg, tmp_path / "c", shard_rows=32, progress=False, log=quiet)


def cli(*args):
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return [sys.executable, "-m", "draftsmith.cli", *map(str, args)], env


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_files_as_one_run(tiny, tmp_path):
    _, _, path = tiny
    args = ("cache", path, "--shard-rows", 2, "--batch-size", 1, "--no-progress")
    cmd, env = cli(*args, "--out", tmp_path / "killed")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = tmp_path / "killed" / store.shard_name(0)
    deadline = time.monotonic() + HANG_S
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=HANG_S)
    manifest = json.loads((tmp_path / "killed" / store.MANIFEST).read_text())
    assert not manifest["complete"] and len(manifest["shards"]) < 40  # killed part-way
    for out in ("killed", "whole"):
        cmd, env = cli(*args, "--out", tmp_path / out)
        assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == 0
    killed, whole = ([p.name for p in artifacts(tmp_path / d)] for d in ("killed", "whole"))
    assert killed == whole and len(whole) == 41  # 40 shards + manifest, no temporaries
    for name in whole:
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name


def test_errors_are_one_line_with_exit_2(tiny, tmp_path, capsys):
    target, data, path = tiny
    small = ["--set", "data.max_rows=20"]
    assert main(["cache", str(path), "--out", str(tmp_path / "c"), "--no-progress", *small]) == 0
    capsys.readouterr()
    cases = [
        (["cache", str(path), "--out", str(tmp_path / "c"), "--no-progress", "--set", "data.max_length=40", *small],
         "data.max_length 48, this run has 40"),
        (["train", str(path), "--no-progress", "--set", "target.engine=cache", "--set",
          f"target.cache_dir={tmp_path / 'nowhere'}"], "build the cache first"),
        (["train", str(path), "--no-progress", "--set", "target.engine=cache"], "'target.cache_dir' is empty"),
        (["train", str(path), "--no-progress", "--set", "target.engine=cache", "--set",  # 80 chats, 20 cached
          f"target.cache_dir={tmp_path / 'c'}", "--set", f"output.dir={tmp_path / 'run'}"],
         "rows of this batch are not in the cache"),
    ]
    for argv, expect in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert expect in err and "\n" not in err, err
