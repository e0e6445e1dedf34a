"""serve-target as a real process: endpoints, 409 before /vocab-map, size limits before reading,
bearer-token auth, bind rules, and a fuzz of 10,000 malformed frames (all 4xx, server up, RSS bounded)."""

import argparse
import http.client
import json
import random
import socket
import struct
import subprocess
import sys

import pytest
import torch

from deadline import HANG_S
from draftsmith.remote import wire
from draftsmith.remote.client import RemoteEngine, RemoteError
from draftsmith.remote.server import ServeTargetError, check_bind, engine_device, is_loopback
from draftsmith.targets.hf import HFEngine
from fixtures import make_tiny_llama, make_tokenizer
from remote_helpers import SRC, ServerProc

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("srv") / "target", make_tokenizer("chatml"))


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("tok") / "token"
    token_file.write_text(TOKEN + "\n")
    s = ServerProc(target, extra=["--auth-token-file", str(token_file), "--max-body-mb", "1", "--num-threads", "1"])
    try:
        yield s, token_file
    finally:
        s.kill()


def post(conn, path, body, headers=AUTH):
    conn.request("POST", path, body=body, headers={"Content-Length": str(len(body)), **headers})
    r = conn.getresponse()
    return r.status, r.read()


def batch_frame(meta, ids=None):
    ids = torch.tensor([[5, 6, 7, 8]]) if ids is None else ids
    return wire.encode({"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}, meta)


def test_info_health_embeddings_and_409_before_vocab_map(server, target):
    s, _ = server
    info = s.get("/info", AUTH)
    assert (info["num_layers"], info["hidden_size"], info["vocab_size"], info["aux_layer_ids"], info["engine"]) == \
        (6, 64, 384, [1, 3, 4], "hf")
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=HANG_S)
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": "0123456789abcdef"}))
    assert status == 409 and "POST /vocab-map first" in json.loads(data)["error"]
    status, data = post(conn, "/vocab-map", wire.encode({"draft_ids": torch.tensor([1, 5, 9])}))
    assert status == 200 and json.loads(data)["draft_vocab_size"] == 3
    vid = json.loads(data)["vocab_id"]
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": vid}))
    assert status == 200
    probs = wire.decode(data).tensors["target_probs"]
    assert probs.shape == (1, 4, 3) and torch.allclose(probs[0, :3].sum(-1), torch.ones(3))
    assert torch.equal(probs[0, 3], torch.zeros(3))  # shifted: zero tail
    status, data = post(conn, "/vocab-map", wire.encode({"draft_ids": torch.tensor([1, 384])}))
    assert status == 422 and "0..383" in json.loads(data)["error"]
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": vid}, torch.tensor([[999]])))
    assert status == 422 and "input_ids must lie in 0..383" in json.loads(data)["error"]
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": vid}, torch.zeros(1, 513).long()))
    assert status == 422 and "max_position_embeddings 512" in json.loads(data)["error"]
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "medusa", "vocab_id": vid}))
    assert status == 422 and "meta.kind 'medusa' is not a supervision kind this server knows " \
        "(['dflash', 'dflash_kd', 'eagle3'])" in json.loads(data)["error"]
    assert s.get("/info", AUTH)["supervision_kinds"] == ["dflash", "dflash_kd", "eagle3"]
    # DFlash kinds: no vocab_id needed, tensors named by the dataclass fields, nothing shifted.
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "dflash", "layer_ids": [2, 6]}))
    t = wire.decode(data).tensors
    assert status == 200 and list(t) == ["aux_hidden", "input_ids", "loss_mask"]
    assert t["input_ids"].tolist() == [[5, 6, 7, 8]] and t["aux_hidden"].shape[:3] == (1, 4, 2)
    status, data = post(conn, "/features", batch_frame({"mode": "supervision", "kind": "dflash_kd", "layer_ids": [2]}))
    t = wire.decode(data).tensors
    assert status == 200 and list(t) == ["aux_hidden", "input_ids", "loss_mask", "last_hidden"]
    assert t["aux_hidden"].shape[:3] == (1, 4, 1)  # the ids asked for; id L comes as last_hidden, no (B, S, V)
    assert t["last_hidden"].shape == (1, 4, 64) and t["last_hidden"].dtype == torch.float32
    status, data = post(conn, "/features", batch_frame({"mode": "features", "layer_ids": [7]}))
    assert status == 422 and "layer id 7 is out of range" in json.loads(data)["error"]
    ids = torch.tensor([[5, 6, 7, 8]])
    status, data = post(conn, "/features", wire.encode(
        {"input_ids": ids, "attention_mask": ids.clone(), "loss_mask": torch.ones_like(ids)}, {"mode": "supervision", "kind": "eagle3", "vocab_id": vid}))
    assert status == 422 and "only 0/1" in json.loads(data)["error"]
    conn.request("GET", "/embeddings", headers=AUTH)
    w = wire.decode(conn.getresponse().read()).tensors
    hf = HFEngine(target)
    assert torch.equal(w["embeddings"], hf.embeddings()) and torch.equal(w["lm_head"], hf.lm_head_weight())
    assert torch.equal(w["final_norm"], hf.final_norm_weight())
    assert s.get("/health", AUTH)["ok"] is True


def raw(port, head: bytes, timeout=HANG_S) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        return sock.recv(4096)


def test_oversized_body_refused_before_it_is_read(server):
    s, _ = server
    # Declares 2 GiB and sends none of it: a server that tried to read it would hang past the timeout.
    head = f"POST /features HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {2 << 30}\r\n\r\n"
    assert raw(s.port, head.encode()).startswith(b"HTTP/1.1 413")
    head = f"POST /features HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    assert raw(s.port, head.encode()).startswith(b"HTTP/1.1 411")


