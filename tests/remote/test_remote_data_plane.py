"""The data plane wired into /features, end to end with real serve-target processes over gloo (the CPU
backend of the same protocol NCCL uses on GPUs): bitwise parity with co-located supervision and with
the wire, fallback to the wire, handshake input checks, a client that dies mid-session, and kill -9 of
a server mid-run with the same final weights."""

import http.client
import json
import os
import socket
import threading
import time
import uuid

import pytest
import torch

from deadline import HANG_S
from draftsmith.remote.client import RemoteEngine
from draftsmith.remote.nccl import Channel, join_store, nccl_usable
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine
from draftsmith.train.loop import train
from remote_helpers import AUX, ServerProc
from remote_train import final_weights, same_weights, tiny_target_and_servers, train_config
from test_remote_faults import kill_on_call, up
from test_remote_parity import FIELDS, batches
from test_remote_server import batch_frame


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with tiny_target_and_servers(tmp_path_factory.mktemp("plane")) as got:
        yield got


def transfers(servers) -> list:
    return [s.get("/health")["plane_transfers"] for s in servers]


def counter_reaches(servers, key: str, want: int, timeout_s: float = HANG_S) -> int:
    """The sum of /health ``key`` over ``servers`` once it reaches ``want`` (or at the hang guard). A server
    counts a transfer after its send returns, which can be just after the client holds the tensors."""
    deadline = time.monotonic() + timeout_s
    while (got := sum(s.get("/health")[key] for s in servers)) < want and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def post_json(port, path, obj):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=HANG_S)
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    conn.request("POST", path, body=body, headers={"Content-Length": str(len(body))})
    r = conn.getresponse()
    return r.status, r.read(), conn


@pytest.mark.parametrize("n_servers,prefetch", [(1, 0), (2, 2)])
def test_gloo_plane_supervision_bitwise_equal_to_co_located(pair, n_servers, prefetch):
    target, _, servers = pair
    up(servers)
    hf, bs = HFEngine(target), batches()
    draft_ids = torch.tensor(sorted(set(range(0, 384, 5)) | {7, 11}))
    before = transfers(servers)
    with RemoteEngine(str(target), urls=[s.url for s in servers[:n_servers]], prefetch_depth=prefetch,
                      data_plane="gloo") as eng:
        assert eng.plane == "gloo"
        eng.set_vocab_map(draft_ids)
        got = list(eng.supervision("eagle3", iter(bs), AUX))
        raw = eng.features(bs[0], [0, 6], logits=True)  # raw-features mode rides the same channel
    want = sum(before) + len(bs) + 1  # every answer crossed the channel, none the wire
    assert counter_reaches(servers, "plane_transfers", want) == want
    for b, (rb, sup) in zip(bs, got):
        ref = eagle3_supervision(b, hf.features(b, AUX, logits=True), draft_ids)
        for f in FIELDS:
            assert getattr(sup, f).dtype == getattr(ref, f).dtype and torch.equal(getattr(sup, f), getattr(ref, f)), f
    ref = hf.features(bs[0], [0, 6], logits=True)
    assert torch.equal(raw.aux_hidden, ref.aux_hidden) and torch.equal(raw.logits, ref.logits)


@pytest.mark.skipif(nccl_usable(), reason="this machine has CUDA (test_remote_nccl_gpu.py covers it)")
def test_nccl_without_cuda_falls_back_to_the_wire_and_says_why(pair, capsys):
    target, _, servers = pair
    up(servers)
    before = transfers(servers)
    with RemoteEngine(str(target), urls=[servers[0].url], data_plane="nccl") as eng:
        assert eng.plane == "wire" and "no CUDA" in eng.plane_reason
        eng.set_vocab_map(None)
        b = batches(1)[0]
        sup = eng.supervise("eagle3", b, AUX)
    assert "data plane nccl not used" in capsys.readouterr().err
    assert transfers(servers) == before and sup.target_probs.shape[-1] == 384


