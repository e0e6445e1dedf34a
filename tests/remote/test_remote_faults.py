"""Faults with real serve-target processes: kill -9 one of two mid-run (same weights, no step lost or
repeated), restart -> used again (vocab map re-pushed), all down -> clear error, latest checkpoint intact,
and a resume after restarting them ends with the unfaulted weights."""

import time

import pytest
import torch

from deadline import hang_guard
from draftsmith.remote.client import RemoteEngine, RemoteError
from draftsmith.drafts.eagle_supervision import eagle3_supervision
from draftsmith.targets.hf import HFEngine
from draftsmith.train.checkpoint import latest_checkpoint, load_checkpoint
from draftsmith.train.loop import train
from remote_helpers import AUX
from remote_train import final_weights, same_weights, tiny_target_and_servers, train_config
from test_remote_parity import FIELDS, batches


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with tiny_target_and_servers(tmp_path_factory.mktemp("faults")) as got:
        yield got


def up(servers):
    """Restart the dead ones (in parallel) on their ports."""
    for s in [s.restart(wait=False) for s in servers if s.proc.poll() is not None]:
        s.wait_ready()


def kill_on_call(monkeypatch, n: int, victims):
    """Make the n-th supervision request kill -9 ``victims`` just before it is sent."""
    calls, original = [0], RemoteEngine.supervise

    def supervise(self, kind, batch, layer_ids):
        calls[0] += 1
        if calls[0] == n:
            for v in victims:
                v.kill9()
        return original(self, kind, batch, layer_ids)

    monkeypatch.setattr(RemoteEngine, "supervise", supervise)
    return calls


@pytest.mark.slow
def test_kill9_one_server_mid_run_finishes_on_the_other_with_same_weights(pair, tmp_path, monkeypatch):
    target, data, servers = pair
    up(servers)
    ref = train(train_config(target, data, tmp_path / "co"), progress=False)
    calls = kill_on_call(monkeypatch, 3, [servers[0]])
    res = train(train_config(target, data, tmp_path / "remote", "remote", [s.url for s in servers],
                             prefetch_depth=2, remote_backoff_s=0.05), progress=False)
    assert servers[0].proc.poll() is not None and calls[0] >= 7  # 6 train batches + eval ran after the kill
    assert res.history == ref.history  # every step once, in order, with the same loss
    assert same_weights(final_weights(res), final_weights(ref))


@pytest.mark.slow
def test_restarted_server_is_used_again_with_the_vocab_map_re_pushed(pair):
    target, _, servers = pair
    up(servers)
    hf, bs = HFEngine(target), batches(6, seed=1)
    draft_ids = torch.arange(0, 384, 3)
    refs = [eagle3_supervision(b, hf.features(b, AUX, logits=True), draft_ids) for b in bs]
    with RemoteEngine(str(target), urls=[s.url for s in servers], prefetch_depth=1, backoff_s=0.05,
                      health_interval_s=0.2) as eng:
        eng.set_vocab_map(draft_ids)
        got = [sup for _, sup in eng.supervision("eagle3", bs[:2], AUX)]
        servers[0].kill9()
        got += [sup for _, sup in eng.supervision("eagle3", bs[2:4], AUX)]  # all on servers[1]
        assert not eng.servers[0].healthy
        servers[0].restart()  # same port, fresh process: it has no vocab map
        assert servers[0].get("/health")["vocab_maps"] == 0
        time.sleep(0.3)  # past health_interval_s: the next pick re-checks it
        got += [sup for _, sup in eng.supervision("eagle3", bs[4:], AUX)]
        health = servers[0].get("/health")
        assert eng.servers[0].healthy and health["features_served"] >= 1 and health["vocab_maps"] == 1
    for ref, sup in zip(refs, got):
        assert all(torch.equal(getattr(ref, f), getattr(sup, f)) for f in FIELDS)


@pytest.mark.slow
def test_all_servers_down_clear_error_and_latest_checkpoint_intact(pair, tmp_path, monkeypatch):
    target, data, servers = pair
    up(servers)
    ref = train(train_config(target, data, tmp_path / "co", train={"save_every": 2}), progress=False)
    kill_on_call(monkeypatch, 5, servers)
    cfg = train_config(target, data, tmp_path / "remote", "remote", [s.url for s in servers], prefetch_depth=1,
                       remote_retries=2, remote_backoff_s=0.05, train={"save_every": 2})
    with hang_guard(what="training with every server down"), pytest.raises(RemoteError) as e:
        train(cfg, progress=False)  # retries run out: an error, never an endless wait
    msg = str(e.value)
    assert "failed on every server after 2 retries" in msg and all(s.url in msg for s in servers)
    latest = latest_checkpoint(tmp_path / "remote" / "checkpoints")
    assert latest.name == "epoch_0_step_4"  # the request for batch 5 failed after step 4 was saved
    saved = load_checkpoint(latest)
    ref_state = load_checkpoint(tmp_path / "co" / "checkpoints" / "epoch_0_step_4")["model_state"]
    assert same_weights(saved["model_state"], ref_state) and saved["meta"]["step"] == 4
    # Restart both (fresh processes, no vocab map) and resume: the map is re-pushed, the run ends as if unfaulted.
    monkeypatch.undo()
    up(servers)
    res = train(cfg, resume=latest, progress=False)
    assert res.step == 6 and all(s.get("/health")["vocab_maps"] == 1 for s in servers)
    assert same_weights(final_weights(res), final_weights(ref))
