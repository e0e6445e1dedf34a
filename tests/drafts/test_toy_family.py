"""A family defined entirely in tests/ (tests/drafts/toy_family: a one-token MLP draft with its own
supervision kind, layout, export, proposer and serving answer) is registered from its folder and then
trains on the hf engine and on the feature cache, resumes bitwise, evaluates exactly, and is refused by
serve and export in one line: with no edit anywhere in src/ for it."""

import json

import pytest
import torch
from safetensors.torch import load_file

import toy_family
from draftsmith.cli import main
from draftsmith.config import ConfigError, build_config
from draftsmith.drafts import FAMILIES, family_of_config, get_family, register, unregister
from draftsmith.supervision import SUPERVISION, supervision_kind, unregister_supervision
from fixtures import make_tiny_llama, make_tokenizer, write_chats

pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/conftest.py: train.num_threads 1 is undone
AUX, STEPS, SAVE = [1, 3, 4], 8, 3


@pytest.fixture(scope="module")
def toy():
    register(toy_family.FAMILY)  # one line, as a built-in family: it declares its supervision module too
    yield get_family("toy")
    unregister("toy")  # the registry of every other test holds draftsmith's own families
    unregister_supervision("toy_next")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "chat", "turns": [q]}) + "\n" for i, q in
                               enumerate(["Tell me about the cat and the sea.", "Tell me about the fox."])))
    return target, write_chats(root / "chats.jsonl", n=10), prompts


def run_config(tiny, out, **train):
    target, data, _ = tiny
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": AUX},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2},
        "draft": {"type": "toy", "toy_width": 16},
        "train": {"epochs": 2, "batch_size": 2, "lr": 3e-3, "num_threads": 1, **train},
        "output": {"dir": str(out), "tensorboard": False},
    })


@pytest.fixture(scope="module")
def whole(toy, tiny, tmp_path_factory):
    from draftsmith.train.loop import train

    return train(run_config(tiny, tmp_path_factory.mktemp("whole"), save_every=SAVE, spec_eval_every=SAVE,
                            spec_eval_prompts=2), progress=False)


def test_a_toy_family_trains_on_its_own_supervision_and_exports_its_own_layout(toy, whole):
    assert type(build_config({"draft": {"type": "toy"}}).draft) is toy_family.ToyDraftConfig
    assert whole.step == STEPS and whole.history[-1][1] < whole.history[0][1]
    assert whole.eval["real_tau"] >= 1.0  # the trainer's real-tau hook drove the toy's own proposer
    cons = whole.checkpoint / "model" / "consolidated"
    config = json.loads((cons / "config.json").read_text())
    assert config["architectures"] == ["ToyMLPDraftModel"] and family_of_config(config) == "toy"
    assert config["toy_layer_ids"] == AUX and config["draftsmith"] == {"draft_type": "toy"}
    assert sorted(load_file(str(cons / "model.safetensors"))) == ["fc.weight", "mix.weight", "norm.weight"]
    assert json.loads((whole.checkpoint / "meta.json").read_text())["draft_type"] == "toy"


def test_resume_is_bitwise_and_the_feature_cache_trains_the_same_draft(toy, whole, tiny, tmp_path):
    from draftsmith.cache.build import build_cache
    from draftsmith.train.loop import train

    final = load_file(str(whole.checkpoint / "model" / "consolidated" / "model.safetensors"))
    resumed = train(run_config(tiny, tmp_path / "resumed"), resume=whole.checkpoint.parent / f"epoch_0_step_{SAVE}",
                    progress=False)
    again = load_file(str(resumed.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert resumed.step == STEPS and all(torch.equal(final[k], again[k]) for k in final)

    build_cache(run_config(tiny, tmp_path / "unused"), tmp_path / "cache", shard_rows=32, progress=False,
                log=lambda s: None)
    cached = run_config(tiny, tmp_path / "cached")
    cached.target.engine, cached.target.cache_dir = "cache", str(tmp_path / "cache")
    res = train(cached, progress=False)
    got = load_file(str(res.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert res.step == STEPS and all(torch.allclose(final[k], got[k], atol=1e-5) for k in final)


def test_eval_is_exact_and_serving_is_refused_through_its_own_hook(toy, whole, tiny, tmp_path, capsys):
    from draftsmith.eval.offline import run_eval

    target, _, prompts = tiny
    report = run_eval(target=None, draft=str(whole.output_dir), prompts=str(prompts), max_new_tokens=12,
                      progress=False)
    assert report["lossless"] == {"checked": 2, "mismatches": []}
    assert report["config"]["k"] == 1 and report["overall"]["tau"] >= 1.0
    capsys.readouterr()
    for argv in (["serve", "vllm", "--target", str(target), "--draft", str(whole.checkpoint), "--print-only"],
                 ["export", str(whole.checkpoint), str(tmp_path / "out"), "--to", "vllm"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "toy MLP draft: no engine has a model for it" in err and "draftsmith eval --draft" in err
        assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_toy_keys_are_refused_by_name_under_another_family(toy):
    with pytest.raises(ConfigError) as err:
        build_config({"draft": {"type": "eagle3", "toy_width": 8}})
    assert err.value.problems == ["draft.toy_width belongs to toy; draft.type is eagle3: remove the key, or set "
                                  "draft.type to the family it belongs to"]
    with pytest.raises(ConfigError, match=r"'draft.toy_width' = 0: expected an integer >= 1"):
        build_config({"draft": {"type": "toy", "toy_width": 0}})


def test_registering_the_family_brings_its_supervision_kind_to_the_engines(toy):
    # the kind is found by name (what an engine does), built from the toy's own folder
    kind = supervision_kind("toy_next")
    assert kind.cls.__module__ == "toy_family.supervision" and kind.tensor_names == (
        "aux_hidden", "next_ids", "labels", "label_mask")


def test_unregister_removes_the_toy_and_its_supervision_kind(toy):
    unregister("toy")
    unregister_supervision("toy_next")
    assert "toy" not in FAMILIES and "toy_next" not in SUPERVISION
    assert "toy_width" not in str(build_config({}).draft)
