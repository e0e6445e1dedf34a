"""`train --resume` never unpickles code: optim.pt and rng.pt are read with ``weights_only=True``.

A checkpoint whose optim.pt or rng.pt holds a pickled callable or class is refused (exit 2, one line
naming the file) and the callable never runs; a checkpoint written before numpy RNG states were
stored as plain lists (an ndarray in rng.pt) still resumes, to the same RNG draws.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from draftsmith.train.checkpoint import load_checkpoint, rng_state, set_rng_state
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"messages": [{"role": "user", "content": "What is the capital of France?"},
                     {"role": "assistant", "content": "The capital of France is Paris."}]}


def cli(*argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=240)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run config, output dir) of a 2-step run trained through the CLI."""
    tmp = tmp_path_factory.mktemp("pickle")
    target = make_tiny_llama(tmp / "target", make_tokenizer("chatml"), num_layers=2, hidden=32)
    cfg = tmp / "run.yaml"
    cfg.write_text(json.dumps({
        "target": {"path": str(target), "aux_layer_ids": [0, 1]},
        "data": {"sources": [str(write_jsonl(tmp / "chats.jsonl", [GOOD] * 6))], "max_length": 48, "eval_size": 1,
                 "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2}, "train": {"max_steps": 2, "batch_size": 2},
        "output": {"dir": str(tmp / "out"), "tensorboard": False}}))
    r = cli("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return cfg, tmp / "out"


def copy_run(run, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "out"
    shutil.copytree(run[1], out, symlinks=True)
    return out, out / "checkpoints" / "epoch_0_step_2"


class Payload:
    """Unpickling this creates a directory: proof of whether a load ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


class Custom:  # a plain class instance: not code by itself, still nothing a checkpoint needs
    pass


@pytest.mark.parametrize("file,extra", [("optim.pt", "callable"), ("rng.pt", "callable"), ("optim.pt", "class")])
def test_a_checkpoint_holding_pickled_objects_is_refused_without_running_them(run, tmp_path, file, extra):
    out, ck = copy_run(run, tmp_path)
    marker = tmp_path / "ran"
    state = torch.load(ck / file, weights_only=True)
    state["extra"] = Payload(marker) if extra == "callable" else Custom()
    torch.save(state, ck / file)
    r = cli("train", run[0], "--set", f"output.dir={out}", "--resume", "--no-progress")
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "\n" not in err and err.startswith("draftsmith: error:"), r.stderr[-3000:]
    assert str(ck / file) in err and "refuses to unpickle" in err and "resume from a checkpoint draftsmith wrote" in err
    assert ("mkdir" if extra == "callable" else "Custom") in err, err
    assert not marker.exists()  # the callable was never called


def test_rng_pt_holds_plain_types_only(run):
    from torch.serialization import get_unsafe_globals_in_checkpoint

    ck = run[1] / "checkpoints" / "epoch_0_step_2"
    assert get_unsafe_globals_in_checkpoint(ck / "rng.pt") == []
    assert get_unsafe_globals_in_checkpoint(ck / "optim.pt") == []


def old_format(state: dict) -> dict:
    """``state`` as rng.pt held it before this format: numpy's own get_state() tuple, an ndarray inside."""
    algo, keys, pos, has_gauss, cached = state["numpy"]
    return {**state, "numpy": (algo, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)}


def draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), np.random.random_sample(3).tolist()


def test_an_old_rng_pt_with_a_numpy_array_resumes(run, tmp_path):
    out, ck = copy_run(run, tmp_path)
    saved = rng_state()
    expected = draws()
    torch.save({**old_format(saved), "ranks": [old_format(saved)]}, ck / "rng.pt")
    rng = load_checkpoint(ck)["rng"]
    assert isinstance(rng["numpy"][1], np.ndarray)
    set_rng_state(rng)
    assert draws() == expected
    r = cli("train", run[0], "--set", f"output.dir={out}", "--set", "train.max_steps=3", "--resume", "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]


def test_an_rng_pt_written_under_numpy_1_names_loads(tmp_path):
    # numpy 1.x pickles its array constructor as numpy.core.multiarray._reconstruct (numpy 2: numpy._core).
    torch.save(old_format(rng_state()), tmp_path / "rng.pt")
    with zipfile.ZipFile(tmp_path / "rng.pt") as z:
        members = {i: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(tmp_path / "rng.pt", "w") as z:
        for info, data in members.items():
            if info.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data or b"numpy.core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            z.writestr(info, data)
    from draftsmith.train.checkpoint import _load_plain, _old_numpy_rng_globals

    state = _load_plain(tmp_path / "rng.pt", _old_numpy_rng_globals())
    assert state["numpy"][1].dtype == np.uint32 and len(state["numpy"][1]) == 624
