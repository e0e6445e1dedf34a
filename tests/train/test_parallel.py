"""Training on several ranks (torchrun, gloo on the CPU): DDP and FSDP2 reach the weights of one
process holding the same global batch; kill -9 of a rank leaves a complete LATEST that resumes to the
uninterrupted run; resume across world sizes keeps the global data order; remote == co-located."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from draftsmith.config import build_config
from draftsmith.train.checkpoint import latest_checkpoint, load_checkpoint
from draftsmith.train.loop import train
from draftsmith.train.parallel import rank_share, row_seed
from deadline import HANG_S
from fixtures import make_tiny_llama, make_tokenizer
from torchrun_helpers import SRC, env as torchrun_env, run_job
from test_loop import write_chats

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("restore_threads")]

PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}
DRAFTS = {"eagle3": {"ttt_steps": 3}, "peagle": PEAGLE}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("par")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    return target, write_chats(root / "chats.jsonl", n=30)  # 26 train / 4 held out: an odd last global batch


def config(tiny, out, family="eagle3", **train):
    target, data = tiny
    return {
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 4, "draft_vocab_size": 96},
        "draft": DRAFTS[family],
        "train": {"epochs": 1, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "num_threads": 1, "device": "cpu",
                  **train},
        "output": {"dir": str(out), "tensorboard": False},
    }


def torchrun(raw: dict, path: Path, nproc: int = 2, *args: str, wait: bool = True, timeout: float = HANG_S,
             cli: bool = False):
    """``torchrun --nproc-per-node nproc -m draftsmith train path`` on a config written from ``raw``
    (``cli``: through ``draftsmith train path --nproc nproc``, which execs the same)."""
    path.write_text(yaml.safe_dump(raw))
    env = {**torchrun_env(), "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--standalone",
           "-m", "draftsmith", "train", str(path), "--no-progress", *args]
    if cli:
        cmd = [sys.executable, "-m", "draftsmith", "train", str(path), "--nproc", str(nproc), "--no-progress", *args]
    if not wait:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    done = run_job(cmd, env, timeout, merge=True)  # a hang fails with the workers' stacks
    assert done.returncode == 0, done.stdout[-4000:]
    return done.stdout


def weights(run: Path) -> dict:
    ck = latest_checkpoint(run / "checkpoints")
    return load_file(str(ck / "model" / "consolidated" / "model.safetensors"))


def assert_close_weights(a: dict, b: dict, rel: float = 1e-6) -> float:
    """Same keys; integer tensors equal; all float weights within ``rel`` (||a - b|| / ||a||)."""
    assert a.keys() == b.keys()
    floats = [k for k in a if a[k].is_floating_point()]
    for k in set(a) - set(floats):
        assert torch.equal(a[k], b[k]), k
    diff = torch.cat([(a[k] - b[k]).flatten() for k in floats]).norm()
    ratio = float(diff / torch.cat([a[k].flatten() for k in floats]).norm())
    assert ratio < rel, ratio
    return ratio


def test_rank_share_and_row_seed_do_not_depend_on_the_world():
    rows = [7, 3, 9]  # a global batch of 3 for 2 ranks x batch 2
    assert rank_share(rows, 2, 0) == ([7, 3], 1.0)
    assert rank_share(rows, 2, 1) == ([9], 1.0)
    assert rank_share(rows, 2, 2) == ([7], 0.0)  # a rank left without rows runs one at weight 0
    assert row_seed(0, 1, 5) == row_seed(0, 1, 5) != row_seed(0, 1, 6) != row_seed(0, 2, 5)


@pytest.mark.parametrize("family,how", [("eagle3", "ddp"), ("eagle3", "fsdp2"), ("peagle", "ddp"), ("peagle", "fsdp2")])
def test_two_ranks_of_batch_2_equal_one_rank_of_batch_4(tiny, tmp_path, family, how):
    one = train(build_config(config(tiny, tmp_path / "one", family, batch_size=4)), progress=False)
    out = torchrun(config(tiny, tmp_path / "two", family, parallel=how), tmp_path / "two.yaml")
    assert f"2 rank(s) x batch 2 x grad_accum 1 = global batch 4 ({how}, gloo, device cpu" in out
    assert out.count("trained 7 steps") == 1  # rank 0 alone reports
    assert_close_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))
    meta = json.loads((latest_checkpoint(tmp_path / "two" / "checkpoints") / "meta.json").read_text())
    assert meta["world_size"] == 2 and meta["global_batch"] == 4 and meta["parallel"] == how
    rng = torch.load(latest_checkpoint(tmp_path / "two" / "checkpoints") / "rng.pt", weights_only=False)
    assert len(rng["ranks"]) == 2  # every rank's RNG state
    assert one.step == 7 and one.tokens == int(out.split("trained 7 steps (")[1].split(" ")[0])


def test_kill_9_of_one_rank_leaves_a_complete_latest_that_resumes_to_the_uninterrupted_run(tiny, tmp_path):
    raw = config(tiny, tmp_path / "full", epochs=4, save_every=1)  # 28 steps, a checkpoint each
    torchrun(raw, tmp_path / "full.yaml")
    run = tmp_path / "cut"
    proc = torchrun({**raw, "output": {**raw["output"], "dir": str(run)}}, tmp_path / "cut.yaml", wait=False)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait for a few checkpoints, then kill -9 rank 1
            ck = latest_checkpoint(run / "checkpoints")
            if ck is not None and int(ck.name.split("_")[-1]) >= 3:
                break
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.02)
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, workers
        os.kill(int(workers[1]), signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0  # torchrun stopped the job
    assert "exitcode: -9" in out
    ck = latest_checkpoint(run / "checkpoints")
    cut_at = int(ck.name.split("_")[-1])
    assert 3 <= cut_at < 28, cut_at  # killed mid-run
    load_checkpoint(ck)  # complete: every file there and readable
    out = torchrun({**raw, "output": {**raw["output"], "dir": str(run)}}, tmp_path / "cut.yaml", 2, "--resume")
    assert f"from step {cut_at}" in out
    a, b = weights(tmp_path / "full"), weights(run)
    for k in a:
        assert torch.equal(a[k], b[k]), k  # the same ranks, the same reductions: bitwise


def test_resume_across_world_sizes_continues_the_global_order(tiny, tmp_path):
    # 2 ranks x batch 2 -> checkpoint at step 3 -> 1 rank x batch 4: the uninterrupted 2-rank weights
    raw2 = config(tiny, tmp_path / "two", epochs=2, save_every=3)
    torchrun(raw2, tmp_path / "two.yaml")
    mid2 = tmp_path / "two" / "checkpoints" / "epoch_0_step_3"
    assert json.loads((mid2 / "meta.json").read_text())["row_pos"] == 12
    lines = []
    train(build_config(config(tiny, tmp_path / "two_on_one", epochs=2, batch_size=4)), resume=mid2, progress=False,
          announce=lines.append)
    assert any("cut by 2 rank(s), global batch 4; this run has 1 rank(s), global batch 4: the same global order of "
               "conversations continues at conversation 12 of epoch 0" in line for line in lines), lines
    assert_close_weights(weights(tmp_path / "two"), weights(tmp_path / "two_on_one"))
    # ... and the reverse: 1 rank x batch 4 -> checkpoint at step 3 -> 2 ranks x batch 2
    train(build_config(config(tiny, tmp_path / "one", epochs=2, batch_size=4, save_every=3)), progress=False)
    mid1 = tmp_path / "one" / "checkpoints" / "epoch_0_step_3"
    out = torchrun(config(tiny, tmp_path / "one_on_two", epochs=2), tmp_path / "one_on_two.yaml", 2, "--resume", str(mid1))
    assert "cut by 1 rank(s), global batch 4; this run has 2 rank(s), global batch 4" in out
    assert "ranks 1..1 start from rank 0's RNG state" in out
    assert_close_weights(weights(tmp_path / "one"), weights(tmp_path / "one_on_two"))


def test_resume_with_another_global_batch_continues_at_the_same_conversation(tiny, tmp_path):
    raw = config(tiny, tmp_path / "two", epochs=1, save_every=2)
    out = torchrun(raw, tmp_path / "two.yaml", cli=True)  # draftsmith train --nproc 2
    assert "2 rank(s) x batch 2 x grad_accum 1 = global batch 4 (ddp, gloo" in out
    mid = tmp_path / "two" / "checkpoints" / "epoch_0_step_2"  # 8 conversations done
    result = train(build_config(config(tiny, tmp_path / "one", epochs=1, save_every=1)), resume=mid, progress=False)
    first = json.loads((tmp_path / "one" / "checkpoints" / "epoch_0_step_3" / "meta.json").read_text())
    assert first["row_pos"] == 10 and first["global_batch"] == 2  # 8 + one global batch of 2
    assert result.epoch == 1 and result.step == 2 + 9  # the 18 conversations left, 2 at a time


def test_two_ranks_against_two_servers_equal_two_ranks_colocated(tiny, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
    from remote_helpers import start_servers

    target, _ = tiny
    torchrun(config(tiny, tmp_path / "colocated", "peagle"), tmp_path / "colocated.yaml")
    servers = start_servers(target, 2, ["--num-threads", "1"])
    try:
        raw = config(tiny, tmp_path / "remote", "peagle")
        raw["target"].update(engine="remote", remote_urls=[s.url for s in servers], remote_data_plane="wire")
        out = torchrun(raw, tmp_path / "remote.yaml")
    finally:
        for s in servers:
            s.kill()
    assert "trained 7 steps" in out
    assert_close_weights(weights(tmp_path / "colocated"), weights(tmp_path / "remote"))


def test_nproc_bad_values_are_refused(tmp_path, monkeypatch, capsys):
    from draftsmith.cli import main

    assert main(["train", "--nproc", "0"]) == 2
    assert "--nproc 0: expected >= 1" in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "--nproc", "2"]) == 2
    assert "--nproc inside a torchrun job" in capsys.readouterr().err
    monkeypatch.setenv("RANK", "x")  # checked before the target loads
    assert main(["train", "--set", f"output.dir={tmp_path}"]) == 2
    assert "environment RANK='x': expected an integer (torchrun sets it)" in capsys.readouterr().err
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    if not torch.cuda.is_available():
        assert main(["train", "--set", "train.device=cuda", "--set", f"output.dir={tmp_path}"]) == 2
        assert "train.device 'cuda': this machine has no CUDA GPU" in capsys.readouterr().err
    assert main(["train", "--set", "train.device=tpu"]) == 2
    assert "'train.device' = 'tpu': expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err
