"""NeMo AutoModel recipes as they are (issue 25 item 2): recipes written from AutoModel's documented schema
(examples/speculative/{eagle3,p-eagle,dflash}/*.yaml: recipe, dist_env, recipe_args, optimizer, checkpoint)
train on a tiny target through `draftsmith train RECIPE`, with AutoModel's HF-hook layer ids (output of
decoder layer j) exported as engine ids (j + 1); unsupported keys are one error listing them all; and
`draftsmith convert-recipe` writes a draftsmith YAML that loads to the same config."""

import json

import pytest

from draftsmith.cli import EXIT_BAD_INPUT, main
from draftsmith.config import ConfigError, load_config
from draftsmith.drafts import get_family
from draftsmith.layout import MODEL_SUBDIR
from draftsmith.recipe import map_recipe
from fixtures import make_tiny_llama, make_tokenizer, write_chats

L = 6  # target layers: AutoModel ids 0..5, engine ids 1..6
MASK = 5  # <|start_header_id|>: never in chatml text
AUX = {"eagle3": [0, 2, 4], "peagle": [1, 3, 4], "dflash": [1, 4]}  # AutoModel (HF-hook) ids per recipe

pytestmark = pytest.mark.usefixtures("restore_threads")  # train.num_threads 1 is undone after the module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=L)
    return target, write_chats(root / "chats.jsonl", n=8)


def recipe(kind, target, data, out, **extra_args):
    """An AutoModel recipe as its examples are written (llama_eagle3_mvp.yaml, llama_peagle_mvp.yaml,
    qwen3_dflash.yaml), shrunk to the tiny target."""
    args = {
        "target_model_name_or_path": str(target), "train_data_path": str(data), "val_data_path": None,
        "output_dir": str(out), "seq_length": 48, "micro_batch_size": 2, "grad_accumulation_steps": 1,
        "num_workers": 0, "num_epochs": 1, "trust_remote_code": False, "shuffle_seed": 42, "log_every_steps": 10,
        "max_grad_norm": 1.0,
    }
    if kind in ("eagle3", "peagle"):
        args.update(train_split=None, val_split=None, draft_vocab_size=64, aux_layer_ids=AUX[kind])
        args.update({"ttt_steps": 2, "freeze_embeddings": True} if kind == "eagle3" else
                    {"parallel_drafting": True, "num_depths": 3, "num_draft_layers": 2, "down_sample_ratio": 0.7,
                     "down_sample_ratio_min": 0.2, "mask_token_id": MASK, "freeze_embeddings": False})
    else:
        args.update(draft_num_hidden_layers=2, block_size=4, num_anchors=4, loss_decay_gamma=7.0, mask_token_id=MASK,
                    target_layer_ids=AUX[kind], attention_backend="sdpa")
    args.update(extra_args)
    optimizer = {"lr": 1.0e-3, "betas": [0.9, 0.95], "weight_decay": 0.0}
    if kind == "dflash":
        optimizer.update(warmup_ratio=0.5, min_lr_ratio=0.1)
    return {
        "recipe": "TrainDFlashRecipe" if kind == "dflash" else "TrainEagle3Recipe",
        "dist_env": {"backend": "nccl", "timeout_minutes": 30},
        "recipe_args": args,
        "optimizer": optimizer,
        "checkpoint": {"enabled": True, "checkpoint_dir": str(out / "checkpoints"), "model_save_format": "safetensors",
                       "save_consolidated": True},
    }


def write(path, body):
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


@pytest.mark.parametrize("kind", list(AUX))
def test_recipe_trains_and_exports_engine_ids(tmp_path, capsys, tiny, kind):
    target, data = tiny
    path = write(tmp_path / "recipe.yaml", recipe(kind, target, data, tmp_path / "out"))
    assert main(["train", str(path), "--no-progress", "--set", "train.num_threads=1"]) == 0
    out = capsys.readouterr().out
    engine = [i + 1 for i in AUX[kind]]
    key = "aux_layer_ids" if kind != "dflash" else "target_layer_ids"
    assert f"recipe_args.{key} -> target.aux_layer_ids = {engine}" in out and "HF-hook ids" in out
    assert f"-> draftsmith draft.type {kind}" in out and "recipe_args.seq_length -> data.max_length = 48" in out
    ckpt = tmp_path / "out" / "checkpoints" / "epoch_0_step_4"  # 8 chats, batch 2, no validation set
    meta = json.loads((ckpt / "meta.json").read_text())
    exported = json.loads((ckpt / MODEL_SUBDIR / "config.json").read_text())
    assert meta["draft_type"] == kind and meta["aux_layer_ids"] == engine
    assert get_family(kind).layer_ids_from_export(exported) == engine  # what eval / serve read back
    if kind == "dflash":  # the DFlash config.json keeps AutoModel's own convention: id j = output of layer j
        assert exported["dflash_config"]["target_layer_ids"] == AUX[kind]
        assert exported["dflash_config"]["mask_token_id"] == MASK and exported["num_hidden_layers"] == 2
    else:
        assert exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == engine
        assert exported["draft_vocab_size"] == 64
        assert exported.get("parallel_drafting", False) == (kind == "peagle")


