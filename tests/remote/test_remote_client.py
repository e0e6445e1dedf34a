"""Client behaviour against in-process servers with a fake engine (no model load): prefetch order and
refill rule, at most one request on the wire per server, start-up errors, config keys."""

import threading

import pytest
import torch

from deadline import hang_guard
from draftsmith.config import ConfigError, build_config
from draftsmith.remote import client as client_mod
from draftsmith.remote.client import RemoteEngine, RemoteError
from fake_fleet import FakeEngine, Fleet, batch


@pytest.fixture
def fleet():
    f = Fleet()
    try:
        yield f
    finally:
        f.close()


@pytest.fixture
def servers(fleet):
    return [fleet(FakeEngine())[0] for _ in range(2)]


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
    # port 9: nothing listens; the refusal is an error, never a wait (how long it takes: bench/remote_failover.py)
    with hang_guard(what="a refused connection"):
        with pytest.raises(RemoteError, match=r"GET /info failed on every server after 1 retries \(http://127.0.0.1:9: "):
            RemoteEngine("t", urls=["http://127.0.0.1:9"], retries=1, backoff_s=0.01)


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
    stuck = FakeEngine(gate=threading.Event())  # answers only once the fleet closes: past any timeout
    slow_url, slow = fleet(stuck)
    fast_url, fast = fleet(FakeEngine())
    with hang_guard(what="a failover"), pytest.raises(KeyError):
        with RemoteEngine("t", urls=[slow_url, fast_url], prefetch_depth=0, timeout_s=0.5, backoff_s=0.01) as eng:
            eng.set_vocab_map(None)
            for k in range(2):  # round robin: one of the two requests picks the stuck server first
                sup = eng.supervise("eagle3", batch(k), [1])  # it times out there and moves to the fast one
                assert torch.equal(sup.aux_hidden[0, :, 0, 0], torch.full((3,), k + 1.0))
            assert not eng.servers[0].healthy and "timed out" in eng.servers[0].last_error
            assert fast.stats["features_served"] == 2
            raise KeyError("the run fails")
    # both answers came from the fast server while the stuck one still held its request: the client
    # never waited for it (failover latency against the timeout: bench/remote_failover.py)
    assert stuck.entered >= 1 and stuck.answered == 0
    assert fast.stats["disconnects"] == 1  # /disconnect on the error exit path too
