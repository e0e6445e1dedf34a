"""Tensor parallelism and engine kwargs reach the engine constructors: `serve-target --tp-size N
--engine-kwargs JSON` and `target.tp_size` / `target.engine_kwargs` end up in ``vllm.LLM(...)`` and
SGLang's ``ServerArgs(...)`` as our engines build them. vLLM and SGLang are replaced by recording
fakes (no TP ever runs here); bad flag values are one-line errors with exit 2."""

import argparse
import sys
import types

import pytest

import fixtures
from draftsmith.config import ConfigError, build_config
from draftsmith.inputs import engine_options as config_engine_options
from draftsmith.remote.cli import add_arguments, engine_options
from draftsmith.remote.server import ServeTargetError
from draftsmith.targets import open_engine
from draftsmith.targets.contract import TargetError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return fixtures.make_tiny_llama(tmp_path_factory.mktemp("tiny"), num_layers=2)


def flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(["--target", "smollm2", *argv])


def fake_modules(monkeypatch, **modules) -> None:
    """Install ``{dotted name: attributes}`` as modules (parents first), so lazy imports find the fakes."""
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(__name__=name, **attrs))


def test_serve_target_flags_become_each_engines_own_keywords():
    got = engine_options(flags("--engine", "vllm", "--tp-size", "2", "--engine-kwargs", '{"gpu_memory_utilization": 0.8}'))
    assert got == {"engine_kwargs": {"gpu_memory_utilization": 0.8, "tensor_parallel_size": 2}}
    assert engine_options(flags("--engine", "sglang", "--tp-size", "4")) == {"engine_kwargs": {"tp_size": 4}}
    # the same degree given twice is not a conflict; no flags = no engine_kwargs at all
    assert engine_options(flags("--engine", "vllm", "--tp-size", "2", "--engine-kwargs", '{"tensor_parallel_size": 2}')) \
        == {"engine_kwargs": {"tensor_parallel_size": 2}}
    assert engine_options(flags("--engine", "vllm")) == {} and engine_options(flags()) == {}


@pytest.mark.parametrize("argv, match", [
    (["--engine", "vllm", "--tp-size", "0"], r"--tp-size 0: expected an integer >= 1"),
    (["--engine", "vllm", "--engine-kwargs", "[1, 2]"], r"--engine-kwargs '\[1, 2\]': not a JSON object; pass one such as"),
    (["--engine", "sglang", "--engine-kwargs", "{tp_size: 2}"], r"--engine-kwargs '\{tp_size: 2\}': not a JSON object"),
    (["--engine", "hf", "--tp-size", "2"], r"--tp-size with --engine hf: the hf engine runs the target on one device "
                                           r"\(choose it with --device\); drop --tp-size, or shard .* vllm or sglang"),
    (["--engine-kwargs", "{}"], r"--engine-kwargs with --engine hf: .*drop --engine-kwargs"),
    (["--engine", "vllm", "--tp-size", "2", "--engine-kwargs", '{"tensor_parallel_size": 4}'],
     r"--tp-size 2 but --engine-kwargs sets tensor_parallel_size=4; give the degree once, with --tp-size"),
])
def test_bad_engine_flags_name_the_flag_the_value_and_the_fix(argv, match):
    with pytest.raises(ServeTargetError, match=match):
        engine_options(flags(*argv))


