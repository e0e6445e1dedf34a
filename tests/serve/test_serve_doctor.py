"""doctor: a clean draft exits 0; each planted defect yields exactly the one line that names it."""

import json

import pytest
import torch

import serve_ckpts as sc
from draftsmith.serve.cli import main
from draftsmith.serve.doctor import diagnose
from draftsmith.serve.resolve import resolve_draft


def problems(draft_path, target=None, engine="vllm"):
    return diagnose(resolve_draft(draft_path), target=str(target) if target else None, engine=engine)[0]


@pytest.fixture
def target(tmp_path):
    return sc.make_target(tmp_path / "target")


def test_clean_drafts_have_no_problems(tmp_path, target):
    assert problems(sc.make("eagle3", tmp_path / "a"), target) == []
    assert problems(sc.make("eagle3", tmp_path / "a"), target, engine="sglang") == []
    assert problems(sc.make("peagle", tmp_path / "b"), target) == []
    assert problems(sc.make("dflash", tmp_path / "c"), target) == []
    assert problems(sc.make("sharded", tmp_path / "d"), target) == []


def test_meta_json_supplies_the_target_when_none_is_given(tmp_path):
    assert problems(sc.make("eagle3", tmp_path)) == []
    _, notes = diagnose(resolve_draft(sc.make("eagle3", tmp_path)))
    assert "meta.json" in notes[1]


def one(found, *needles):
    assert len(found) == 1, found
    for n in needles:
        assert n in found[0], found[0]


def test_cli_exit_codes(tmp_path, target, capsys):
    assert main(["doctor", str(sc.make("eagle3", tmp_path / "ok")), "--target", str(target)]) == 0
    bad = sc.make_target(tmp_path / "t3", num_hidden_layers=3)
    assert main(["doctor", str(sc.make("eagle3", tmp_path / "bad")), "--target", str(bad)]) == 1
    assert capsys.readouterr().out.count("PROBLEM ") == 1
    assert main(["doctor", str(tmp_path / "missing")]) == 2


def test_aux_layer_out_of_range(tmp_path):
    one(problems(sc.make("eagle3", tmp_path / "d"), sc.make_target(tmp_path / "t", num_hidden_layers=3)),
        "eagle_aux_hidden_state_layer_ids [1, 3, 4] has [4] outside 0..3")


def test_dflash_target_layer_ids_index_layer_outputs(tmp_path):
    one(problems(sc.make("dflash", tmp_path / "d"), sc.make_target(tmp_path / "t", num_hidden_layers=3)),
        "dflash_config.target_layer_ids [0, 2, 3] has [3] outside 0..2")


def test_missing_aux_ids_take_the_engine_default_and_are_checked_against_training(tmp_path, target):
    # NeMo AutoModel's checkpoint: no aux ids, the target's layer count: fixup + note, no problem
    t32 = sc.make_target(tmp_path / "t32", num_hidden_layers=32)
    found, notes = diagnose(resolve_draft(sc.make("automodel", tmp_path / "a")), target=str(t32))
    assert found == []
    aux = [n for n in notes if "eagle_aux_hidden_state_layer_ids is absent" in n]
    assert len(aux) == 1 and "will use [2, 16, 29]" in aux[0], notes
    assert "equals NeMo AutoModel's default (HF-hook ids [1, 15, 28] = engine ids [2, 16, 29])" in aux[0]
    assert any(n.startswith("fixup: num_hidden_layers 32 -> 1 in the served copy") for n in notes), notes
    # a draftsmith checkpoint whose meta.json records other ids than the engine's default
    cfg = sc.eagle_config()
    del cfg["eagle_config"]
    ckpt = sc.draftsmith_checkpoint(tmp_path / "b", cfg, sc.eagle_state())  # meta: trained on [1, 3, 4]
    one(problems(ckpt, t32), "vLLM would read [2, 16, 29]", "trained on [1, 3, 4]")
    # the 6-layer target's default (2, 3, 3) dedups to 2 ids where the fc reads 3 states
    one(problems(sc.write(tmp_path / "c", cfg, sc.eagle_state()), target), "[2, 3]", "fc reads 3")


