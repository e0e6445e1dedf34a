"""The NCCL data plane on a real GPU (skipped without CUDA; CI has none, a GPU machine runs it).

With two GPUs the servers take GPU 1 and the test process GPU 0. On a one-GPU machine NCCL refuses
two ranks of one host on one device ("Duplicate GPU"), so each process gets its own NCCL_HOSTID:
NCCL then sees two hosts and moves the bytes through its socket transport on lo, which exercises
the same group construction, blocking-wait timeouts and aborts as two GPUs would. Only there is the
client's same-GPU check bypassed (it would rightly pick the wire).
"""

import json
import os
import subprocess
import sys
import uuid

import pytest
import torch

from draftsmith.remote import client as client_mod
from draftsmith.remote.client import RemoteEngine
from draftsmith.remote.nccl import nccl_usable
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer
from remote_helpers import AUX, SRC, start_servers
from remote_train import final_weights, same_weights, train_config, write_chats
from test_remote_data_plane import counter_reaches, features_status, kill_in_transfer, post_json
from test_remote_parity import FIELDS, batches
from test_remote_server import batch_frame

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not nccl_usable(), reason="needs CUDA and an NCCL-enabled torch")]
TIMEOUT = ["--data-plane-timeout-s", "15"]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory):
    """(target, chats, [cpu-target server x2], cuda-target server), the client set up for NCCL."""
    root, mp = tmp_path_factory.mktemp("nccl_gpu"), pytest.MonkeyPatch()
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"))
    servers = []
    try:
        one_gpu = torch.cuda.device_count() < 2
        mp.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "0") if one_gpu else "1")
        if one_gpu:
            mp.setenv("NCCL_HOSTID", "draftsmith-test-server")
        cpu_target = start_servers(target, 2, ["--num-threads", "1", "--device", "cpu", *TIMEOUT])
        servers += cpu_target
        cuda_target = start_servers(target, 1, ["--num-threads", "1", "--device", "cuda", *TIMEOUT])[0]
        servers.append(cuda_target)
        mp.undo()  # the test process keeps its own GPU (already initialised) and host id
        mp = pytest.MonkeyPatch()
        mp.setenv("NCCL_SOCKET_IFNAME", "lo")
        if one_gpu:
            mp.setenv("NCCL_HOSTID", "draftsmith-test-client")
            mp.setattr(client_mod, "cuda_uuid", lambda device=None: "not-the-servers-gpu")
        yield target, write_chats(root / "chats.jsonl"), cpu_target, cuda_target
    finally:
        mp.undo()
        for s in servers:
            s.kill()


def test_nccl_supervision_bitwise_equal_to_co_located(gpu):
    target, _, cpu_servers, _ = gpu
    hf, bs = HFEngine(target), batches()
    draft_ids = torch.tensor(sorted(set(range(0, 384, 5)) | {7, 11}))
    before = sum(s.get("/health")["plane_transfers"] for s in cpu_servers)
    with RemoteEngine(str(target), urls=[s.url for s in cpu_servers], prefetch_depth=2) as eng:  # auto
        assert eng.plane == "nccl", eng.plane_reason
        eng.set_vocab_map(draft_ids)
        got = list(eng.supervision("eagle3", iter(bs), AUX))
        raw = eng.features(bs[0], [0, 6], logits=True)
    for b, (_, sup) in zip(bs, got):
        ref = eagle3_supervision(b, hf.features(b, AUX, logits=True), draft_ids)
        for f in FIELDS:
            t = getattr(sup, f)
            assert t.device.type == "cuda", f  # delivered on this side's GPU
            assert t.dtype == getattr(ref, f).dtype and torch.equal(t.cpu(), getattr(ref, f)), f
    ref = hf.features(bs[0], [0, 6], logits=True)
    assert torch.equal(raw.aux_hidden.cpu(), ref.aux_hidden) and torch.equal(raw.logits.cpu(), ref.logits)
    assert counter_reaches(cpu_servers, "plane_transfers", before + len(bs) + 1) == before + len(bs) + 1


