"""Bad input gets one line on stderr naming the problem and a non-zero exit (CLI level)."""

import json

import pytest

from draftsmith.cli import EXIT_BAD_INPUT, main
from fixtures import make_tiny_llama, make_tokenizer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("t") / "target", make_tokenizer("chatml"), num_layers=4)


def write_config(tmp_path, target, sources, **extra):
    cfg = tmp_path / "run.yaml"
    body = {
        "target": {"path": str(target)},
        "data": {"sources": [str(s) for s in sources], "max_length": 48, "eval_size": 1, "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2},
        "train": {"max_steps": 2},
        "output": {"dir": str(tmp_path / "out"), "tensorboard": False},
    }
    for sec, kv in extra.items():
        body.setdefault(sec, {}).update(kv)
    cfg.write_text(json.dumps(body))  # JSON is YAML
    return cfg


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    return code, err


def assert_one_line(code, err, *needles):
    assert code == EXIT_BAD_INPUT, err
    assert err.startswith("draftsmith: error:") and "\n" not in err, err
    for n in needles:
        assert n in err, err


def chats(tmp_path, n=6):
    p = tmp_path / "chats.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}
    p.write_text((json.dumps(row) + "\n") * n)
    return p


def test_missing_data_file(tmp_path, capsys, target):
    cfg = write_config(tmp_path, target, [tmp_path / "nope.jsonl"])
    assert_one_line(*run(capsys, "train", str(cfg), "--no-progress"), "nope.jsonl", "does not exist")


def test_empty_dataset(tmp_path, capsys, target):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = write_config(tmp_path, target, [empty])
    assert_one_line(*run(capsys, "train", str(cfg), "--no-progress"), "empty.jsonl")


def test_all_rows_malformed(tmp_path, capsys, target):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": "not a list"}\n{oops\n')
    cfg = write_config(tmp_path, target, [bad])
    assert_one_line(*run(capsys, "train", str(cfg), "--no-progress"), "bad.jsonl")


def test_config_typo(tmp_path, capsys, target):
    cfg = write_config(tmp_path, target, [chats(tmp_path)], train={"learning_rat": 1e-3})
    assert_one_line(*run(capsys, "train", str(cfg)), "train.learning_rat", "lr")


def test_set_typo(tmp_path, capsys, target):
    cfg = write_config(tmp_path, target, [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--set", "train.max_step=3"), "train.max_step", "max_steps")


def test_target_path_does_not_exist(tmp_path, capsys):
    cfg = write_config(tmp_path, tmp_path / "no-such-target", [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--no-progress"), "no-such-target", "does not exist")


def test_truncated_checkpoint(tmp_path, capsys, target):
    ck = tmp_path / "epoch_0_step_1"
    (ck / "model" / "consolidated").mkdir(parents=True)
    (ck / "model" / "consolidated" / "config.json").write_text("{}")
    (ck / "model" / "consolidated" / "model.safetensors").write_bytes(b"\x10\x00\x00")  # cut mid-header
    for f in ("vocab.safetensors", "optim.pt", "rng.pt"):
        (ck / f).write_bytes(b"")
    (ck / "meta.json").write_text("{}")
    cfg = write_config(tmp_path, target, [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--resume", str(ck), "--no-progress"), str(ck), "corrupt or truncated")


def test_half_written_checkpoint_is_incomplete(tmp_path, capsys, target):
    ck = tmp_path / "epoch_0_step_1"
    (ck / "model" / "consolidated").mkdir(parents=True)
    cfg = write_config(tmp_path, target, [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--resume", str(ck), "--no-progress"), "incomplete", "meta.json")


def test_train_then_bare_resume_uses_latest(tmp_path, capsys, target):
    cfg = write_config(tmp_path, target, [chats(tmp_path)])
    assert main(["train", str(cfg), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint:" in out and "epoch_0_step_2" in out
    # already finished: resuming re-evaluates and re-saves the same step without training more
    assert main(["train", str(cfg), "--resume", "--no-progress"]) == 0
    assert "trained 2 steps" in capsys.readouterr().out


def test_engine_flag_overrides_config_and_unavailable_engine_fails_first(tmp_path, capsys, target):
    # sglang cannot run here (no CPU build): the run stops before data or the target load, naming why
    cfg = write_config(tmp_path, target, [tmp_path / "missing.jsonl"])
    code, err = run(capsys, "train", str(cfg), "--engine", "sglang", "--no-progress")
    assert code == EXIT_BAD_INPUT and "\n" not in err and "sglang" in err.lower(), err


# ---------------------------------------------------------------------------------- DFlash family
MASK = 5  # <|start_header_id|>: never in chatml text


def write_dflash_config(root, target, sources, draft_type="dflash", out="out"):
    """A tiny DFlash run on the 4-layer target: one draft layer reads the default id (engine 3)."""
    cfg = root / f"{draft_type}.yaml"
    cfg.write_text(json.dumps({
        "target": {"path": str(target)},
        "data": {"sources": [str(s) for s in sources], "max_length": 48, "eval_size": 1},
        "draft": {"type": draft_type, "mask_token_id": MASK, "block_size": 4, "num_draft_layers": 1, "num_anchors": 4},
        "train": {"max_steps": 2, "num_threads": 1},
        "output": {"dir": str(root / out), "tensorboard": False},
    }))
    return cfg


pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/conftest.py: train.num_threads 1 is undone


@pytest.fixture(scope="module")
def dflash_ckpt(tmp_path_factory, target):
    root = tmp_path_factory.mktemp("dflash")
    cfg = write_dflash_config(root, target, [chats(root)])
    assert main(["train", str(cfg), "--no-progress"]) == 0
    return root / "out" / "checkpoints" / "epoch_0_step_2"


@pytest.mark.parametrize("override, needles", [
    ("draft.block_size=1", ["'draft.block_size' = 1", "expected an integer >= 2"]),
    ("draft.mask_token_id=384", ["draft.mask_token_id=384", "0..383"]),  # the tiny target's vocab is 384
    ("target.aux_layer_ids=[1, 99]", ["target.aux_layer_ids", "layer id 99", "ids are 1..4"]),
    ("target.aux_layer_ids=[0, 3]", ["target.aux_layer_ids", "layer id 0", "ids are 1..4", "embeddings"]),
])
def test_dflash_bad_values_are_one_line_errors(tmp_path, capsys, target, override, needles):
    cfg = write_dflash_config(tmp_path, target, [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--no-progress", "--set", override), *needles)
    assert not (tmp_path / "out" / "checkpoints").exists()


def test_dflash_checkpoint_records_its_block_facts(dflash_ckpt):
    meta = json.loads((dflash_ckpt / "meta.json").read_text())
    assert meta["draft_type"] == "dflash" and meta["aux_layer_ids"] == [3]
    assert (meta["block_size"], meta["mask_token_id"], meta["target_layer_ids"]) == (4, MASK, [2])


def test_dflash_resume_with_another_mask_token_is_refused(tmp_path, capsys, target, dflash_ckpt):
    cfg = write_dflash_config(tmp_path, target, [chats(tmp_path)])
    assert_one_line(*run(capsys, "train", str(cfg), "--resume", str(dflash_ckpt), "--no-progress",
                         "--set", f"draft.mask_token_id={MASK + 1}"),
                    "draft's config changed", f"dflash_config.mask_token_id {MASK} -> {MASK + 1}")


@pytest.mark.parametrize("with_type", [True, False])
def test_an_eagle3_run_refuses_a_dflash_checkpoint(tmp_path, capsys, target, dflash_ckpt, with_type):
    import shutil

    ckpt = dflash_ckpt
    if not with_type:  # a checkpoint from before meta.json named its family: classified by config.json
        ckpt = tmp_path / dflash_ckpt.name
        shutil.copytree(dflash_ckpt, ckpt)
        meta = json.loads((ckpt / "meta.json").read_text())
        del meta["draft_type"]
        (ckpt / "meta.json").write_text(json.dumps(meta))
    cfg = write_config(tmp_path, target, [chats(tmp_path)])  # an EAGLE-3 run
    assert_one_line(*run(capsys, "train", str(cfg), "--resume", str(ckpt), "--no-progress"),
                    "a dflash checkpoint cannot resume a draft.type eagle3 run", "draft.type: dflash")


@pytest.mark.parametrize("method", ["eagle3", "eagle"])
def test_serve_vllm_refuses_an_eagle_method_for_a_dflash_checkpoint(capsys, target, dflash_ckpt, method):
    args = ["serve", "vllm", "--target", str(target), "--draft", str(dflash_ckpt), "--print-only"]
    code, err = run(capsys, *args, "--method", method)
    assert_one_line(code, err, f"--method {method}", "dflash-family draft", "--method dflash")
    assert main(args) == 0  # its own method is the default
    assert '"method": "dflash"' in capsys.readouterr().out
