"""draft.init_layer_from_target through the trainer (train/loop.py _build_draft): the weights of the target layer
it names reach layer 0; a bad index is one ConfigError line before any training."""

import pytest
import torch

from draftsmith.config import ConfigError, build_config
from draftsmith.targets.runner import decoder_layer_weights, target_info
from draftsmith.train.loop import Trainer
from fixtures import make_tiny_llama, make_tokenizer
from test_loop import run_config, write_chats


def test_config_key_reaches_the_trainer(tmp_path):
    """A run with the key starts from the target layer; an out-of-range one is one ConfigError line."""
    target = make_tiny_llama(tmp_path / "target", make_tokenizer("chatml"), num_layers=4, hidden=64)
    data = write_chats(tmp_path / "chats.jsonl")
    cfg = run_config(target, data, tmp_path / "run", draft={"init_layer_from_target": -1}, max_steps=1)
    cfg.target.aux_layer_ids = [1, 2, 3]
    t = Trainer(cfg, progress=False)
    w = decoder_layer_weights(target, -1, target_info(target, "float32", tied=False))["mlp.down_proj.weight"]
    assert torch.equal(t.draft.model.layers[0].mlp.down_proj.weight.detach().cpu(), w)
    bad = run_config(target, data, tmp_path / "bad", draft={"init_layer_from_target": 9}, max_steps=1)
    bad.target.aux_layer_ids = [1, 2, 3]
    with pytest.raises(ConfigError, match=r"draft.init_layer_from_target: 9 is not a decoder layer"):
        Trainer(bad, progress=False)
    assert build_config({}).draft.init_layer_from_target is None  # off by default
