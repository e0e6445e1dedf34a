"""Placement keys of the run config: ``target.device_map`` (hf: auto | null) and ``train.device``."""

import pytest

from draftsmith.config import ConfigError, build_config
from draftsmith.inputs import engine_options


def test_device_map_defaults_to_one_device_and_takes_auto():
    assert build_config({}).target.device_map is None
    cfg = build_config({"target": {"device_map": "auto"}})
    assert cfg.target.device_map == "auto"
    assert engine_options(cfg) == {"device_map": "auto"}  # what the trainer hands the hf engine
    assert "device_map" not in engine_options(build_config({}))  # unset: the engine's own default


@pytest.mark.parametrize("raw,expect", [
    ({"device_map": "balanced"}, "'target.device_map' = 'balanced': expected auto (spread the target over the "
                                 "visible GPUs) or null"),
    ({"device_map": "auto", "engine": "vllm"}, "'target.device_map' is set but target.engine is 'vllm': it places "
                                               "the target itself (shard it with target.tp_size); remove it"),
    ({"device_map": "auto", "engine": "remote", "remote_urls": ["http://127.0.0.1:1"]},
     "the servers place the target (serve-target --device-map auto)"),
])
def test_device_map_refusals_name_the_key_and_the_fix(raw, expect):
    with pytest.raises(ConfigError) as e:
        build_config({"target": raw})
    assert len(e.value.problems) == 1 and expect in e.value.problems[0]


def test_device_map_is_kept_for_the_cache_engine():
    # `draftsmith cache` builds with hf and prints `--set target.engine=cache ...`: the same config must load
    cfg = build_config({"target": {"device_map": "auto", "engine": "cache", "cache_dir": "c"}})
    assert cfg.target.device_map == "auto" and "device_map" not in engine_options(cfg)


def test_train_device_spelling_is_checked_at_load():
    with pytest.raises(ConfigError, match=r"'train.device' = 'gpu0': expected auto, cpu, cuda or cuda:N"):
        build_config({"train": {"device": "gpu0"}})
    assert build_config({"train": {"device": "cuda:3"}}).train.device == "cuda:3"  # presence is checked at run time
