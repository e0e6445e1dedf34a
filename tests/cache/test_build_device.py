"""Where `draftsmith cache` puts the target: ``--device`` overrides ``train.device`` (hf engine;
vllm and sglang place it themselves), ``auto`` is the local rank's GPU, and a device the machine
lacks is a one-line error with exit 2 before anything loads. CUDA is faked where a test needs a GPU's
answer; the engine records its keywords and stops."""

from types import SimpleNamespace

import pytest
import torch

import draftsmith.targets as targets
from cache_helpers import tiny_run_config
from draftsmith.cache.build import placement
from draftsmith.cache.store import CacheError
from draftsmith.cli import main
from draftsmith.config import build_config

SMALL = ["--no-progress", "--set", "data.max_rows=4"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_run_config(tmp_path_factory.mktemp("build_device"), n_chats=8)


@pytest.fixture
def opened(monkeypatch):
    """The keywords of every engine the cache opens (``.seen``); with ``.stop`` set it stops there, so
    no target loads (a faked GPU could not run one)."""
    rec = SimpleNamespace(seen=[], stop=False)
    real = targets.open_engine

    def spy(name, target, **kwargs):
        rec.seen.append({"engine": name, **kwargs})
        if rec.stop:
            raise CacheError("stopped by the test after the engine's keywords were recorded")
        return real(name, target, **kwargs)

    monkeypatch.setattr(targets, "open_engine", spy)
    return rec


def test_device_cpu_builds_there(tiny, tmp_path, opened):
    _, _, path = tiny
    assert main(["cache", str(path), "--out", str(tmp_path / "c"), "--device", "cpu", *SMALL]) == 0
    assert [o["device"] for o in opened.seen] == ["cpu"] and opened.seen[0]["engine"] == "hf"
    assert (tmp_path / "c" / "manifest.json").is_file()


@pytest.mark.parametrize("argv,where", [
    (["--device", "cuda:1"], "cuda:1"),
    (["--set", "train.device=cuda:1"], "cuda:1"),  # no --device: the run config's train.device
    (["--set", "train.device=cuda:1", "--device", "cpu"], "cpu"),  # --device overrides it
    (["--device", "cuda"], "cuda:0"),  # cuda = the local rank's GPU (rank 0 here)
    (["--device", "auto"], "cuda:0"),
])
def test_device_flag_and_train_device_reach_the_engine(tiny, tmp_path, opened, fake_gpus, real_auto, argv, where,
                                                      capsys):
    _, _, path = tiny
    opened.stop = True
    assert main(["cache", str(path), "--out", str(tmp_path / "c"), *SMALL, *argv]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert [o["device"] for o in opened.seen] == [where]


@pytest.mark.parametrize("argv,expect", [
    (["--device", "cuda"], "--device 'cuda': this machine has no CUDA GPU"),
    (["--set", "train.device=cuda:0"], "train.device 'cuda:0': this machine has no CUDA GPU"),
    (["--device", "tpu"], "--device 'tpu': expected auto, cpu, cuda or cuda:N"),
])
def test_a_device_the_machine_lacks_is_one_line_with_exit_2(tiny, tmp_path, opened, monkeypatch, capsys, argv,
                                                            expect):
    _, _, path = tiny
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["cache", str(path), "--out", str(tmp_path / "c"), *SMALL, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and "\n" not in err, err
    assert "use --device cpu (or auto)" in err or "use train.device: cpu (or auto)" in err or "tpu" in err
    assert opened.seen == [] and not (tmp_path / "c").exists()  # nothing loaded, nothing written


def test_engines_that_place_the_target_get_no_device(tiny):
    target, data, _ = tiny
    cfg = build_config({"target": {"path": str(target), "device_map": "auto"}, "data": {"sources": [str(data)]},
                        "train": {"device": "cuda:7"}})  # no such GPU here: never asked for vllm/sglang
    assert placement(cfg, "vllm", None, 0) == {} and placement(cfg, "sglang", "cuda", 0) == {}
    assert placement(cfg, "hf", "cpu", 0) == {"device": "cpu", "device_map": "auto"}  # device_map goes along


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cache_built_on_cuda_serves_the_cpu_build_features(tiny, tmp_path):
    """A cache built on the GPU holds the CPU build's rows (fp32 within kernel rounding), and the cache
    engine returns them on the GPU the trainer asks for."""
    import json

    from draftsmith.cache.store import CacheReader

    _, _, path = tiny
    for dev in ("cpu", "cuda"):
        assert main(["cache", str(path), "--out", str(tmp_path / dev), "--device", dev, *SMALL]) == 0
    a, b = CacheReader(tmp_path / "cpu"), CacheReader(tmp_path / "cuda")
    try:
        ma, mb = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("cpu", "cuda"))
        assert ma["rows"] == mb["rows"] == 4 and ma["tokens"] == mb["tokens"]
        assert sorted(a.index) == sorted(b.index)  # the same rows, by token content
        for key in a.index:
            ra, rb = a.row(key), b.row(key)
            torch.testing.assert_close(rb["aux"], ra["aux"], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(rb["last"], ra["last"], rtol=1e-4, atol=1e-4)
    finally:
        a.close()
        b.close()