def test_handshake_input_is_checked(pair):
    _, _, servers = pair
    up(servers)
    port = servers[0].port
    assert post_json(port, "/data-plane", {"session": "../etc", "plane": "gloo"})[0] == 422
    if not nccl_usable():
        status, data, _ = post_json(port, "/data-plane", {"session": uuid.uuid4().hex, "plane": "nccl"})
        assert status == 422 and "not offered" in json.loads(data)["error"]  # no CUDA on this server
    status, data, _ = post_json(port, "/data-plane", {"session": uuid.uuid4().hex, "plane": "carrier-pigeon"})
    assert status == 422
    assert post_json(port, "/data-plane", b"\xff{not json")[0] == 400
    assert post_json(port, "/data-plane", [1, 2])[0] == 400
    assert post_json(port, "/disconnect", b"garbage")[0] == 400
    status, data, _ = post_json(port, "/features", bytes(batch_frame({"mode": "features", "session": uuid.uuid4().hex})))
    assert status == 409 and "POST /data-plane again" in json.loads(data)["error"]
    assert json.loads(data)["redo"] == "data-plane"
    status, data, _ = post_json(port, "/features", bytes(batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": "0" * 16})))
    assert status == 409 and json.loads(data)["redo"] == "vocab-map"


def socket_inodes(pids) -> set:
    """The inodes of the sockets the processes ``pids`` hold open (their /proc/<pid>/fd links)."""
    out = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                link = os.readlink(f"{fd_dir}/{name}")
            except OSError:  # closed while we looked
                continue
            if link.startswith("socket:["):
                out.add(link[len("socket:["):-1])
    return out


def listeners_beyond_loopback(pids) -> set:
    """(address, port) of every listening TCP socket not on loopback that one of ``pids`` holds: only this
    test's processes count, since another test (another pytest-xdist worker, a vLLM server) may listen on
    any address of the same network namespace meanwhile."""
    mine, out = socket_inodes(pids), set()
    for path, loopback in (("/proc/net/tcp", "0100007F"), ("/proc/net/tcp6", "00000000000000000000000001000000")):
        try:
            lines = open(path).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            addr, port = local.split(":")
            if state == "0A" and addr != loopback and inode in mine:  # 0A = LISTEN
                out.add((addr, int(port, 16)))
    return out


def test_the_listener_check_sees_this_process_listening_on_every_address():
    """The check below can fail: a socket of this process listening on 0.0.0.0 (no traffic is sent) is seen."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        assert ("00000000", s.getsockname()[1]) in listeners_beyond_loopback([os.getpid()])
        assert ("00000000", s.getsockname()[1]) not in listeners_beyond_loopback([])


def test_a_loopback_server_opens_its_channel_on_loopback_only(pair):
    target, _, servers = pair
    up(servers)
    pids = [os.getpid(), servers[0].proc.pid]
    before = listeners_beyond_loopback(pids)
    with RemoteEngine(str(target), urls=[servers[0].url], data_plane="gloo") as eng:
        eng.set_vocab_map(None)
        eng.supervise("eagle3", batches(1)[0], AUX)
        assert eng.servers[0].channel is not None
        assert socket_inodes(pids)  # the check sees the sockets these processes hold
        assert listeners_beyond_loopback(pids) == before  # store and gloo pair bound to 127.0.0.1, not *


def test_client_gone_mid_session_closes_it_and_the_server_stays_up(pair):
    _, _, servers = pair
    up(servers)
    s, sid = servers[0], uuid.uuid4().hex
    status, data, _ = post_json(s.port, "/data-plane", {"session": sid, "plane": "gloo"})
    assert status == 200
    client = Channel("gloo", join_store("127.0.0.1", json.loads(data)["store_port"], 10.0), 1, 10.0)
    client.recv_probe()
    client.close()  # the client process "dies" before its next transfer
    failures = s.get("/health")["plane_failures"]
    status, data, _ = post_json(s.port, "/features", bytes(batch_frame({"mode": "features", "session": sid,
                                                                        "logits": True})))
    assert status == 200 and json.loads(bytes(data[12:]).decode().strip())["meta"]["plane"] == "gloo"
    # the failed send is noticed right after the header went out
    assert counter_reaches([s], "plane_failures", failures + 1) == failures + 1
    status, _, _ = post_json(s.port, "/features", bytes(batch_frame({"mode": "features", "session": sid})))
    assert status == 409 and s.proc.poll() is None  # the session is gone, the server is not


def kill_in_transfer(monkeypatch, n: int, victim):
    """kill -9 ``victim`` when the client starts its n-th channel receive from it (the header already
    arrived, the tensors have not been read); returns the count of all receives."""
    calls, from_victim, current = [0], [0], threading.local()
    original_call, original_recv = RemoteEngine._features_call, Channel.recv

    def features_call(self, s, tensors, meta):
        current.url = s.url
        return original_call(self, s, tensors, meta)

    def recv(self, plan):
        calls[0] += 1
        if getattr(current, "url", None) == victim.url:
            from_victim[0] += 1
            if from_victim[0] == n:
                victim.kill9()
        return original_recv(self, plan)

    monkeypatch.setattr(RemoteEngine, "_features_call", features_call)
    monkeypatch.setattr(Channel, "recv", recv)
    return calls


@pytest.mark.slow
@pytest.mark.parametrize("when", ["before-request", "in-transfer"])
def test_kill9_mid_run_over_gloo_same_weights_and_restart_rejoins(pair, tmp_path, monkeypatch, when):
    target, data, servers = pair
    up(servers)
    ref = train(train_config(target, data, tmp_path / "co"), progress=False)
    if when == "before-request":
        calls = kill_on_call(monkeypatch, 3, [servers[0]])
    else:
        calls = kill_in_transfer(monkeypatch, 2, servers[0])
    res = train(train_config(target, data, tmp_path / "remote", "remote", [s.url for s in servers],
                             prefetch_depth=2, remote_backoff_s=0.05, remote_data_plane="gloo"), progress=False)
    assert servers[0].proc.poll() is not None and calls[0] >= 7
    assert res.history == ref.history and same_weights(final_weights(res), final_weights(ref))
    assert servers[1].get("/health")["plane_transfers"] >= 5
    monkeypatch.undo()
    servers[0].restart()
    with RemoteEngine(str(target), urls=[servers[0].url], data_plane="gloo") as eng:
        eng.set_vocab_map(None)
        b = batches(1)[0]
        sup = eng.supervise("eagle3", b, AUX)
    ref_sup = eagle3_supervision(b, HFEngine(target).features(b, AUX, logits=True), None)
    assert all(torch.equal(getattr(sup, f), getattr(ref_sup, f)) for f in FIELDS)
    assert counter_reaches(servers[:1], "plane_transfers", 1) == 1


def handshake_and_join(port, timeout_s=10.0):
    sid = uuid.uuid4().hex
    status, data, _ = post_json(port, "/data-plane", {"session": sid, "plane": "gloo"})
    assert status == 200, data
    channel = Channel("gloo", join_store("127.0.0.1", json.loads(data)["store_port"], timeout_s), 1, timeout_s)
    channel.recv_probe()
    return sid, channel


def features_status(port, sid):
    return post_json(port, "/features", bytes(batch_frame({"mode": "features", "session": sid})))[0]


def test_handshakes_are_bounded_and_only_ready_sessions_are_evicted(pair, monkeypatch):
    from draftsmith.remote import client as client_mod
    from draftsmith.remote.server import MAX_CHANNELS, MAX_PENDING

    target = pair[0]
    monkeypatch.setattr(client_mod, "PLANE_BUSY_RETRY_S", 0.5)
    s = ServerProc(target, extra=["--num-threads", "1", "--data-plane-timeout-s", "2"])
    try:
        # Handshakes whose client never joins hold a slot until the timeout; one more is a 429.
        for _ in range(MAX_PENDING):
            assert post_json(s.port, "/data-plane", {"session": uuid.uuid4().hex, "plane": "gloo"})[0] == 200
        status, data, _ = post_json(s.port, "/data-plane", {"session": uuid.uuid4().hex, "plane": "gloo"})
        assert status == 429 and "already waiting" in json.loads(data)["error"]
        # A client meeting the busy server uses the wire for now and tries the channel again later.
        with RemoteEngine(str(target), urls=[s.url], data_plane="gloo") as eng:
            eng.set_vocab_map(None)
            eng.supervise("eagle3", batches(1)[0], AUX)
            assert eng.servers[0].channel is None and not eng.servers[0].plane_failed
            assert s.get("/health")["plane_transfers"] == 0
            time.sleep(3.0)  # past --data-plane-timeout-s: the abandoned handshakes gave their slots back
            eng.supervise("eagle3", batches(1)[0], AUX)
            assert eng.servers[0].channel is not None and counter_reaches([s], "plane_transfers", 1) == 1
        # MAX_CHANNELS + 1 joined sessions: the oldest ready one is closed, the others still answer.
        opened = [handshake_and_join(s.port) for _ in range(MAX_CHANNELS + 1)]
        assert features_status(s.port, opened[0][0]) == 409
        sid, channel = opened[-1]
        status, data, _ = post_json(s.port, "/features", bytes(batch_frame({"mode": "features", "session": sid})))
        assert status == 200
        meta = json.loads(bytes(data[12:]).decode().strip())["meta"]
        from draftsmith.remote.nccl import transfer_plan
        got = channel.recv(transfer_plan(meta["transfer"]))
        assert got["aux_hidden"].shape[:2] == (1, 4)
        assert s.get("/health")["ok"] and s.proc.poll() is None
        for _, ch in opened:
            ch.close()
    finally:
        s.kill()
