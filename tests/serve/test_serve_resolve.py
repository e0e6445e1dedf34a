"""Resolution of user-supplied draft paths, for every layout and draft type."""

import os

import pytest

import serve_ckpts as sc
from draftsmith.serve.resolve import ServeError, resolve_draft, weight_names, weight_shapes

KINDS = ["eagle3", "peagle", "dflash", "jetspec", "domino", "standard", "sharded", "bin"]
FAMILY = {"eagle3": "eagle3", "peagle": "peagle", "dflash": "dflash", "jetspec": "jetspec", "domino": "domino",
          "standard": "eagle3", "sharded": "eagle3", "bin": "eagle3"}
LAYOUT = {"sharded": "sharded", "bin": "bin"}


@pytest.mark.parametrize("kind", KINDS)
def test_every_fixture_resolves_to_its_family_and_layout(tmp_path, kind):
    d = resolve_draft(sc.make(kind, tmp_path))
    assert d.family == FAMILY[kind]
    assert d.layout == LAYOUT.get(kind, "safetensors")
    assert (d.dir / "config.json").is_file()


def test_checkpoint_dir_model_dir_consolidated_and_bare_consolidated_all_resolve_to_the_same_place(tmp_path):
    ckpt = sc.make("eagle3", tmp_path)
    want = (ckpt / "model" / "consolidated").resolve()
    for p in (ckpt, ckpt / "model", ckpt / "model" / "consolidated"):
        assert resolve_draft(p).dir == want
    bare = tmp_path / "bare"
    sc.write(bare / "consolidated", sc.eagle_config(), sc.eagle_state())
    assert resolve_draft(bare).dir == (bare / "consolidated").resolve()
    assert resolve_draft(bare / "consolidated").dir == (bare / "consolidated").resolve()


def test_run_dir_and_checkpoints_root_follow_latest(tmp_path):
    ckpt = sc.make("eagle3", tmp_path / "run" / "checkpoints")
    os.symlink(ckpt.name, tmp_path / "run" / "checkpoints" / "LATEST")
    want = (ckpt / "model" / "consolidated").resolve()
    assert resolve_draft(tmp_path / "run").dir == want
    assert resolve_draft(tmp_path / "run" / "checkpoints").dir == want


def test_hf_dir_itself_wins_over_subdirs(tmp_path):
    d = sc.make("standard", tmp_path)
    assert resolve_draft(d).dir == d.resolve()


def test_sharded_index_lists_all_tensors_and_covers_index_plus_both_shards(tmp_path):
    d = resolve_draft(sc.make("sharded", tmp_path))
    assert [f.name for f in d.weight_files] == ["model.safetensors.index.json", "model-00001-of-00002.safetensors",
                                                 "model-00002-of-00002.safetensors"]
    assert weight_names(d) == sorted(sc.eagle_state())
    assert weight_shapes(d)["model.fc.weight"] == (sc.H, 3 * sc.HT)


def test_pytorch_bin_names_and_shapes(tmp_path):
    d = resolve_draft(sc.make("bin", tmp_path))
    assert weight_shapes(d)["lm_head.weight"] == (sc.VD, sc.H)
    assert "model.layers.0.self_attn.q_proj.weight" in weight_names(d)


def test_hub_id_passes_through_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = resolve_draft("org-name/my_draft.v2")
    assert d.is_hub and d.source == "org-name/my_draft.v2" and d.config == {}


def test_missing_path_is_a_one_line_error(tmp_path):
    with pytest.raises(ServeError, match="does not exist and is not a hub id") as e:
        resolve_draft(tmp_path / "nope")
    assert "\n" not in str(e.value)


def test_existing_path_without_a_candidate_names_what_was_tried(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # config but no weights
    with pytest.raises(ServeError, match=r"no draft under .*tried .*consolidated.*needs config.json plus"):
        resolve_draft(tmp_path)


def test_index_naming_a_missing_shard_is_an_error(tmp_path):
    d = sc.make("sharded", tmp_path)
    (d / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ServeError, match="model-00002-of-00002.safetensors that are missing"):
        resolve_draft(d)


def test_checkpoint_root_is_found_above_model_consolidated(tmp_path):
    ckpt = sc.make("eagle3", tmp_path)
    assert resolve_draft(ckpt).checkpoint_root() == ckpt.resolve()