def test_cuda_target_over_nccl_equals_the_wire(gpu):
    target, _, _, cuda_server = gpu
    assert cuda_server.get("/info")["cuda"]
    bs = batches(3)
    with RemoteEngine(str(target), urls=[cuda_server.url], data_plane="nccl") as eng:
        assert eng.plane == "nccl"
        eng.set_vocab_map(None)
        over_nccl = [eng.supervise("eagle3", b, AUX) for b in bs]
    with RemoteEngine(str(target), urls=[cuda_server.url], data_plane="wire") as eng:
        eng.set_vocab_map(None)
        over_wire = [eng.supervise("eagle3", b, AUX) for b in bs]
    hf = HFEngine(target)
    for b, a, w in zip(bs, over_nccl, over_wire):
        ref = eagle3_supervision(b, hf.features(b, AUX, logits=True), None)
        for f in FIELDS:
            assert torch.equal(getattr(a, f).cpu(), getattr(w, f)), f  # same server, same bytes
            assert torch.allclose(getattr(w, f).double(), getattr(ref, f).double(), atol=1e-4), f  # GPU vs CPU


CLIENT = """
import json, sys, time, torch
from draftsmith.remote.nccl import Channel, join_store
port, timeout = int(sys.argv[1]), float(sys.argv[2])
torch.cuda.set_device(0)
ch = Channel("nccl", join_store("127.0.0.1", port, timeout), 1, timeout)
ch.recv_probe()
print("JOINED", flush=True)
time.sleep(600)
"""


def test_client_killed_after_the_handshake_server_survives_and_serves_nccl(gpu):
    target, _, cpu_servers, _ = gpu
    s, sid = cpu_servers[0], uuid.uuid4().hex
    status, data, _ = post_json(s.port, "/data-plane", {"session": sid, "plane": "nccl"})
    assert status == 200, data
    env = {**os.environ, "PYTHONPATH": SRC, "NCCL_SOCKET_IFNAME": "lo"}
    client = subprocess.Popen([sys.executable, "-c", CLIENT, str(json.loads(data)["store_port"]), "30"],
                              stdout=subprocess.PIPE, env=env)
    try:
        assert client.stdout.readline().strip() == b"JOINED"
        client.kill()  # kill -9 of the trainer holding the session
        client.wait(timeout=10)
        failures = s.get("/health")["plane_failures"]
        # The server sends into a dead peer: its wait must raise (blocking-wait mode), not abort the process.
        status, _, _ = post_json(s.port, "/features", bytes(batch_frame({"mode": "features", "session": sid,
                                                                            "logits": True})))
        assert status == 200
        assert counter_reaches([s], "plane_failures", failures + 1, timeout_s=60) == failures + 1
        assert s.proc.poll() is None and s.get("/health")["ok"]
        assert features_status(s.port, sid) == 409
    finally:
        client.kill()
    # The GPU and the server are still good for a new session.
    with RemoteEngine(str(target), urls=[s.url], data_plane="nccl") as eng:
        eng.set_vocab_map(None)
        sup = eng.supervise("eagle3", batches(1)[0], AUX)
    ref = eagle3_supervision(batches(1)[0], HFEngine(target).features(batches(1)[0], AUX, logits=True), None)
    assert all(torch.equal(getattr(sup, f).cpu(), getattr(ref, f)) for f in FIELDS)


def test_kill9_server_mid_transfer_over_nccl_same_weights(gpu, tmp_path, monkeypatch):
    target, data, cpu_servers, _ = gpu
    ref = train(train_config(target, data, tmp_path / "co"), progress=False)
    calls = kill_in_transfer(monkeypatch, 2, cpu_servers[0])
    res = train(train_config(target, data, tmp_path / "remote", "remote", [s.url for s in cpu_servers],
                             prefetch_depth=2, remote_backoff_s=0.05, remote_data_plane="nccl",
                             remote_timeout_s=30), progress=False)
    assert cpu_servers[0].proc.poll() is not None and calls[0] >= 7
    assert res.history == ref.history and same_weights(final_weights(res), final_weights(ref))
