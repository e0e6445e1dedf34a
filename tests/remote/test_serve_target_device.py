"""Where `draftsmith serve-target` places the target: ``--device`` for the hf engine (and where the
cache engine returns features), ``--device-map auto`` to spread an hf target over the GPUs; a device
or map the machine cannot honour is one line with exit 2 before the target loads. CUDA is faked where
a test needs a GPU's answer; the engine records its keywords and stops."""

import importlib.util

import pytest
import torch

import draftsmith.targets as targets
from draftsmith.cli import main
from draftsmith.remote.server import ServeTargetError
from fixtures import make_tiny_llama


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("serve_device") / "target", num_layers=2)


@pytest.fixture
def opened(monkeypatch):
    """The keywords of the engine serve-target opens; it stops there (no target loads, no server)."""
    seen: list[dict] = []

    def spy(name, target, **kwargs):
        seen.append({"engine": name, **kwargs})
        raise ServeTargetError("stopped by the test after the engine's keywords were recorded")

    monkeypatch.setattr(targets, "open_engine", spy)
    return seen


def serve(tiny, *extra):
    return main(["serve-target", "--target", str(tiny), "--port", "0", *extra])


@pytest.mark.parametrize("extra,want", [
    (["--device", "cpu"], {"engine": "hf", "device": "cpu"}),
    (["--device", "cuda:1"], {"engine": "hf", "device": "cuda:1"}),
    (["--device", "cuda"], {"engine": "hf", "device": "cuda:0"}),
    (["--device-map", "auto"], {"engine": "hf", "device": "cuda:0", "device_map": "auto"}),
    (["--engine", "cache", "--cache-dir", "C", "--device", "cuda:1"], {"engine": "cache", "device": "cuda:1",
                                                                      "cache_dir": "C"}),
])
def test_device_and_device_map_reach_the_engine(tiny, opened, fake_gpus, real_auto, capsys, extra, want):
    assert serve(tiny, *extra) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert [{k: v for k, v in o.items() if k not in ("dtype",)} for o in opened] == [want]


@pytest.mark.parametrize("extra,expect", [
    (["--device", "cuda"], "--device 'cuda': this machine has no CUDA GPU"),
    (["--engine", "cache", "--cache-dir", "C", "--device", "cuda:0"], "use --device cpu (or auto)"),
    (["--device-map", "auto"], "target.device_map (serve-target --device-map): 'auto' but this machine has no CUDA "
                               "GPU"),
    (["--device-map", "auto", "--engine", "vllm"], "--device-map with --engine vllm: only the hf engine"),
])
def test_what_the_machine_cannot_honour_is_one_line_with_exit_2(tiny, opened, monkeypatch, capsys, extra, expect):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert serve(tiny, *extra) == 2
    err = capsys.readouterr().err.strip()
    assert expect in err and "\n" not in err, err
    assert opened == []  # refused before the engine opens


def test_device_map_without_accelerate_is_refused(tiny, opened, fake_gpus, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "accelerate" else real(name, *a))
    assert serve(tiny, "--device-map", "auto") == 2
    assert "'auto' needs accelerate, which is not installed" in capsys.readouterr().err and opened == []