def test_bad_engine_flag_exits_2_with_one_line_before_the_target_loads(capsys):
    from draftsmith.cli import main

    assert main(["serve-target", "--target", "/nowhere", "--engine", "vllm", "--engine-kwargs", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith: error: --engine-kwargs '8': not a JSON object") and "\n" not in err


def test_serve_target_hands_the_options_to_open_engine(monkeypatch):
    import draftsmith.targets
    from draftsmith.remote.server import run

    seen = {}

    def fake_open(name, target, **kwargs):
        seen.update(name=name, target=target, **kwargs)
        raise KeyboardInterrupt  # stop before a server starts

    monkeypatch.setattr(draftsmith.targets, "open_engine", fake_open)
    with pytest.raises(KeyboardInterrupt):
        run(flags("--engine", "sglang", "--tp-size", "2", "--engine-kwargs", '{"mem_fraction_static": 0.7}'))
    assert seen == {"name": "sglang", "target": "smollm2", "dtype": "float32", "device": None,
                    "engine_kwargs": {"mem_fraction_static": 0.7, "tp_size": 2}}


def test_vllm_engine_builds_llm_with_tensor_parallel_size_and_the_kwargs(tiny, monkeypatch):
    import draftsmith.targets.vllm as tv

    built = []
    fake_modules(monkeypatch, vllm={"LLM": lambda **kw: built.append(kw) or object()})
    monkeypatch.setattr(tv, "check_available", lambda: None)
    options = engine_options(flags("--engine", "vllm", "--tp-size", "2", "--engine-kwargs", '{"gpu_memory_utilization": 0.5}'))
    eng = open_engine("vllm", str(tiny), dtype="float32", device=None, **options)
    try:
        eng.runner.set_capture_layers([1, 2])
    finally:
        eng.runner.llm = None  # the fake LLM has no engine to shut down
        eng.close()
    (kw,) = built
    assert kw["tensor_parallel_size"] == 2 and kw["gpu_memory_utilization"] == 0.5 and kw["model"] == str(tiny)


def test_sglang_runner_gives_tp_size_to_server_args_and_starts_every_rank(tiny, monkeypatch):
    import torch

    import draftsmith.targets.sglang as ts

    made, loads = [], []

    class ServerArgs:
        def __init__(self, **kw):
            made.append(kw)
            self.__dict__.update(kw)

    mr = types.SimpleNamespace(model=types.SimpleNamespace(model=types.SimpleNamespace(norm=torch.nn.Identity())))
    fake_modules(monkeypatch, **{
        "sglang": {}, "sglang.srt": {},
        "sglang.bench_one_batch": {"load_model": lambda *a: loads.append(a) or (mr, None)},
        "sglang.srt.server_args": {"ServerArgs": ServerArgs,
                                   "PortArgs": types.SimpleNamespace(init_new=lambda sa: "ports")},
    })
    monkeypatch.setattr(ts, "check_available", lambda: None)
    eng = open_engine("sglang", str(tiny), dtype="float32", device=None,
                      engine_kwargs={"tp_size": 1, "mem_fraction_static": 0.7})
    assert made[-1]["tp_size"] == 1 and made[-1]["mem_fraction_static"] == 0.7 and made[-1]["model_path"] == str(tiny)
    assert loads[-1][2:] == (0, 0) and eng.runner.rank0.mr is mr  # (gpu_id, tp_rank)
    assert eng.runner.procs == []  # one rank: nothing to spawn
    eng.close()
    # tp_size 2 reaches ServerArgs and a TPRunner over both ranks (tests/targets/test_tp_runner.py runs one)
    started = []
    monkeypatch.setattr(ts, "TPRunner", lambda factory, args, tp: started.append((factory, args, tp)) or FakeRunner())
    eng = open_engine("sglang", str(tiny), dtype="float32", **engine_options(flags("--engine", "sglang", "--tp-size", "2")))
    assert made[-1]["tp_size"] == 2 and len(loads) == 1
    (factory, args, tp), = started
    assert tp == 2 and args[1] == "ports" and args[0].tp_size == 2
    # rank r loads on GPU base_gpu_id + r * gpu_id_step as tp_rank r
    sa = types.SimpleNamespace(base_gpu_id=1, gpu_id_step=2)
    assert factory(1, sa, "ports", 4).mr is mr and loads[-1][1:] == ("ports", 3, 1)
    eng.close()


class FakeRunner:
    def close(self):
        pass


def test_config_tp_size_reaches_the_co_located_engine_options():
    cfg = build_config({"target": {"engine": "vllm", "tp_size": 4, "engine_kwargs": {"max_model_len": 2048}}})
    assert config_engine_options(cfg) == {"engine_kwargs": {"max_model_len": 2048, "tensor_parallel_size": 4}}
    assert config_engine_options(build_config({"target": {"engine": "sglang", "tp_size": 2}})) \
        == {"engine_kwargs": {"tp_size": 2}}
    assert config_engine_options(build_config({"target": {"engine": "vllm"}})) == {}


def test_bad_config_tp_size_is_reported_with_the_other_problems():
    with pytest.raises(ConfigError) as e:
        build_config({"target": {"engine": "vllm", "tp_size": 0}, "train": {"lr": 0}})
    assert "'target.tp_size' = 0: expected an integer >= 1" in str(e.value) and "'train.lr' = 0" in str(e.value)
    with pytest.raises(ConfigError, match=r"'target.tp_size' is set but target.engine is 'hf', which takes none"):
        build_config({"target": {"tp_size": 2}})
    with pytest.raises(ConfigError, match=r"'target.tp_size' = 2 but 'target.engine_kwargs.tp_size' = 4"):
        build_config({"target": {"engine": "sglang", "tp_size": 2, "engine_kwargs": {"tp_size": 4}}})
    with pytest.raises(ConfigError, match=r"target.tp_sze.*did you mean.*tp_size"):
        build_config({"target": {"tp_sze": 2}})
