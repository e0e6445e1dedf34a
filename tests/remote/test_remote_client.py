"""Client behaviour against in-process servers with a fake engine (no model load): prefetch order and
refill rule, at most one request on the wire per server, start-up errors, config keys."""

import threading
import time

import pytest
import torch

from draftsmith.config import ConfigError, build_config
from draftsmith.remote import client as client_mod
from draftsmith.remote.client import RemoteEngine, RemoteError
from draftsmith.remote.server import TargetService, build_server
from draftsmith.targets import Batch, Features, TargetInfo
from draftsmith.targets.contract import TargetError


class FakeEngine:
    """aux (B, S, n, H=4) = input_id + layer id; logits one-hot-ish over V=16; ``delay_s`` per forward."""

    def __init__(self, delay_s: float = 0.01):
        self.delay_s = delay_s

    def info(self):
        return TargetInfo(num_layers=4, hidden_size=4, vocab_size=16, dtype="float32", model_type="fake", tied=True)

    def features(self, batch, layer_ids, *, logits):
        time.sleep(self.delay_s)
        ids = batch.input_ids.float()
        aux = torch.stack([ids[..., None].expand(*ids.shape, 4) + i for i in layer_ids], dim=2)
        lg = torch.nn.functional.one_hot(batch.input_ids % 16, 16).float() * 3.0 if logits else None
        return Features(aux, lg)

    def embeddings(self):
        return torch.arange(64, dtype=torch.float32).reshape(16, 4)

    def lm_head_weight(self):
        raise TargetError("the fake engine has no lm_head")

    def final_norm_weight(self):
        raise TargetError("the fake engine has no final norm")

    def close(self):
        pass


def serve(made, engine):
    service = TargetService(engine, "fake", [1, 2, 3])
    srv = build_server(service, "127.0.0.1", 0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    made.append(srv)
    return f"http://127.0.0.1:{srv.server_address[1]}", service


@pytest.fixture
def fleet():
    made = []
    try:
        yield lambda engine: serve(made, engine)
    finally:
        for s in made:
            s.shutdown()
            s.server_close()


@pytest.fixture
def servers(fleet):
    return [fleet(FakeEngine())[0] for _ in range(2)]


def batch(k):
    ids = torch.full((1, 3), k % 16)
    return Batch(ids, torch.ones_like(ids), torch.ones_like(ids))


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetch_refills_only_after_the_popped_request_is_awaited(servers, depth, monkeypatch):
    inflight, peak, lock = {}, {}, threading.Lock()
    original = client_mod._Server.request

    def request(self, *a, **kw):  # count requests on the wire per server
        with lock:
            inflight[self.url] = inflight.get(self.url, 0) + 1
            peak[self.url] = max(peak.get(self.url, 0), inflight[self.url])
        try:
            return original(self, *a, **kw)
        finally:
            with lock:
                inflight[self.url] -= 1

    monkeypatch.setattr(client_mod._Server, "request", request)
    pulled = [0]

    def source(n=9):
        for k in range(n):
            pulled[0] += 1
            yield batch(k)

    with RemoteEngine("fake", urls=servers, prefetch_depth=depth) as eng:
        eng.set_vocab_map(torch.tensor([0, 3, 5]))
        for k, (b, sup) in enumerate(eng.supervision("eagle3", source(), [1, 3])):
            # item k is yielded after k+1 awaits; each await refilled one: k + depth + 1 pulled (capped)
            assert pulled[0] == (k + 1 if depth == 0 else min(9, k + depth + 1))
            assert torch.equal(sup.aux_hidden[0, 0, :, 0], torch.tensor([k % 16 + 1.0, k % 16 + 3.0]))
    assert max(peak.values()) == 1  # never two requests on one server's wire at once
    if depth >= 2:
        assert len(peak) == 2  # both servers took work


def test_start_up_errors_name_the_problem():
    with pytest.raises(RemoteError, match="remote_urls is empty"):
        RemoteEngine("t", urls=[])
    with pytest.raises(RemoteError, match="not an http"):
        RemoteEngine("t", urls=["ftp://x"])
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"GET /info failed on every server after 1 retries \(http://127.0.0.1:9: "):
        RemoteEngine("t", urls=["http://127.0.0.1:9"], retries=1, backoff_s=0.01)  # port 9: nothing listens
    assert time.monotonic() - t0 < 10


def test_dtype_mismatch_and_supervision_before_vocab_map(servers):
    with pytest.raises(RemoteError, match="target.dtype: 'bfloat16' but the servers run"):
        RemoteEngine("t", urls=servers, dtype="bfloat16")
    with RemoteEngine("t", urls=servers) as eng:
        with pytest.raises(RemoteError, match="set_vocab_map"):
            eng.supervise("eagle3", batch(0), [1])
        assert torch.equal(eng.embeddings(), FakeEngine().embeddings())
        with pytest.raises(RemoteError, match=r"no lm_head/final norm, so lm_head_weight\(\) is unavailable"):
            eng.lm_head_weight()  # the fake engine exposes no head: a trainer must not init from it


def test_config_keys_for_the_remote_engine():
    cfg = build_config({"target": {"engine": "remote", "remote_urls": ["http://127.0.0.1:8001"], "prefetch_depth": 2}})
    assert cfg.target.prefetch_depth == 2 and cfg.target.remote_retries == 5
    with pytest.raises(ConfigError, match="remote_urls' is empty"):
        build_config({"target": {"engine": "remote"}})
    with pytest.raises(ConfigError, match="prefetch_depth' = -1"):
        build_config({"target": {"engine": "remote", "remote_urls": ["http://h:1"], "prefetch_depth": -1}})


def test_timeout_fails_over_and_disconnect_runs_on_error_exit(fleet, monkeypatch):
    for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):  # ignored: http.client never reads them
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    slow_url, slow = fleet(FakeEngine(delay_s=3.0))
    fast_url, fast = fleet(FakeEngine())
    t0 = time.monotonic()
    with pytest.raises(KeyError):
        with RemoteEngine("t", urls=[slow_url, fast_url], prefetch_depth=0, timeout_s=0.5, backoff_s=0.01) as eng:
            eng.set_vocab_map(None)
            for k in range(2):  # round robin: one of the two requests picks the slow server first
                sup = eng.supervise("eagle3", batch(k), [1])  # it times out there and moves to the fast one
                assert torch.equal(sup.aux_hidden[0, :, 0, 0], torch.full((3,), k + 1.0))
            assert not eng.servers[0].healthy and "timed out" in eng.servers[0].last_error
            assert fast.stats["features_served"] == 2
            raise KeyError("the run fails")
    assert time.monotonic() - t0 < 2.5
    assert fast.stats["disconnects"] == 1  # /disconnect on the error exit path too
