"""`draftsmith eval` / `bench-server` through argparse, and draft loading from every on-disk layout."""

import argparse
import json

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.eval import EvalError
from draftsmith.eval.cli import register
from draftsmith.eval.offline import load_draft
from draftsmith.train.checkpoint import MODEL_SUBDIR
from eval_helpers import AUX_IDS, save_vllm_layout


def parse(argv):
    p = argparse.ArgumentParser(prog="draftsmith")
    register(p.add_subparsers(dest="command", required=True))
    return p.parse_args(argv)


def save_checkpoint_layout(draft, root, target):
    """A run dir with checkpoints/LATEST -> epoch_0_step_3 (draftsmith names, `model.` prefix)."""
    ck = root / "checkpoints" / "epoch_0_step_3"
    (ck / MODEL_SUBDIR).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in draft.state_dict().items()}, str(ck / MODEL_SUBDIR / "model.safetensors"))
    (ck / MODEL_SUBDIR / "config.json").write_text(json.dumps(draft.export_config(AUX_IDS)))
    (ck / "meta.json").write_text(json.dumps({"target": str(target)}))
    (root / "checkpoints" / "LATEST").symlink_to("epoch_0_step_3")
    return root


def test_both_layouts_load_to_the_same_draft(tiny, tmp_path):
    run = save_checkpoint_layout(tiny.draft, tmp_path / "run", tiny.path)
    fam_a, a, ids_a, dir_a = load_draft(run)
    fam_b, b, ids_b, _ = load_draft(save_vllm_layout(tiny.draft, tmp_path / "vllm"))
    assert fam_a == fam_b == "eagle3" and ids_a == ids_b == AUX_IDS and dir_a.name == "consolidated"
    for k, v in tiny.draft.state_dict().items():
        assert torch.equal(a.state_dict()[k], v) and torch.equal(b.state_dict()[k], v), k


def test_unsupported_and_missing_drafts_are_one_line_errors(tiny, tmp_path):
    d = save_vllm_layout(tiny.draft, tmp_path / "pe")
    cfg = json.loads((d / "config.json").read_text())
    # an EAGLE-3 export flagged parallel: loads as P-EAGLE, which needs a mask token and mask_hidden
    (d / "config.json").write_text(json.dumps({**cfg, "parallel_drafting": True}))
    with pytest.raises(EvalError, match="pe: mask_token_id=None must be an int"):
        load_draft(d)
    (d / "config.json").write_text(json.dumps({**cfg, "parallel_drafting": True, "mask_token_id": 5,
                                               "num_hidden_layers": 1}))
    with pytest.raises(EvalError, match="pe: mask_hidden is missing; .*re-export it$"):
        load_draft(d)
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3DFlashDraftModel"],
                                               "dflash_config": {"block_size": 8}}))
    with pytest.raises(EvalError, match=r"pe: config.json has no dflash_config.target_layer_ids") as err:
        load_draft(d)  # a DFlash config over EAGLE-3 weights: the DFlash loader names what is wrong
    assert "\n" not in str(err.value)
    (d / "config.json").write_text(json.dumps({**cfg, "architectures": ["Qwen3DFlashDraftModel"], "dflash_config": {
        "block_size": 8, "mask_token_id": 5, "target_layer_ids": [0, 1]}, "num_target_layers": 4}))
    with pytest.raises(EvalError, match=r"pe: weights do not fit a DFlashDraft: missing \['hidden_norm.weight'"):
        load_draft(d)
    with pytest.raises(EvalError, match="does not exist"):
        load_draft(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EvalError, match="no config.json"):
        load_draft(tmp_path / "empty")


def test_eval_command_end_to_end(tiny, tmp_path, capsys):
    run = save_checkpoint_layout(tiny.draft, tmp_path / "run", tiny.path)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"q{i}", "category": c, "turns": [q, "And then?"]}) + "\n"
                               for i, (c, q) in enumerate([("jokes", "Tell me a joke about cats."),
                                                           ("facts", "What is the capital of France?"),
                                                           ("facts", "How many legs does a spider have?")])))
    args = parse(["eval", "--draft", str(run), "--prompts", str(prompts), "-k", "3", "--max-new-tokens", "16",
                  "--multi-turn", "--out", str(tmp_path / "out"), "--quiet", "--ignore-eos"])
    assert args.func(args) == 0  # --target comes from the checkpoint's meta.json
    out = capsys.readouterr().out
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["lossless"] == {"checked": 6, "mismatches": []}  # 3 prompts x 2 turns
    assert set(rep["categories"]) == {"jokes", "facts"} and rep["categories"]["facts"]["prompts"] == 2
    assert rep["overall"]["tau"] > 1.0 and all(len(r["token_ids"]) == 16 for r in rep["records"])
    assert (tmp_path / "out" / "acceptance.png").is_file()
    assert "lossless check vs plain greedy: 6/6 identical" in out and "all" in out
    # the pruned draft's vocab against the tokens the target answered with, counted one by one
    ids = [t for r in rep["records"] for t in r["token_ids"]]
    assert tiny.draft.cfg.pruned and len(ids) == 96
    assert rep["draft_vocab_coverage"] == pytest.approx(sum(bool(tiny.draft.t2d[t]) for t in ids) / len(ids))
    assert "draft-vocab coverage of the target's answer tokens" in out and "conditional acceptance" in out


def test_eval_flags_are_validated(tiny, tmp_path):
    run = save_checkpoint_layout(tiny.draft, tmp_path / "run", tiny.path)
    (tmp_path / "p.jsonl").write_text('{"turns": ["hi"]}\n')
    args = parse(["eval", "--draft", str(run), "--prompts", str(tmp_path / "p.jsonl"), "-k", "0"])
    with pytest.raises(EvalError, match="k and max-new-tokens must be >= 1"):
        args.func(args)


def test_bench_server_completions_needs_a_tokenizer(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"turns": ["hi"]}\n')
    args = parse(["bench-server", "--url", "http://127.0.0.1:9", "--prompts", str(tmp_path / "p.jsonl"),
                  "--api", "completions"])
    with pytest.raises(EvalError, match="needs --tokenizer"):
        args.func(args)


def test_automodel_layout_loads_as_served(tiny, tmp_path):
    """NeMo AutoModel's checkpoint: the target's num_hidden_layers over one layer of weights, no aux
    ids. Read as the engines serve it: the layers held, and the ids the engines default to."""
    d = tmp_path / "automodel"
    d.mkdir()
    save_file({k: v.contiguous() for k, v in tiny.draft.state_dict().items()}, str(d / "model.safetensors"))
    cfg = tiny.draft.export_config(AUX_IDS)
    cfg["num_hidden_layers"] = 30
    del cfg["eagle_config"], cfg["draftsmith"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EvalError, match="eagle_aux_hidden_state_layer_ids is missing"):
        load_draft(d)  # no engine default given: nothing to read the ids from
    notes = []
    family, model, ids, _ = load_draft(d, default_layer_ids=[2, 15, 27], notes=notes)
    assert family == "eagle3" and ids == [2, 15, 27]
    for k, v in tiny.draft.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    assert len(notes) == 2 and "num_hidden_layers 30 read as 1" in notes[0] and "reading [2, 15, 27]" in notes[1]
    assert json.loads((d / "config.json").read_text())["num_hidden_layers"] == 30  # the file is only read
