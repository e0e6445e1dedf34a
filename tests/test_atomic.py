"""Whole-or-nothing writes (draftsmith.atomic): owned temporaries, os.replace, and the clean-up that deletes a
killed write's leftovers but never a live write's."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from draftsmith import atomic
from draftsmith.train import checkpoint as ckpt


def test_write_bytes_survives_a_second_writer_of_the_same_file(tmp_path, monkeypatch):
    """Two processes writing one manifest at once (two benches preparing the demo's data): the second
    writer runs between the first one's write and its rename. With one shared ``name.tmp`` the second
    rename moved the first writer's file away and the first rename raised FileNotFoundError."""
    path = tmp_path / "manifest.json"
    real_replace = os.replace
    calls = []

    def interleaved(src, dst):
        calls.append(Path(src).name)
        if len(calls) == 1:  # the first writer is about to rename: the second one writes all the way through
            atomic.write_bytes(path, b"second")
        real_replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", interleaved)
    atomic.write_bytes(path, b"first")
    assert path.read_bytes() == b"first"  # the last rename wins, whole
    assert len(set(calls)) == 2  # each writer renamed a file of its own
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_write_bytes_leaves_nothing_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "manifest.json"
    path.write_bytes(b"old")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        atomic.write_bytes(path, b"new")
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
        old = time.time() - atomic.STALE_TEMP_S - 5
        names = {
            f".shard-000001.safetensors.{atomic.HOST}-{gone.pid}.a1b2.tmp": None,  # killed: goes
            f".shard-000002.safetensors.{atomic.HOST}-{live.pid}.c3d4.tmp": None,  # in flight: stays
            f".shard-000003.safetensors.{atomic.HOST}-{live.pid}.e5f6.tmp": old,  # stuck past the age: goes
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
            assert Path(src).name.startswith(f".manifest.json.{atomic.HOST}-{os.getpid()}.")
            removed.append(atomic.remove_stale_temps(tmp_path, "*.tmp"))  # the other process's clean-up, mid-write
            real_replace(src, dst)

        monkeypatch.setattr(atomic.os, "replace", interleaved)
        atomic.write_bytes(path, b"first")
        assert removed == [4] and path.read_bytes() == b"first"
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [".shard-000002.safetensors." + f"{atomic.HOST}-{live.pid}.c3d4.tmp",
             ".shard-000004.safetensors.other-host-7-8-9.g7h8.tmp", "manifest.json"])
    finally:
        live.kill()
        live.wait()
    assert atomic.remove_stale_temps(tmp_path, "*.tmp") == 1  # the writer is gone now: its temporary goes
    assert atomic.remove_stale_temps(tmp_path / "gone", "*.tmp") == 0  # a dir not made yet holds none


def test_replacing_leaves_the_old_file_when_the_body_raises(tmp_path):
    path = tmp_path / "vocab.safetensors"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="killed"):
        with atomic.replacing(path) as tmp:
            assert tmp.parent == tmp_path and tmp.name.startswith(atomic.owned_prefix(path)) and tmp.suffix == ".tmp"
            tmp.write_bytes(b"half")
            raise RuntimeError("killed mid-write")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab.safetensors"]
    with atomic.replacing(path) as tmp:  # a writer that writes by name (safetensors, savefig, torch.save)
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new" and oct(path.stat().st_mode & 0o777) == oct(0o644)
    atomic.write_json(tmp_path / "r.json", {"a": [1, 2]})
    assert (tmp_path / "r.json").read_text() == '{\n  "a": [\n    1,\n    2\n  ]\n}\n'


def test_swap_dir_replaces_a_directory_whole_and_point_moves_a_link(tmp_path):
    out = tmp_path / "vllm_export"
    first = atomic.temp_dir_beside(out)
    (first / "config.json").write_text("1")
    assert oct(first.stat().st_mode & 0o777) == oct(0o755)
    atomic.swap_dir(first, out)
    second = atomic.temp_dir_beside(out)
    (second / "config.json").write_text("2")
    atomic.swap_dir(second, out)  # an existing copy is renamed away, then removed
    assert (out / "config.json").read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vllm_export"]
    atomic.point(tmp_path / "LATEST", "vllm_export")
    atomic.point(tmp_path / "LATEST", "elsewhere")  # over an existing link: replaced, never missing
    assert os.readlink(tmp_path / "LATEST") == "elsewhere"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["LATEST", "vllm_export"]


def test_a_killed_save_leaves_a_half_checkpoint_the_next_save_deletes(tmp_path):
    """A kill -9 mid-save leaves its temporary directory (model and optimizer state: the largest files of a
    run); it never becomes LATEST, and the next save in that root deletes it. A live writer's stays."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed = tmp_path / f".epoch_0_step_5.{atomic.HOST}-{gone.pid}.x1y2.tmp"
        (killed / "model" / "consolidated").mkdir(parents=True)
        (killed / "optim.pt").write_bytes(b"half")
        in_flight = tmp_path / f".epoch_0_step_5.{atomic.HOST}-{live.pid}.z3w4.tmp"
        in_flight.mkdir()
        ckpt.save_checkpoint(tmp_path, 0, 6, model_state={"w": torch.zeros(2)}, model_config={"x": 1},
                             vocab={"d2t": torch.zeros(1)}, optim_state={}, meta={}, run_config_yaml="a: 1\n")
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == sorted(["LATEST", "epoch_0_step_6", in_flight.name])
        assert os.readlink(tmp_path / "LATEST") == "epoch_0_step_6"
        assert json.loads((tmp_path / "epoch_0_step_6" / "meta.json").read_text())["step"] == 6
    finally:
        live.kill()
        live.wait()