def test_bearer_token_required(server, target):
    s, token_file = server
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=HANG_S)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        conn.request("GET", "/info", headers=headers)
        r = conn.getresponse()
        assert r.status == 401 and b"Bearer" in r.read()
        status, _ = post(conn, "/features", batch_frame({}), headers)
        assert status == 401
    wrong = token_file.parent / "wrong"
    wrong.write_text("nope")
    with pytest.raises(RemoteError, match="token rejected"):
        RemoteEngine(str(target), urls=[s.url], auth_token_file=str(wrong), retries=0)
    with RemoteEngine(str(target), urls=[s.url], auth_token_file=str(token_file)) as eng:
        assert eng.info().num_layers == 6


def test_bind_rules():
    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3")
    check_bind("127.0.0.1", None, False)
    check_bind("0.0.0.0", "tok", False)
    check_bind("0.0.0.0", None, True)
    with pytest.raises(ServeTargetError, match="--auth-token-file F .* or --insecure"):
        check_bind("0.0.0.0", None, False)


def test_device_choice(monkeypatch):
    # --device is checked as train.device is (draftsmith.distributed.resolve_device), errors naming --device
    assert engine_device("auto", "hf") == "cpu"  # tests/conftest.py: auto is the CPU outside gpu tests
    assert engine_device("cpu", "hf") == "cpu" and engine_device("cpu", "cache") == "cpu"  # cache: its features
    assert engine_device("cuda:7", "vllm") is None and engine_device("cuda", "sglang") is None  # they place it
    with pytest.raises(ServeTargetError, match=r"--device 'tpu': expected auto, cpu, cuda or cuda:N"):
        engine_device("tpu", "hf")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ServeTargetError, match=r"--device 'cuda:0': this machine has no CUDA GPU .*; use --device "
                                               r"cpu \(or auto\)"):
        engine_device("cuda:0", "cache")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert engine_device("cuda", "hf") == "cuda:0" and engine_device("cuda:1", "hf") == "cuda:1"
    with pytest.raises(ServeTargetError, match=r"--device 'cuda:2': GPU 2 does not exist \(2 visible\)"):
        engine_device("cuda:2", "hf")


def test_cli_refuses_a_public_bind_without_token_before_loading_the_target(tmp_path):
    from draftsmith.remote.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["serve-target", "--target", str(tmp_path / "absent"), "--host", "0.0.0.0"])
    with pytest.raises(ServeTargetError, match="beyond loopback"):
        args.func(args)
    r = subprocess.run([sys.executable, "-m", "draftsmith.remote.server", "--target", "absent", "--host", "0.0.0.0",
                        "--port", "0"], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": SRC})
    assert r.returncode == 2 and "binding beyond loopback" in r.stderr and "READY" not in r.stdout


def malformed_frames(n: int, seed: int = 0):
    """Yield n frames that are each wrong in some way (never a valid frame with a known vocab id)."""
    rng = random.Random(seed)
    good = bytes(batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": "nope"}))
    hlen = struct.unpack_from("<I", good, 8)[0]
    kinds = ["random", "truncated", "magic", "version", "hlen", "shape", "dtype", "flip", "nbytes"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        if kind == "random":
            yield bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 200)))
        elif kind == "truncated":
            yield good[: rng.randrange(0, len(good))]
        elif kind == "magic":
            yield bytes(rng.getrandbits(8) for _ in range(4)) + good[4:]
        elif kind == "version":
            yield good[:4] + struct.pack("<H", rng.choice([0, 2, 3, 255, 65535])) + good[6:]
        elif kind == "hlen":
            yield good[:8] + struct.pack("<I", rng.choice([0, 1, hlen - 1, hlen + 1, 1 << 31, 0xFFFFFFFF])) + good[12:]
        elif kind in ("shape", "dtype", "nbytes"):
            h = json.loads(good[12 : 12 + hlen])
            e = h["tensors"][rng.randrange(3)]
            if kind == "shape":
                e["shape"] = rng.choice([[1 << 40, 1 << 40], [-1, 4], [1, 4, 1, 1, 1, 1, 1, 1], ["a"], [2**62]])
            elif kind == "dtype":
                e["dtype"] = rng.choice(["object", "float128", "complex64", "", "int64 ", None, 3])
            else:
                e["nbytes"] += rng.choice([-8, 8, 1 << 33])
            hb = json.dumps(h).encode()
            yield good[:8] + struct.pack("<I", len(hb)) + hb + good[12 + hlen :]
        else:
            b = bytearray(good)
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] = rng.getrandbits(8)
            yield bytes(b)


def test_fuzz_10000_malformed_frames_all_4xx_server_up_memory_bounded(server):
    s, _ = server
    conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=HANG_S)
    post(conn, "/features", batch_frame({"mode": "supervision", "kind": "eagle3", "vocab_id": "warm"}))
    rss0 = s.rss_kb()
    statuses = {}
    for body in malformed_frames(10_000):
        status, _ = post(conn, "/features", body)
        statuses[status] = statuses.get(status, 0) + 1
    assert sum(statuses.values()) == 10_000 and all(400 <= k < 500 for k in statuses), statuses
    assert s.proc.poll() is None and s.get("/health", AUTH)["ok"] is True
    assert s.rss_kb() - rss0 < 64 * 1024, (rss0, s.rss_kb())  # bounded: no per-request growth
