"""DSpark trained end to end on a tiny Llama target through the hf engine (``dflash_kd`` supervision: the
target's last state, its distribution rebuilt by the draft): the checkpoint is what vLLM's Qwen3DSparkModel
reads, resume is bitwise, packing gives the unpacked loss, ``draftsmith eval`` decodes losslessly with
K = block_size, ``doctor`` is clean and ``export --to vllm`` / ``--to speculators`` state the layout."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from fixtures import make_tiny_llama, make_tokenizer, write_chats

L, H = 6, 64
MASK = 5  # <|start_header_id|>: never in chatml text
BS = 3  # K = 3: every slot drafts
R = 8
STEPS, SAVE = 10, 3
LAYER = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
         "mlp.down_proj.weight"] + [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "q_norm", "k_norm")]

pytestmark = pytest.mark.usefixtures("restore_threads")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=L, hidden=H)
    data = write_chats(root / "chats.jsonl", n=12)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "chat", "turns": [q]}) + "\n" for i, q in
                               enumerate(["Tell me about the cat and the sea.", "Tell me about the fox."])))
    return target, data, prompts


def run_config(tiny, out, *, draft=None, data=None, **train):
    target, chats, _ = tiny
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": [2, 5]},
        "data": {"sources": [str(chats)], "max_length": 48, "eval_size": 2, **(data or {})},
        "draft": {"type": "dspark", "mask_token_id": MASK, "block_size": BS, "num_draft_layers": 2, "num_anchors": 4,
                  "markov_rank": R, **(draft or {})},
        "train": {"epochs": 2, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "num_threads": 1, **train},
        "output": {"dir": str(out), "tensorboard": False},
    })


@pytest.fixture(scope="module")
def whole(tiny, tmp_path_factory):
    from draftsmith.train.loop import train

    return train(run_config(tiny, tmp_path_factory.mktemp("whole"), save_every=SAVE), progress=False)


@pytest.mark.slow
def test_checkpoint_is_what_vllms_dspark_model_reads(whole):
    assert whole.step == STEPS
    cons = whole.checkpoint / "model" / "consolidated"
    cfg = json.loads((cons / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["target_layer_ids"] == [1, 4]  # engine ids 2, 5: decoder-layer outputs 1, 4
    assert (cfg["block_size"], cfg["mask_token_id"], cfg["markov_rank"]) == (BS, MASK, R)
    assert cfg["sample_from_anchor"] is True and cfg["enable_confidence_head"] is True
    weights = load_file(str(cons / "model.safetensors"))
    expected = ["fc.weight", "hidden_norm.weight", "norm.weight", "markov_head.markov_w1.weight",
                "markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias"]
    expected += [f"layers.{i}.{n}" for i in range(2) for n in LAYER]
    assert sorted(weights) == sorted(expected)  # no embed_tokens, no lm_head: the target's
    v = len(make_tokenizer("chatml"))
    assert weights["markov_head.markov_w1.weight"].shape == (v, R) == weights["markov_head.markov_w2.weight"].shape
    assert weights["markov_head.markov_w2.weight"].abs().sum() > 0  # the Markov bias was trained (it starts at 0)
    meta = json.loads((whole.checkpoint / "meta.json").read_text())
    assert meta["draft_type"] == "dspark" and meta["aux_layer_ids"] == [2, 5] and meta["markov_rank"] == R
    first, last = whole.history[0][1], whole.history[-1][1]
    assert last < first, whole.history
    assert {"tv", "confidence_abs_error"} <= set(whole.eval) and 0 <= whole.eval["tv"] <= 1


@pytest.mark.slow
def test_resume_mid_run_is_bitwise_equal(whole, tiny, tmp_path):
    from draftsmith.train.loop import train

    mid = whole.checkpoint.parent / f"epoch_0_step_{SAVE}"
    resumed = train(run_config(tiny, tmp_path / "resumed"), resume=mid, progress=False)
    a = load_file(str(whole.checkpoint / "model" / "consolidated" / "model.safetensors"))
    b = load_file(str(resumed.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert resumed.step == STEPS and a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert [l for s, l in whole.history if s > SAVE] == [l for _, l in resumed.history]


@pytest.mark.slow
def test_packed_rows_train_as_unpacked(tiny, tmp_path):
    from draftsmith.train.loop import Trainer

    losses = {}
    for packing in (False, True):
        trainer = Trainer(run_config(tiny, tmp_path / str(packing), data={"packing": packing}, epochs=1),
                          progress=False)
        try:
            losses[packing] = trainer.evaluate()["loss"]
        finally:
            trainer.engine.close()
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)


@pytest.mark.slow
def test_eval_is_lossless_with_k_of_the_block_and_doctor_is_clean(whole, tiny, tmp_path):
    from draftsmith.cli import main
    from draftsmith.eval.offline import run_eval

    _, _, prompts = tiny
    report = run_eval(target=None, draft=str(whole.output_dir), prompts=str(prompts), max_new_tokens=16,
                      progress=False)
    assert report["config"]["k"] == BS and report["config"]["aux_layer_ids"] == [2, 5]
    assert report["lossless"] == {"checked": 2, "mismatches": []}
    assert len(report["overall"]["acceptance_per_position"]) == BS and report["overall"]["tau"] >= 1.0
    target = str(tiny[0])
    assert main(["doctor", str(whole.checkpoint), "--target", target]) == 0
    out = tmp_path / "vllm"
    assert main(["export", str(whole.checkpoint), str(out), "--to", "vllm"]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["sample_from_anchor"] is True
    spec = tmp_path / "spec"
    assert main(["export", str(whole.checkpoint), str(spec), "--to", "speculators", "--target", target]) == 0
    top = json.loads((spec / "config.json").read_text())
    assert top["speculators_model_type"] == "dspark" and top["sample_from_anchor"] is True
    assert top["aux_hidden_state_layer_ids"] == [2, 5] and top["speculators_config"]["algorithm"] == "dspark"


@pytest.mark.slow
def test_cache_engine_trains_the_same_draft(whole, tiny, tmp_path):
    # the feature cache holds what dflash_kd needs (aux states and the last state): a run on it takes the same
    # steps as the hf engine's run on the same rows
    from draftsmith.cache.build import build_cache
    from draftsmith.train.loop import train

    cfg = run_config(tiny, tmp_path / "unused", save_every=SAVE)
    build_cache(cfg, tmp_path / "cache", shard_rows=32, progress=False, log=lambda s: None)
    cached = run_config(tiny, tmp_path / "cached", save_every=SAVE)
    cached.target.engine, cached.target.cache_dir = "cache", str(tmp_path / "cache")
    res = train(cached, progress=False)
    a = load_file(str(whole.checkpoint / "model" / "consolidated" / "model.safetensors"))
    b = load_file(str(res.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert res.step == whole.step and a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-5), k
    assert [round(l, 4) for _, l in res.history] == [round(l, 4) for _, l in whole.history]
