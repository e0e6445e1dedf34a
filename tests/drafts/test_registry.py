"""The draft-family registry: classification of exported configs, lazy lookup, the family contract."""

import pytest
import torch

from draftsmith.config import CHOICES, ConfigError, build_config
from draftsmith.drafts import FAMILIES, KNOWN_FAMILIES, DraftError, Family, FamilyCode, family_of_config, get_family


@pytest.mark.parametrize("config, family", [
    ({"architectures": ["LlamaEagle3DraftModel"], "parallel_drafting": False}, "eagle3"),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),
    ({"architectures": ["LlamaEagle3DraftModel"], "parallel_drafting": True}, "peagle"),
    ({"architectures": ["Qwen3DFlashDraftModel"], "dflash_config": {"block_size": 8}}, "dflash"),
    ({"architectures": ["Qwen3DFlashDraftModel"], "dflash_config": {"causal": True}}, "jetspec"),
    ({"dflash_config": {"projector_type": "Domino"}}, "domino"),
])
def test_family_of_config(config, family):
    assert family_of_config(config) == family


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_registered_families_declare_the_typed_contract(name):
    from dataclasses import fields

    family = get_family(name)
    assert isinstance(family.contract, FamilyCode) and name in KNOWN_FAMILIES
    for f in fields(FamilyCode):  # every entry is read through the Family, from CODE (no other source)
        assert getattr(family, f.name) is getattr(family.contract, f.name)
        assert f.name == "checkpoint_meta" or getattr(family, f.name) is not None
    assert isinstance(family.SUPERVISION, str)
    for attr in ("supervised", "export_config"):
        assert callable(getattr(family.Model, attr))


def test_a_family_module_without_code_fails_by_name_and_unknown_names_are_not_forwarded(tmp_path, monkeypatch):
    (tmp_path / "codeless_family.py").write_text("Model = object\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    fam = Family(name="codeless", display="Codeless", api="codeless_family", config=get_family("eagle3").config,
                 supervision="eagle3", recognises=lambda c: False)
    with pytest.raises(TypeError, match=r"codeless_family: expected CODE = FamilyCode"):
        fam.Model
    with pytest.raises(AttributeError):
        get_family("eagle3").no_such_entry  # the contract is the dataclass's fields, nothing else
    with pytest.raises(TypeError, match="describe"):  # a CODE missing an entry fails at construction, by name
        FamilyCode(**{f: None for f in ("layer_rule", "config_from_target", "config_from_export", "Model", "Proposer",
                                        "attach_target", "load_exported", "layer_ids_from_export", "summarize",
                                        "scalars", "PROGRESS")})


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_brings_its_supervision_kind_and_layer_rule(name):
    """The kind a family trains on and its default layer-id rule come from the module its description names
    (a family folder's, or the block families' shared one), found by name as an engine finds it."""
    from draftsmith.supervision import default_layer_ids, supervision_kind

    fam = get_family(name)
    kind = supervision_kind(fam.supervision)
    assert kind.cls.__module__ == fam.supervision_module, (name, kind.cls.__module__)
    rule, count = fam.layer_rule(fam.config())
    assert default_layer_ids(rule, 30, count)  # the rule is registered with it


def test_a_family_whose_supervision_module_does_not_exist_is_refused_at_registration():
    import dataclasses

    from draftsmith.drafts import register

    bad = dataclasses.replace(get_family("dflash"), name="typo", supervision_module="draftsmith.drafts.no_such_module")
    with pytest.raises(DraftError, match="supervision_module 'draftsmith.drafts.no_such_module' is not an importable"):
        register(bad)
    assert "typo" not in FAMILIES


def test_every_known_family_trains_and_an_unknown_one_is_a_one_line_error():
    assert set(FAMILIES) == {"eagle3", "peagle", "dflash", "jetspec", "domino", "dspark"}
    with pytest.raises(DraftError, match=r"^draft family 'medusa' is unknown; expected one of eagle3, peagle, dflash, "
                                         r"jetspec, domino, dspark$"):
        get_family("medusa")


def test_draft_type_choices_come_from_the_registry():
    assert CHOICES["draft.type"] == tuple(FAMILIES)
    with pytest.raises(ConfigError, match="draft.type"):
        build_config({"draft": {"type": "dflash2"}})


@pytest.mark.parametrize("draft, needle", [
    ({"type": "peagle"}, "'draft.mask_token_id' is required for draft.type peagle"),
    ({"type": "peagle", "mask_token_id": 3, "num_depths": 0}, "'draft.num_depths' = 0: expected an integer >= 1"),
    ({"type": "peagle", "mask_token_id": 3, "down_sample_ratio": 0}, "'draft.down_sample_ratio' = 0"),
])
def test_peagle_config_errors_name_the_key(draft, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config({"draft": draft})


@pytest.mark.parametrize("section, needle", [
    ({"draft": {"type": "dflash"}}, "'draft.mask_token_id' is required for draft.type dflash"),
    ({"draft": {"type": "jetspec", "mask_token_id": 3, "block_size": 1}}, "'draft.block_size' = 1: expected an integer >= 2"),
])
def test_block_family_config_errors_name_the_key(section, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(section)


def test_peagle_summary_from_summed_micro_batches():
    peagle = get_family("peagle")
    s = peagle.summarize({"depth_correct": torch.tensor([6, 3]), "depth_prefix": torch.tensor([6, 2]),
                          "depth_count": torch.tensor([10, 8])})
    assert s["step_accuracy"] == pytest.approx([0.6, 0.375]) and s["positions"] == 10
    assert s["simulated_tau"] == pytest.approx(1 + 6 / 10 + 2 / 8)
    # prefix rates 6/10, 2/8: depth 1 given depth 0 accepted = (2/8) / (6/10) = 0.417
    assert s["conditional_acceptance"] == pytest.approx([0.6, 0.25 / 0.6])
    assert peagle.describe(s) == "per-depth accuracy [0.600 0.375]  conditional [0.600 0.417]  simulated parallel tau 1.850"


def test_eagle3_summary_from_summed_micro_batches():
    eagle3 = get_family("eagle3")
    a = {"step_correct": torch.tensor([4, 3, 2]), "prefix_correct": torch.tensor([4, 2, 1]), "step_count": torch.tensor([5, 4, 3])}
    b = {"step_correct": torch.tensor([1, 0, 0]), "prefix_correct": torch.tensor([1, 0, 0]), "step_count": torch.tensor([5, 4, 1])}
    s = eagle3.summarize({k: a[k] + b[k] for k in a})
    assert s["step_accuracy"] == pytest.approx([5 / 10, 3 / 8, 2 / 4])
    assert s["simulated_tau"] == pytest.approx(1 + 5 / 10 + 2 / 8 + 1 / 4) and s["positions"] == 10
    # prefix rates 5/10, 2/8, 1/4 -> conditional .5, .25/.5, .25/.25
    assert s["prefix_rate"] == pytest.approx([0.5, 0.25, 0.25])
    assert s["conditional_acceptance"] == pytest.approx([0.5, 0.5, 1.0])
    assert eagle3.scalars(s) == pytest.approx({"simulated_tau": s["simulated_tau"], "acc0": 0.5, "acc1": 0.375, "acc2": 0.5,
                                               "cond0": 0.5, "cond1": 0.5, "cond2": 1.0})
    assert set(eagle3.PROGRESS.values()) <= set(eagle3.scalars(s))
    assert eagle3.describe(s) == "per-step accuracy [0.500 0.375 0.500]  conditional [0.500 0.500 1.000]  simulated tau 2.000"
