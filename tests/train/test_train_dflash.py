"""DFlash-family drafts (dflash, jetspec, domino) trained end to end on a tiny Llama target through the
hf engine: the checkpoint is the family's export, resume is bitwise, a changed draft is refused, the
trainer's spec-eval hook runs, and ``draftsmith eval`` decodes losslessly with K = the block's tokens."""

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from draftsmith.drafts import DraftError
from draftsmith.drafts.eagle3 import api as eagle3
from draftsmith.drafts.peagle import api as peagle
from draftsmith.eval import EvalError
from draftsmith.train.checkpoint import CheckpointError
from draftsmith.weights import read_tensors
from fixtures import make_tiny_llama, make_tokenizer, write_chats

L, H = 6, 64  # the tiny target: 6 layers, hidden 64, head_dim 32
MASK = 5  # <|start_header_id|>: never in chatml text
BS = 4  # block size: K = 3 drafted tokens (Domino's shift_label: 4)
# target.aux_layer_ids per family (engine ids): dflash takes the default rule (2 draft layers on a
# 6-layer target: hook ids [1, 3] -> engine [2, 4]); jetspec reaches both ends (1 and L); domino in between.
AUX = {"dflash": None, "jetspec": [1, L], "domino": [3, 5]}
ENGINE_IDS = {"dflash": [2, 4], "jetspec": [1, L], "domino": [3, 5]}
KNOBS = {"dflash": {}, "jetspec": {"kd_temperature": 2.0},
         "domino": {"emb_dim": 16, "gru_hidden_dim": 8, "lambda_start": 1.0, "lambda_decay_ratio": 0.5}}
K = {"dflash": BS - 1, "jetspec": BS - 1, "domino": BS}
FAMILIES = list(KNOBS)
STEPS = 10  # 12 chats - 2 held out = 10 train rows / batch 2 = 5 steps per epoch, 2 epochs
SAVE = 3  # mid-epoch: the data position matters on resume
LAYER = ["input_layernorm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
         "mlp.down_proj.weight"] + [f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj",
                                                                       "q_norm", "k_norm")]


pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/conftest.py: train.num_threads 1 is undone


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=L, hidden=H)
    data = write_chats(root / "chats.jsonl", n=12)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": "chat", "turns": [q]}) + "\n" for i, q in
                               enumerate(["Tell me about the cat and the sea.", "Tell me about the fox."])))
    return target, data, prompts


def run_config(tiny, out, family, *, draft=None, **train):
    target, data, _ = tiny
    return build_config({
        "target": {"path": str(target), "aux_layer_ids": AUX[family]},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2},
        "draft": {"type": family, "mask_token_id": MASK, "block_size": BS, "num_draft_layers": 2, "num_anchors": 4,
                  **KNOBS[family], **(draft or {})},
        "train": {"epochs": 2, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "num_threads": 1, **train},
        "output": {"dir": str(out), "tensorboard": False},
    })


