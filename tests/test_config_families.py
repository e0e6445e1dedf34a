"""Per-family draft sections (issue 22): ``draft.type`` picks the family's dataclass, and a key of
another family is refused by name with the families it belongs to, all problems at once, exit 2 with
one line per problem from the CLI."""

import dataclasses
import re
from pathlib import Path

import pytest

from draftsmith.cli import EXIT_BAD_INPUT, main
from draftsmith.config import ConfigError, build_config, load_config
from draftsmith.drafts import FAMILIES

# one knob of each family and the families that own it
OWN = {"step_weight": "eagle3", "num_depths": "peagle", "block_size": "dflash/jetspec/domino/dspark", "markov_rank": "dspark",
       "kd_temperature": "jetspec", "gru_hidden_dim": "domino"}
VALUE = {"step_weight": 0.5, "num_depths": 3, "block_size": 8, "kd_temperature": 2.0, "gru_hidden_dim": 16, "markov_rank": 8}
BASE = {"peagle": {"mask_token_id": 5}, "dflash": {"mask_token_id": 5}, "jetspec": {"mask_token_id": 5},
        "domino": {"mask_token_id": 5}, "dspark": {"mask_token_id": 5}, "eagle3": {}}


def test_block_size_under_eagle3_is_refused_by_name():
    with pytest.raises(ConfigError) as err:
        build_config({"draft": {"type": "eagle3", "block_size": 8}})
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith("draft.block_size belongs to dflash/jetspec/domino/dspark; draft.type is eagle3")


@pytest.mark.parametrize("family", list(BASE))
@pytest.mark.parametrize("key", list(OWN))
def test_a_key_of_another_family_exits_2_with_one_line(tmp_path, capsys, family, key):
    if family in OWN[key].split("/"):
        pytest.skip("the family's own key")
    line = _refused(tmp_path, capsys, "", family, f"  {key}: {VALUE[key]}\n")
    assert f"draft.{key} belongs to {OWN[key]}; draft.type is {family}" in line


def _refused(tmp_path, capsys, before: str, family: str, after: str = "") -> str:
    """`draftsmith train` on a config of ``family`` (its required keys, ``before`` / ``after`` the draft
    section's) must exit 2 with one line on stderr; returns that line."""
    cfg = tmp_path / "run.yaml"
    extra = "".join(f"  {k}: {v}\n" for k, v in BASE[family].items())
    cfg.write_text(f"{before}draft:\n  type: {family}\n{extra}{after}")
    assert main(["train", str(cfg), "--no-progress"]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    line = err.strip()
    assert out == "" and "\n" not in line, err
    return line


def test_every_problem_at_once_with_close_match_hints():
    with pytest.raises(ConfigError) as err:
        build_config({"draft": {"type": "dflash", "mask_token_id": 5, "num_depths": 2, "fc_norm": True,
                                "block_sise": 4, "block_size": 1}})
    p = err.value.problems
    assert "draft.num_depths belongs to peagle; draft.type is dflash" in p[0]
    assert "draft.fc_norm belongs to eagle3/peagle; draft.type is dflash" in p[1]
    assert "unknown key 'draft.block_sise'; did you mean 'block_size'?" in p[2]
    assert "'draft.block_size' = 1: expected an integer >= 2" in p[3] and len(p) == 4


def test_each_family_gets_its_own_dataclass_and_code_reads_its_fields():
    for name, fam in FAMILIES.items():
        cfg = build_config({"draft": {"type": name, **BASE[name]}})
        assert type(cfg.draft) is fam.config and cfg.draft.type == name and cfg.draft.ttt_steps == 7


def test_set_draft_type_switches_family_dropping_the_files_own_keys(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("draft:\n  type: peagle\n  mask_token_id: 5\n  num_depths: 3\n  ttt_steps: 2\n")
    switched = load_config(cfg, ["draft.type=eagle3"])  # the file's peagle knobs make way for eagle3's
    assert switched.draft.type == "eagle3" and switched.draft.ttt_steps == 2
    with pytest.raises(ConfigError, match="draft.num_depths belongs to peagle; draft.type is eagle3"):
        load_config(cfg, ["draft.type=eagle3", "draft.num_depths=4"])  # a --set key stays strict


def test_config_reference_lists_every_family_key():
    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md").read_text()
    part = page.split("## `draft`", 1)[1].split("\n## ", 1)[0]
    from dataclasses import fields

    rows = set(re.findall(r"^\| `(\w+)` \|", part, re.M))
    missing = sorted({f.name for fam in FAMILIES.values() for f in fields(fam.config)} - rows)
    assert not missing, f"docs/reference/config.md, section draft: run make docs-ref ({missing} missing)"


@pytest.mark.parametrize("family", list(BASE))
def test_packing_is_refused_for_a_family_that_does_not_pack(tmp_path, capsys, monkeypatch, family):
    # every family packs now: the refusal is checked on each one's description with packing switched off
    monkeypatch.setitem(FAMILIES, family, dataclasses.replace(FAMILIES[family], packing=False))
    line = _refused(tmp_path, capsys, "data:\n  packing: true\n", family)
    built = "/".join(name for name, fam in FAMILIES.items() if fam.packing)
    assert f"'data.packing' is true but draft.type is '{family}': packing is built for {built} only so far; " \
           "set data.packing: false" in line


@pytest.mark.parametrize("family", list(BASE))
def test_packing_is_off_by_default_and_taken_by_the_families_that_pack(family):
    assert build_config({}).data.packing is False
    cfg = build_config({"data": {"packing": True}, "draft": {"type": family, **BASE[family]}})
    assert cfg.data.packing is True
    # the family descriptions say so: every family packs
    assert sorted(name for name, fam in FAMILIES.items() if fam.packing) == sorted(BASE)
