"""A cache shard cut short: every reader (train, `serve-target --engine cache`) ends in one line naming
the shard, its size and the `draftsmith cache` command that rebuilds it, exit 2, never a traceback or
a SIGBUS; and that command, run as printed, restores the shard byte for byte."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cache_helpers import AUX, tiny_run_config
from draftsmith import atomic
from draftsmith.cache import store
from draftsmith.cache.build import build_cache
from draftsmith.cache.store import CacheError, CacheReader
from draftsmith.config import build_config
from draftsmith.data.dataset import Example, collate
from draftsmith.remote.client import RemoteEngine, RemoteError
from fixtures import artifacts

sys.path.insert(0, str(Path(__file__).parents[1] / "remote"))  # remote_helpers: a real serve-target process

SRC = str(Path(__file__).resolve().parents[2] / "src")
SHARD_ROWS = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(target, run.yaml, cache dir): a whole 3-shard cache built as `draftsmith cache` builds it."""
    root = tmp_path_factory.mktemp("damaged")
    target, _, path = tiny_run_config(root, n_chats=12)
    cfg = build_config(yaml.safe_load(path.read_text()))
    build_cache(cfg, root / "cache", shard_rows=SHARD_ROWS, progress=False, log=lambda s: None)
    assert len(list((root / "cache").glob("shard-*"))) == 3
    return target, path, root / "cache"


def cli(*args, timeout=120):
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def cut_copy(cache: Path, tmp_path: Path, keep: int) -> tuple[Path, Path, int]:
    """A copy of ``cache`` whose second shard keeps only its first ``keep`` bytes (negative: all but)."""
    out = tmp_path / "cache"
    shutil.copytree(cache, out)
    shard = out / store.shard_name(1)
    whole = shard.stat().st_size
    os.truncate(shard, keep if keep >= 0 else whole + keep)
    return out, shard, whole


def one_line(r: subprocess.CompletedProcess, *needles: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "\n" not in err and err.startswith("draftsmith: error:"), r.stderr[-3000:]
    for n in needles:
        assert n in err, err
    return err


def train_on(path: Path, cache: Path, tmp_path: Path):
    return cli("train", path, "--no-progress", "--set", "target.engine=cache", "--set", f"target.cache_dir={cache}",
               "--set", f"output.dir={tmp_path / 'run'}")


def test_train_names_the_shard_and_the_printed_command_rebuilds_it(tiny, tmp_path):
    _, path, cache = tiny
    bad, shard, whole = cut_copy(cache, tmp_path, 40_000)
    err = one_line(train_on(path, bad, tmp_path), f"{shard}: truncated safetensors shard (40000 of {whole} bytes)")
    command = re.search(r"rebuild it with `([^`]+)`", err).group(1)
    argv = shlex.split(command)
    assert argv[:2] == ["draftsmith", "cache"] and "CONFIG" in argv and argv[argv.index("--out") + 1] == str(bad)
    r = cli(*[str(path) if a == "CONFIG" else a for a in argv[1:]], "--no-progress")
    assert r.returncode == 0 and "resuming" in r.stdout, r.stderr[-3000:]
    assert [p.name for p in artifacts(bad)] == [p.name for p in artifacts(cache)]
    for p in artifacts(cache):
        assert (bad / p.name).read_bytes() == p.read_bytes(), p.name
    assert train_on(path, bad, tmp_path).returncode == 0


@pytest.mark.parametrize("keep,says", [(5, "(5 bytes, no header)"), (100, "cut in the header"), (-1, "bytes)")])
def test_train_refuses_a_shard_cut_anywhere(tiny, tmp_path, capsys, keep, says):
    from draftsmith.cli import main

    _, path, cache = tiny
    bad, shard, _ = cut_copy(cache, tmp_path, keep)
    assert main(["train", str(path), "--no-progress", "--set", "target.engine=cache", "--set",
                 f"target.cache_dir={bad}", "--set", f"output.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{shard}: truncated safetensors shard" in err and says in err, err
    assert f"`draftsmith cache CONFIG --out {bad} --engine hf --shard-rows {SHARD_ROWS}`" in err, err


def test_serve_target_refuses_a_truncated_shard_at_start(tiny, tmp_path):
    target, _, cache = tiny
    bad, shard, whole = cut_copy(cache, tmp_path, 40_000)
    r = cli("serve-target", "--target", target, "--engine", "cache", "--cache-dir", bad, "--aux-layer-ids", *AUX,
            "--host", "127.0.0.1", "--port", 0, "--device", "cpu")
    one_line(r, f"{shard}: truncated safetensors shard (40000 of {whole} bytes)", f"--out {bad} --engine hf")
    assert "READY" not in r.stdout


def test_a_shard_cut_after_open_is_an_error_not_a_sigbus(tiny, tmp_path):
    _, _, cache = tiny
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    reader = CacheReader(copy)
    key = next(k for k, (s, _, _) in reader.index.items() if s == 1)
    other = next(k for k, (s, _, _) in reader.index.items() if s == 0)
    before = {n: t.clone() for n, t in reader.row(key).items()}  # rows are views of the mapping
    shard = copy / store.shard_name(1)
    os.truncate(shard, 100)  # reading these rows' mapped pages now would raise SIGBUS
    with pytest.raises(CacheError, match=re.escape(f"{shard}: truncated safetensors shard (100 of ")):
        reader.row(key)
    assert torch.equal(reader.row(other)["aux"], CacheReader(cache).row(other)["aux"])  # other shards read on
    # A rebuild replaces the file (a new inode): the reader maps the new one and reads on.
    atomic.write_bytes(shard, (cache / store.shard_name(1)).read_bytes())
    assert all(torch.equal(reader.row(key)[n], before[n]) for n in before)


def test_serve_target_answers_a_shard_cut_after_start_with_its_name(tiny, tmp_path):
    from remote_helpers import ServerProc

    target, _, cache = tiny
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    reader = CacheReader(copy)
    rows = [reader.row(k) for k, (s, _, _) in reader.index.items() if s == 1][:2]
    batch = collate([Example(r["input_ids"].tolist(), r["loss_mask"].tolist()) for r in rows], 0)
    reader.close()
    server = ServerProc(target, extra=["--aux-layer-ids", *map(str, AUX), "--engine", "cache", "--cache-dir",
                                       str(copy), "--num-threads", "1"])
    try:
        shard = copy / store.shard_name(1)
        os.truncate(shard, 100)
        with RemoteEngine(str(target), urls=[server.url]) as eng:
            eng.set_vocab_map(torch.arange(0, 384, 3))
            with pytest.raises(RemoteError, match=re.escape(f"{shard}: truncated safetensors shard (100 of ")):
                list(eng.supervision("eagle3", iter([batch]), AUX))
        assert server.proc.poll() is None  # the server answered; it did not die of SIGBUS
    finally:
        server.kill()
