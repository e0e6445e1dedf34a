"""A user's target.aux_layer_ids are trained ascending, the order vLLM and SGLang serve them in.

vLLM 0.32 sorts the ids of EAGLE-3, P-EAGLE and DFlash drafts (``EagleModelMixin._set_aux_hidden_state_layers``)
and SGLang captures aux states in layer order, so a draft trained on [4, 1, 3] would be served with its
fc's input blocks permuted. Training, its features, meta.json and config.json all hold [1, 3, 4].
"""

import json

import pytest
import torch

from draftsmith.config import build_config
from draftsmith.inputs import aux_layer_ids, aux_order_note
from draftsmith.remote.server import TargetService
from draftsmith.targets import TargetInfo
from draftsmith.train.checkpoint import CheckpointError
from draftsmith.train.loop import Trainer, train
from fixtures import make_tiny_llama, make_tokenizer, write_chats

NOTE = "target.aux_layer_ids [4, 1, 3] sorted to [1, 3, 4]: vLLM and SGLang read aux states in ascending layer order"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("aux_order")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    return target, write_chats(root / "chats.jsonl", 12)


def run_config(target, data, out, ids, draft=None):
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": ids},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2, **(draft or {})},
        "train": {"max_steps": 1, "batch_size": 2, "eval_max_batches": 1},
        "output": {"dir": str(out), "tensorboard": False},
    })


def test_ids_are_sorted_once_with_a_note_and_repeats_stay_refused(tiny, tmp_path):
    target, data = tiny
    cfg = run_config(target, data, tmp_path, [4, 1, 3])
    assert aux_layer_ids(cfg, 6) == [1, 3, 4] and aux_order_note(cfg) == NOTE
    assert aux_order_note(run_config(target, data, tmp_path, [1, 3, 4])) is None
    assert aux_order_note(run_config(target, data, tmp_path, None)) is None  # the default rule is ascending
    from draftsmith.targets.contract import TargetError

    with pytest.raises(TargetError, match=r"target\.aux_layer_ids: layer id 1 is repeated in \[4, 1, 1\]"):
        aux_layer_ids(run_config(target, data, tmp_path, [4, 1, 1]), 6)


@pytest.mark.parametrize("family,ids,engine_ids,draft", [
    ("eagle3", [4, 1, 3], [1, 3, 4], None),
    ("dflash", [5, 2, 4], [2, 4, 5], {"type": "dflash", "mask_token_id": 5, "block_size": 4, "num_draft_layers": 1, "num_anchors": 4}),
])
def test_an_unsorted_list_trains_features_meta_and_config_ascending(tiny, tmp_path, family, ids, engine_ids, draft):
    target, data = tiny
    cfg = run_config(target, data, tmp_path / "run", ids, draft)
    trainer = Trainer(cfg, progress=False)
    try:
        assert trainer.aux_ids == engine_ids
        batch, sup = next(iter(trainer.supervise([trainer.train_set[:1]])))  # what the draft learns from
    finally:
        trainer.engine.close()
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        hs = AutoModelForCausalLM.from_pretrained(target).eval()(input_ids=batch.input_ids,
                                                                 output_hidden_states=True).hidden_states
    for j, i in enumerate(engine_ids):  # aux block j is the target state of the j-th ASCENDING id
        torch.testing.assert_close(sup.aux_hidden[0, :, j], hs[i][0].to(sup.aux_hidden.dtype))
    lines = []
    res = train(cfg, progress=False, announce=lines.append)
    assert lines[0] == NOTE.replace("[4, 1, 3]", str(ids)).replace("[1, 3, 4]", str(engine_ids))
    meta = json.loads((res.checkpoint / "meta.json").read_text())
    config = json.loads((res.checkpoint / "model" / "consolidated" / "config.json").read_text())
    assert meta["aux_layer_ids"] == engine_ids
    if family == "eagle3":
        assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == engine_ids
    else:  # DFlash files index decoder-layer outputs: engine id - 1
        assert config["dflash_config"]["target_layer_ids"] == [i - 1 for i in engine_ids]
        assert meta["target_layer_ids"] == [i - 1 for i in engine_ids]


def test_a_checkpoint_trained_on_an_unsorted_list_is_not_resumed(tiny, tmp_path):
    """Checkpoints from before the sort hold fc blocks in the listed order: resuming would mix orders."""
    target, data = tiny
    cfg = run_config(target, data, tmp_path / "run", [1, 3, 4])
    ckpt = train(cfg, progress=False).checkpoint
    meta = json.loads((ckpt / "meta.json").read_text())
    (ckpt / "meta.json").write_text(json.dumps({**meta, "aux_layer_ids": [4, 1, 3]}))  # as the old trainer wrote it
    cfg.train.max_steps = 2
    with pytest.raises(CheckpointError, match=r"trained with aux layer ids \[4, 1, 3\] in that order.*draftsmith "
                                              r"export` reorders its fc"):
        Trainer(cfg, resume=ckpt, progress=False)


class Engine:
    def info(self):
        return TargetInfo(num_layers=6, hidden_size=4, vocab_size=16, dtype="float32", model_type="fake", tied=True)


def test_serve_target_default_ids_are_ascending():
    service = TargetService(Engine(), "fake", [4, 1, 3])
    assert service.aux_ids == [1, 3, 4] and service.info_dict()["aux_layer_ids"] == [1, 3, 4]
    assert service.aux_note == NOTE.replace("target.aux_layer_ids", "--aux-layer-ids")
    assert TargetService(Engine(), "fake", None).aux_note is None
