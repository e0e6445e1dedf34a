"""Training on GPUs (skipped without CUDA; CI has none, a lent GPU machine runs them): the draft and
a co-located target on cuda with bf16 autocast (EAGLE-3 and the DFlash family), DDP and FSDP2 over
the GPUs present (NCCL; EAGLE-3 and DFlash), and NCCL supervision from serve-target landing on the
draft's GPU with no host copy. `make gpu-check` runs them (`pytest -m gpu`)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from draftsmith.config import build_config
from draftsmith.train import loop
from draftsmith.train.loop import Trainer, train
from fixtures import make_tiny_llama, make_tokenizer
from test_loop import write_chats
from test_parallel import assert_close_weights, weights

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    return target, write_chats(root / "chats.jsonl", n=30)


# the DFlash family on the 6-layer target (as tests/train/test_train_dflash.py): block 4, 2 draft layers
DFLASH = {"type": "dflash", "mask_token_id": 5, "block_size": 4, "num_draft_layers": 2, "num_anchors": 4}


def config(tiny, out, family="eagle3", **train):
    target, data = tiny
    dflash = family == "dflash"
    return {"target": {"path": str(target), "aux_layer_ids": None if dflash else [1, 3, 4]},
            "data": {"sources": [str(data)], "max_length": 64, "eval_size": 4, "draft_vocab_size": 96},
            "draft": DFLASH if dflash else {"ttt_steps": 3},
            "train": {"epochs": 1, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, **train},
            "output": {"dir": str(out), "tensorboard": False}}


def torchrun(raw: dict, path: Path, n: int) -> str:
    """``torchrun --nproc-per-node n -m draftsmith train`` on ``raw``; its stdout (the run must succeed)."""
    path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
                          "-m", "draftsmith", "train", str(path), "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    return out.stdout


def test_draft_and_target_on_cuda_with_bf16_autocast(tiny, tmp_path, monkeypatch):
    trainer = Trainer(build_config(config(tiny, tmp_path / "run")), progress=False)  # device auto
    try:
        assert trainer.device.type == "cuda" and trainer.bf16  # auto: bf16 on CUDA
        assert all(p.device.type == "cuda" for p in trainer.draft.parameters())
        assert next(trainer.engine.model.parameters()).device.type == "cuda"  # the co-located target
        seen = []
        real = torch.autocast

        def spy(device_type, *a, **k):
            seen.append((device_type, k.get("dtype"), k.get("enabled")))
            return real(device_type, *a, **k)

        monkeypatch.setattr(loop.torch, "autocast", spy)
        result = trainer.run()
    finally:
        trainer.engine.close()
    assert ("cuda", torch.bfloat16, True) in seen
    assert result.step == 13 and all(torch.isfinite(torch.tensor(loss)) for _, loss in result.history)  # 26 rows / 2
    assert all(w.dtype == torch.float32 for w in weights(tmp_path / "run").values() if w.is_floating_point())


def test_dflash_draft_and_target_on_cuda(tiny, tmp_path):
    trainer = Trainer(build_config(config(tiny, tmp_path / "run", "dflash")), progress=False)  # device auto
    try:
        assert trainer.device.type == "cuda" and trainer.bf16
        assert all(p.device.type == "cuda" for p in trainer.draft.parameters())
        result = trainer.run()
    finally:
        trainer.engine.close()
    assert result.step == 13 and all(torch.isfinite(torch.tensor(loss)) for _, loss in result.history)


@pytest.mark.parametrize("family,how", [("eagle3", "ddp"), ("eagle3", "fsdp2"), ("dflash", "ddp"), ("dflash", "fsdp2")])
def test_ranks_over_the_gpus_present_reach_one_process_weights(tiny, tmp_path, family, how):
    # two ranks at most: NCCL across GPUs is what is checked, and `make gpu-check` stays within its minutes
    n = min(torch.cuda.device_count(), 2)
    if n < 2:
        pytest.skip(f"{how} over NCCL needs 2 GPUs (NCCL refuses two ranks on one device); {n} visible")
    one = config(tiny, tmp_path / "one", family, batch_size=2 * n, bf16=False)
    train(build_config(one), progress=False)
    out = torchrun(config(tiny, tmp_path / "many", family, bf16=False, parallel=how), tmp_path / "many.yaml", n)
    assert f"{n} rank(s) x batch 2 x grad_accum 1 = global batch {2 * n} ({how}, nccl, device cuda:0" in out
    assert_close_weights(weights(tmp_path / "one"), weights(tmp_path / "many"), rel=1e-4)  # GPU reductions reorder


def test_nccl_supervision_lands_on_the_drafts_gpu_without_a_host_copy(tiny, tmp_path, monkeypatch):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote"))
    from remote_helpers import start_servers

    from draftsmith.remote.nccl import nccl_usable

    if not nccl_usable():
        pytest.skip("torch without NCCL")
    target, _ = tiny
    one_gpu = torch.cuda.device_count() < 2
    if one_gpu:  # two processes on one GPU: NCCL's socket transport, as in test_remote_nccl_gpu
        monkeypatch.setenv("NCCL_HOSTID", "draftsmith-test-server")
    servers = start_servers(target, 1, ["--num-threads", "1", "--device", "cpu"])
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "lo")
    if one_gpu:
        from draftsmith.remote import client as client_mod

        monkeypatch.setenv("NCCL_HOSTID", "draftsmith-test-client")
        monkeypatch.setattr(client_mod, "cuda_uuid", lambda device=None: "not-the-servers-gpu")
    arrived = []
    real = loop.supervision_to

    def spy(sup, device):
        moved = real(sup, device)
        arrived.append(moved is sup)  # supervision_to returns sup itself when nothing had to move
        return moved

    from draftsmith.remote import client as client_mod

    monkeypatch.setattr(loop, "supervision_to", spy)  # the trainer's move to the draft's device ...
    monkeypatch.setattr(client_mod, "supervision_to", spy)  # ... and the client's (wire tensors would move here)
    try:
        raw = config(tiny, tmp_path / "remote", device="cuda:0")
        raw["target"].update(engine="remote", remote_urls=[servers[0].url], remote_data_plane="nccl")
        trainer = Trainer(build_config(raw), progress=False)
        try:
            assert trainer.engine.plane == "nccl", trainer.engine.plane_reason
            trainer.run()
        finally:
            trainer.engine.close()
    finally:
        for s in servers:
            s.kill()
    assert len(arrived) >= 14 and all(arrived)  # every micro-batch arrived on cuda:0: nothing moved
