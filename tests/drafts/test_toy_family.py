"""A family defined entirely in tests/ (tests/drafts/toy_family: its own folder, config dataclass and
description, reusing the eagle3 supervision kind) is registered with one line and then trains,
evaluates exactly and exports with no edit anywhere in src/ (issue 22)."""

import json

import pytest

import toy_family
from draftsmith.config import ConfigError, build_config
from draftsmith.drafts import FAMILIES, family_of_config, get_family, register, unregister
from fixtures import make_tiny_llama, make_tokenizer, write_chats

pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/conftest.py: train.num_threads 1 is undone


@pytest.fixture
def toy():
    register(toy_family.FAMILY)  # the one line a new family needs
    yield get_family("toy")
    unregister("toy")  # the registry of every other test holds the five families of draftsmith


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("toy")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "chat", "turns": [q]}) + "\n" for i, q in
                               enumerate(["Tell me about the cat and the sea.", "Tell me about the fox."])))
    return target, write_chats(root / "chats.jsonl", n=10), prompts


def test_a_toy_family_trains_evaluates_exactly_and_exports(toy, tiny, tmp_path):
    from draftsmith.eval.offline import run_eval
    from draftsmith.serve.export import export_vllm
    from draftsmith.train.loop import train

    target, data, prompts = tiny
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 96},
        "draft": {"type": "toy", "ttt_steps": 2, "toy_weight": 0.7},
        "train": {"max_steps": 2, "batch_size": 2, "lr": 3e-3, "num_threads": 1, "spec_eval_every": 2,
                  "spec_eval_prompts": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    assert type(cfg.draft) is toy_family.ToyDraftConfig  # draft.type picked the toy's own dataclass
    res = train(cfg, progress=False)
    assert res.step == 2 and res.eval["real_tau"] >= 1.0  # the trainer's real-tau hook drove the toy's proposer

    cons = res.checkpoint / "model" / "consolidated"
    config = json.loads((cons / "config.json").read_text())
    assert config["architectures"] == ["ToyEagleDraftModel"] and family_of_config(config) == "toy"
    assert config["draftsmith"] == {"draft_type": "toy", "ttt_steps": 2, "step_weight": 0.7}
    assert json.loads((res.checkpoint / "meta.json").read_text())["draft_type"] == "toy"

    report = run_eval(target=None, draft=str(res.output_dir), prompts=str(prompts), max_new_tokens=12,
                      progress=False)  # exact offline decoding: the target from meta.json
    assert report["lossless"] == {"checked": 2, "mismatches": []}
    assert report["config"]["k"] == 3 and report["overall"]["tau"] >= 1.0  # the chain proposer's default K

    vllm = export_vllm(res.checkpoint, tmp_path / "vllm")  # serve asks the family: vLLM loads it as EAGLE-3
    served = json.loads((vllm / "config.json").read_text())
    assert served["architectures"] == [toy.vllm_arch] == ["LlamaForCausalLMEagle3"]


def test_toy_keys_are_refused_by_name_under_another_family(toy):
    with pytest.raises(ConfigError) as err:
        build_config({"draft": {"type": "eagle3", "toy_weight": 0.5}})
    assert err.value.problems == ["draft.toy_weight belongs to toy; draft.type is eagle3: remove the key, or set "
                                  "draft.type to the family it belongs to"]
    with pytest.raises(ConfigError, match=r"'draft.toy_weight' = 2.0: expected \(0, 1\]"):
        build_config({"draft": {"type": "toy", "toy_weight": 2.0}})


def test_the_toy_is_gone_after_unregister():
    assert "toy" not in FAMILIES and "toy_weight" not in str(build_config({}).draft)