def test_recipe_keeps_automodel_defaults_and_its_schedule(tmp_path, tiny):
    """Absent keys take AutoModel's values, not draftsmith's; warmup_ratio counts as AutoModel does."""
    from draftsmith.train.loop import Trainer

    target, data = tiny
    eagle = load_config(write(tmp_path / "e.yaml", recipe("eagle3", target, data, tmp_path / "e", max_grad_norm=2.0)))
    assert (eagle.train.max_grad_norm, eagle.train.warmup_fraction, eagle.train.min_lr_ratio) == (2.0, 0.05, 0.1)
    assert (eagle.train.seed, eagle.data.eval_size, eagle.train.batch_size, eagle.draft.ttt_steps) == (42, 0, 2, 2)
    body = recipe("dflash", target, data, tmp_path / "d")
    del body["recipe_args"]["num_anchors"], body["recipe_args"]["draft_num_hidden_layers"]
    cfg = load_config(write(tmp_path / "d.yaml", body), ["train.num_threads=1"])
    assert (cfg.draft.num_anchors, cfg.draft.num_draft_layers) == (512, 5)  # AutoModel's DFlash defaults
    trainer = Trainer(cfg, progress=False)
    assert trainer.total_steps == 4 and trainer.schedule.warmup == 2  # max(1, int(0.5 x 4))


def test_keys_map_as_documented():
    base = {"target_model_name_or_path": "t", "train_data_path": "HuggingFaceH4/ultrachat_200k"}
    m = map_recipe({"recipe": "TrainEagle3Recipe", "recipe_args": {
        **base, "train_split": "train_sft[:200]", "val_data_path": "v.jsonl", "target_model_backend": "vllm",
        "vllm_args": {"max_model_len": 512}, "ckpt_every_steps": 0, "draft_gradient_checkpointing": True},
        "distributed": {"strategy": "fsdp2", "tp_size": 1}})
    assert m.raw["data"]["sources"] == ["HuggingFaceH4/ultrachat_200k:train_sft[:200]"]
    assert m.raw["data"]["eval_sources"] == ["v.jsonl"] and "eval_size" not in m.raw["data"]
    assert m.raw["target"] == {"path": "t", "engine": "vllm",
                               "engine_kwargs": {"gpu_memory_utilization": 0.5, "max_model_len": 512}}
    assert m.raw["train"]["parallel"] == "fsdp2" and m.raw["train"]["save_every"] == 0
    assert m.raw["train"]["activation_checkpointing"] is True and m.raw["data"]["draft_vocab_size"] is None
    remote = map_recipe({"recipe_args": {**base, "target_model_backend": "remote", "remote_urls": ["http://h:1"]}})
    assert remote.raw["target"] == {"path": "t", "engine": "remote", "remote_urls": ["http://h:1"],
                                    "prefetch_depth": 0, "remote_timeout_s": 120.0, "remote_retries": 3}
    assert remote.family == "eagle3"  # no `recipe`: AutoModel's EAGLE-3 recipe
    assert any("(AutoModel default) -> target.prefetch_depth = 0" in str(line) for line in remote.lines)
    # off switches change nothing here: accepted, printed as such, nothing set
    off = map_recipe({"recipe_args": base, "compile": {"enabled": False}, "rng": {"seed": 1},
                      "checkpoint": {"save_consolidated": False}, "distributed": {"sequence_parallel": False,
                                                                                  "cp_size": 1}})
    assert "compile = {'enabled': False} -> (no draftsmith key: off)" in off.text()
    assert off.raw["train"]["seed"] == 42 and "parallel" not in off.raw["train"]  # rng.seed is not AutoModel's seed
    # W&B and per-epoch saves map onto output.wandb_* and train.save_every_epoch
    wb = map_recipe({"recipe_args": {**base, "save_checkpoint_every_epoch": True},
                     "wandb": {"project": "spec", "name": "run1", "entity": "team", "save_dir": "/w"}})
    assert wb.raw["output"] == {"wandb": True, "wandb_project": "spec", "wandb_name": "run1"}
    assert wb.raw["train"]["save_every_epoch"] is True and "export WANDB_ENTITY" in wb.text()
    with pytest.raises(ConfigError, match=r"wandb.tags = .*project, name and mode"):
        map_recipe({"recipe_args": base, "wandb": {"tags": ["a"]}})