@pytest.fixture(scope="module")
def full(tiny, tmp_path_factory):
    """family -> (uninterrupted run saving every SAVE steps with the spec-eval hook every SAVE steps,
    the steps the hook ran at and what it returned)."""
    import draftsmith.eval.offline as offline
    from draftsmith.train.loop import train

    runs = {}

    def get(family):
        if family not in runs:
            calls, real = [], offline.trainer_spec_eval

            def spy(trainer, simulated=None, **kw):
                out = real(trainer, simulated=simulated, **kw)
                calls.append((trainer.step, out))
                return out

            offline.trainer_spec_eval = spy  # the trainer imports it from the module at each call
            try:
                res = train(run_config(tiny, tmp_path_factory.mktemp(f"full_{family}"), family, save_every=SAVE,
                                       spec_eval_every=SAVE, spec_eval_prompts=2), progress=False)
            finally:
                offline.trainer_spec_eval = real
            runs[family] = res, calls
        return runs[family]

    return get


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_checkpoint_is_the_family_export(full, family):
    res, _ = full(family)
    assert res.step == STEPS and res.checkpoint.name == f"epoch_1_step_{STEPS}"
    cons = res.checkpoint / "model" / "consolidated"
    cfg = json.loads((cons / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    on_disk = [i - 1 for i in ENGINE_IDS[family]]  # DFlash files index decoder-layer outputs
    dflash_config = {"block_size": BS, "mask_token_id": MASK, "target_layer_ids": on_disk}
    if family == "jetspec":
        dflash_config["causal"] = True
    if family == "domino":
        dflash_config.update(projector_type="domino", emb_dim=16, gru_hidden_dim=8, pure_draft_prefix_len=0,
                             shift_label=True)
    assert cfg["dflash_config"] == dflash_config
    assert cfg["is_causal"] is (family == "jetspec") and cfg["block_size"] == BS
    assert {k: cfg[k] for k in ("hidden_size", "num_hidden_layers", "num_target_layers", "vocab_size")} == {
        "hidden_size": H, "num_hidden_layers": 2, "num_target_layers": L, "vocab_size": len(make_tokenizer("chatml"))}
    assert cfg["draftsmith"]["draft_type"] == family

    weights = load_file(str(cons / "model.safetensors"))
    expected = ["fc.weight", "hidden_norm.weight", "norm.weight"] + [f"layers.{i}.{n}" for i in range(2) for n in LAYER]
    if family == "domino":
        expected += ["prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight", "embed_proj.2.weight"]
    assert sorted(weights) == sorted(expected)  # no embed_tokens, no lm_head: the target's are borrowed
    assert weights["fc.weight"].shape == (H, 2 * H)

    # docs/guides/families.md: the checkpoint's meta records the block draft's own facts
    meta = json.loads((res.checkpoint / "meta.json").read_text())
    assert meta["draft_type"] == family and meta["aux_layer_ids"] == ENGINE_IDS[family]
    assert {k: meta[k] for k in ("block_size", "mask_token_id", "target_layer_ids")} == {
        "block_size": BS, "mask_token_id": MASK, "target_layer_ids": on_disk}
    mid = json.loads((res.checkpoint.parent / f"epoch_0_step_{SAVE}" / "meta.json").read_text())
    assert mid["batch_pos"] == SAVE and mid["mask_token_id"] == MASK


def optimizer_tensors(ckpt):
    state = torch.load(ckpt / "optim.pt", weights_only=False)["optimizer"]["state"]
    return {f"{p}.{k}": v for p, s in state.items() for k, v in s.items() if torch.is_tensor(v)}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_resume_mid_run_is_bitwise_equal(full, tiny, tmp_path, family):
    # Anchors are drawn from torch's global RNG (saved in every checkpoint), Domino's loss mixes by a
    # lambda of the optimizer step (restored with it): the resumed run must take every step the same.
    from draftsmith.train.loop import train

    whole, _ = full(family)
    mid = whole.checkpoint.parent / f"epoch_0_step_{SAVE}"
    resumed = train(run_config(tiny, tmp_path / "resumed", family, spec_eval_every=SAVE, spec_eval_prompts=2),
                    resume=mid, progress=False)
    assert resumed.step == whole.step == STEPS
    a = load_file(str(whole.checkpoint / "model" / "consolidated" / "model.safetensors"))
    b = load_file(str(resumed.checkpoint / "model" / "consolidated" / "model.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    oa, ob = optimizer_tensors(whole.checkpoint), optimizer_tensors(resumed.checkpoint)
    assert oa.keys() == ob.keys() and oa
    for k in oa:
        assert torch.equal(oa[k], ob[k]), k
    ra, rb = (torch.load(r.checkpoint / "rng.pt", weights_only=False) for r in (whole, resumed))
    assert torch.equal(ra["torch"], rb["torch"])  # the same anchors were drawn after the cut
    assert [l for s, l in whole.history if s > SAVE] == [l for _, l in resumed.history]
    assert len(resumed.history) == STEPS - SAVE
    assert resumed.eval["loss"] == whole.eval["loss"]
    assert resumed.eval["step_accuracy"] == whole.eval["step_accuracy"] and len(whole.eval["step_accuracy"]) == K[family]
    # A finished run resumed trains nothing and re-evaluates to the same held-out metrics (Domino's
    # held-out loss is taken at the checkpoint's step, not at whatever step the fresh draft holds).
    again = train(run_config(tiny, tmp_path / "again", family), resume=whole.checkpoint, progress=False)
    assert again.step == STEPS and again.history == []
    assert again.eval["loss"] == whole.eval["loss"], (again.eval, whole.eval)


@pytest.mark.slow
def test_domino_lambda_follows_the_restored_step(full, tiny, tmp_path):
    # The schedule is a function of the optimizer step: lambda_start 1, decay over 5 of 10 steps.
    from draftsmith.train.loop import Trainer

    whole, _ = full("domino")
    trainer = Trainer(run_config(tiny, tmp_path / "t", "domino"), resume=whole.checkpoint.parent / f"epoch_0_step_{SAVE}",
                      progress=False)
    try:
        assert trainer.step == SAVE and trainer.total_steps == STEPS
        trainer.evaluate()
        assert trainer.draft.lam == pytest.approx(1.0 - SAVE / 5)
    finally:
        trainer.engine.close()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_resume_refuses_a_changed_mask_token_or_block_size(full, tiny, tmp_path, family):
    from draftsmith.train.loop import train

    whole, _ = full(family)
    mid = whole.checkpoint.parent / f"epoch_0_step_{SAVE}"
    with pytest.raises(CheckpointError) as err:
        train(run_config(tiny, tmp_path / "m", family, draft={"mask_token_id": MASK + 1}), resume=mid, progress=False)
    msg = str(err.value)
    assert f"dflash_config.mask_token_id {MASK} -> {MASK + 1}" in msg and "\n" not in msg, msg
    with pytest.raises(CheckpointError) as err:
        train(run_config(tiny, tmp_path / "b", family, draft={"block_size": BS + 2}), resume=mid, progress=False)
    msg = str(err.value)
    assert f"block_size {BS} -> {BS + 2}" in msg and f"dflash_config.block_size {BS} -> {BS + 2}" in msg, msg
    assert "\n" not in msg


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_spec_eval_hook_runs_for_block_drafts(full, family):
    res, calls = full(family)
    assert [step for step, _ in calls] == [3, 6, 9, STEPS]  # every spec_eval_every steps, then at the end
    for _, out in calls:
        assert out["real_tau"] >= 1.0 and len(out["real_acceptance_per_position"]) == K[family]
    assert res.eval["real_tau"] == calls[-1][1]["real_tau"]


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_eval_is_lossless_with_k_of_the_block(full, tiny, family):
    from draftsmith.eval.offline import run_eval

    res, _ = full(family)
    _, _, prompts = tiny
    report = run_eval(target=None, draft=str(res.output_dir), prompts=str(prompts), max_new_tokens=16,
                      progress=False)  # the target from meta.json, the checkpoint from LATEST
    assert report["config"]["k"] == K[family] and report["config"]["aux_layer_ids"] == ENGINE_IDS[family]
    assert report["lossless"] == {"checked": 2, "mismatches": []}
    assert len(report["overall"]["acceptance_per_position"]) == K[family] and report["overall"]["tau"] >= 1.0
    assert all(r["token_ids"] for r in report["records"])
    with pytest.raises(EvalError, match=rf"-k {K[family] + 1}: .* pass -k between 1 and {K[family]}"):
        run_eval(target=None, draft=str(res.checkpoint), prompts=str(prompts), k=K[family] + 1, max_new_tokens=4,
                 progress=False)


@pytest.mark.slow
def test_eagle_loaders_refuse_a_dflash_checkpoint(full):
    res, _ = full("dflash")
    cons = res.checkpoint / "model" / "consolidated"
    config, state = json.loads((cons / "config.json").read_text()), read_tensors(cons / "model.safetensors")
    embeddings = torch.zeros(config["vocab_size"], H)
    for load in (lambda: eagle3.load_exported(config, state, embeddings), lambda: eagle3.load_exported(config, state),
                 lambda: peagle.load_exported(config, state, embeddings), lambda: eagle3.layer_ids_from_export(config)):
        with pytest.raises(DraftError) as err:
            load()
        msg = str(err.value)
        assert "describes a dflash block draft (Qwen3DFlashDraftModel" in msg and "\n" not in msg, msg
        assert "get_family('dflash').load_exported" in msg


@pytest.mark.parametrize("family", ["dflash", "peagle", "eagle3"])
def test_activation_checkpointing_reaches_the_draft_from_a_yaml_config(tiny, tmp_path, family):
    import yaml

    from draftsmith.config import load_config
    from draftsmith.train.loop import Trainer

    target, data, _ = tiny
    draft = {"peagle": {"type": "peagle", "mask_token_id": MASK, "num_depths": 3, "num_draft_layers": 2},
             "eagle3": {"type": "eagle3", "ttt_steps": 2},
             "dflash": {"type": "dflash", "mask_token_id": MASK, "block_size": BS, "num_draft_layers": 2,
                        "num_anchors": 4}}[family]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({
        "target": {"path": str(target), "aux_layer_ids": None if family == "dflash" else [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2}, "draft": draft,
        "train": {"batch_size": 2, "num_threads": 1, "activation_checkpointing": True},
        "output": {"dir": str(tmp_path / "out"), "tensorboard": False}}))
    trainer = Trainer(load_config(path), progress=False)
    try:
        draft = trainer.draft
        assert draft.activation_checkpointing is True
        calls = []
        if family == "eagle3":  # what EAGLE-3 recomputes is each TTT step
            step = draft.ttt_step
            draft.ttt_step = lambda *a, **k: calls.append(1) or step(*a, **k)
        else:
            (draft.layers if family == "dflash" else draft.model.layers)[-1].register_forward_pre_hook(
                lambda *_: calls.append(1))
        out = trainer.forward(trainer.train_set[:2])[0]
        n = len(calls)
        out.loss.backward()
        assert n >= 1 and len(calls) == 2 * n  # each checkpointed forward ran again in backward
    finally:
        trainer.engine.close()