def test_d2t_out_of_range_and_t2d_disagreeing(tmp_path, target):
    s = sc.eagle_state()
    s["d2t"] = s["d2t"].clone()
    s["d2t"][-1] += 5  # draft id 15 -> target 36 >= 32, and no longer what t2d marks
    found = problems(sc.write(tmp_path / "d", sc.eagle_config(), s), target)
    assert len(found) == 2, found
    assert "target ids 0..36, outside 0..31" in found[0] and "t2d marks 16 ids but d2t names" in found[1]


def test_duplicate_d2t_targets(tmp_path, target):
    s = sc.eagle_state()
    s["d2t"] = s["d2t"].clone()
    s["d2t"][1] = -1  # draft 1 -> target 0, same as draft 0
    found = problems(sc.write(tmp_path / "d", sc.eagle_config(), s), target)
    assert any("same target id" in f for f in found), found


def test_vocab_mismatch_with_target(tmp_path):
    found = problems(sc.make("eagle3", tmp_path / "d"), sc.make_target(tmp_path / "t", vocab_size=64))
    assert any("vocab_size 32 != target vocab 64" in f for f in found), found


@pytest.mark.parametrize("mask,needle", [(3, "is the target's eos token"), (0, "is the target's pad token"),
                                         (40, "outside the embedding (0..31)")])
def test_mask_token_must_be_reserved_and_inside_the_embedding(tmp_path, target, mask, needle):
    cfg = sc.eagle_config(parallel_drafting=True, mask_token_id=mask, num_depths=4)
    one(problems(sc.write(tmp_path / "d", cfg, sc.eagle_state(peagle=True)), target), needle)


def test_peagle_without_mask_hidden_or_mask_token(tmp_path, target):
    cfg = sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4)
    one(problems(sc.write(tmp_path / "a", cfg, sc.eagle_state()), target), "'mask_hidden' is missing")
    cfg = sc.eagle_config(parallel_drafting=True, num_depths=4)
    found = problems(sc.write(tmp_path / "b", cfg, sc.eagle_state(peagle=True)), target)
    assert any("no mask token" in f for f in found), found


def test_hidden_and_rope_mismatch(tmp_path):
    one(problems(sc.make("eagle3", tmp_path / "d"), sc.make_target(tmp_path / "t", hidden_size=16)),
        "target_hidden_size 8 != target hidden_size 16")
    one(problems(sc.make("eagle3", tmp_path / "e"), sc.make_target(tmp_path / "u", rope_theta=100000.0)),
        "rope_theta 10000 != target rope_theta 100000")
    t = sc.make_target(tmp_path / "v", rope_scaling={"rope_type": "llama3", "factor": 8.0})
    one(problems(sc.make("eagle3", tmp_path / "f"), t), "rope scaling none != target's llama3")


def test_fc_shape_disagreeing_with_config(tmp_path, target):
    s = sc.eagle_state()
    s["model.fc.weight"] = torch.zeros(sc.H, 2 * sc.HT)
    one(problems(sc.write(tmp_path / "d", sc.eagle_config(), s), target),
        "'fc.weight' has shape [8, 16] but config.json implies [8, 24]")


def test_k_sanity(tmp_path, target):
    cfg = sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=0)
    one(problems(sc.write(tmp_path / "d", cfg, sc.eagle_state(peagle=True)), target), "num_depths 0 must be in 1..16")


def test_engine_support(tmp_path, target):
    found = problems(sc.make("peagle", tmp_path / "d"), target, engine="sglang")
    one(found, "engine sglang: P-EAGLE")
    one(problems(sc.make("domino", tmp_path / "e"), target), "engine vllm: draft is a Domino")


def test_target_special_ids_from_generation_config(tmp_path):
    t = sc.make_target(tmp_path / "t", eos_token_id=None)
    (t / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 30]}))
    cfg = sc.eagle_config(parallel_drafting=True, mask_token_id=30, num_depths=4)
    one(problems(sc.write(tmp_path / "d", cfg, sc.eagle_state(peagle=True)), t), "mask token 30 is the target's eos")


def test_peagle_weights_under_an_eagle3_config(tmp_path, target):
    # parallel_drafting lost from config.json: export/serve refuse it, and doctor says so too
    d = sc.draftsmith_checkpoint(tmp_path / "d", sc.eagle_config(), sc.eagle_state(peagle=True))
    one(problems(d, target), "weights:", "P-EAGLE's 'mask_hidden'", "restore parallel_drafting: true")