def test_unsupported_keys_are_listed_at_once(tmp_path, capsys, tiny):
    target, data = tiny
    body = recipe("eagle3", target, data, tmp_path / "out", lk_loss_type="lk_alpha",
                  cached_target_path="/cache", mask_token_id=MASK, block_size=8)
    body["peft"] = {"dim": 8}
    body["distributed"] = {"strategy": "megatron_fsdp", "tp_size": 2}
    body["checkpoint"]["restore_from"] = "LATEST"
    body["optimizer"]["foreach"] = True
    path = write(tmp_path / "recipe.yaml", body)
    code = main(["train", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT and err.startswith("draftsmith: error:")
    for key in ("recipe_args.lk_loss_type", "recipe_args.cached_target_path", "recipe_args.mask_token_id",
                "recipe_args.block_size", "peft", "distributed.strategy", "distributed.tp_size",
                "checkpoint.restore_from", "optimizer.foreach"):
        assert f"AutoModel key {key} =" in err, (key, err)
    assert "9 problem(s)" in err and "draftsmith cache" in err and "--resume" in err
    assert not (tmp_path / "out").exists()
    # a DFlash recipe with the EAGLE-3 key and a missing mask token: both in the one error
    body = recipe("dflash", target, data, tmp_path / "out", aux_layer_ids=[0, 1, 2])
    del body["recipe_args"]["mask_token_id"]
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path / "d.yaml", body))
    assert "recipe_args.aux_layer_ids" in str(e.value) and "mapped: 'draft.mask_token_id' is required" in str(e.value)


@pytest.mark.parametrize("kind", list(AUX))
def test_convert_recipe_round_trips(tmp_path, capsys, tiny, kind):
    target, data = tiny
    src = write(tmp_path / "recipe.yaml", recipe(kind, target, data, tmp_path / "out"))
    dst = tmp_path / "conv" / "draftsmith.yaml"
    assert main(["convert-recipe", str(src), str(dst)]) == 0
    assert f"train with: draftsmith train {dst}" in capsys.readouterr().out
    text = dst.read_text()
    assert text.startswith("# draftsmith run config converted") and "recipe_args" not in text.split("\n\n", 1)[1]
    assert [p.name for p in dst.parent.iterdir()] == ["draftsmith.yaml"]  # no temporary file left
    assert load_config(dst) == load_config(src)
    assert load_config(dst).target.aux_layer_ids == [i + 1 for i in AUX[kind]]
    # the output is a draftsmith config, not a recipe; and a bad recipe writes nothing
    assert main(["convert-recipe", str(dst), str(tmp_path / "again.yaml")]) == EXIT_BAD_INPUT
    bad = write(tmp_path / "bad.yaml", {**recipe(kind, target, data, tmp_path / "out"), "fp8": {"enabled": True}})
    assert main(["convert-recipe", str(bad), str(tmp_path / "bad_out.yaml")]) == EXIT_BAD_INPUT
    assert "AutoModel key fp8" in capsys.readouterr().err and not (tmp_path / "bad_out.yaml").exists()


def test_converted_config_trains_the_same_draft(tmp_path, tiny):
    """`draftsmith train OUT` after convert-recipe runs as `draftsmith train RECIPE` does: the same weights."""
    from safetensors.torch import load_file

    target, data = tiny
    src = write(tmp_path / "recipe.yaml", recipe("dflash", target, data, tmp_path / "out"))
    dst = tmp_path / "converted.yaml"
    assert main(["convert-recipe", str(src), str(dst)]) == 0
    weights = []
    for config, out in ((src, "a"), (dst, "b")):
        assert main(["train", str(config), "--no-progress", "--set", "train.num_threads=1",
                     "--set", f"output.dir={tmp_path / out}"]) == 0
        weights.append(load_file(tmp_path / out / "checkpoints" / "epoch_0_step_4" / MODEL_SUBDIR / "model.safetensors"))
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])
