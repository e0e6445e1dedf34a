from pathlib import Path

import pytest

from draftsmith.config import CHOICES, ConfigError, RunConfig, build_config, dump_config, load_config, parse_overrides

EXAMPLES = Path(__file__).parents[1] / "examples"


def test_defaults_live_in_code():
    cfg = load_config(None)
    assert cfg == RunConfig()
    assert cfg.draft.ttt_steps == 7 and cfg.draft.step_weight == 0.8
    assert cfg.target.engine == "hf"


def test_unknown_key_named_with_close_match_hint():
    with pytest.raises(ConfigError) as e:
        build_config({"train": {"learning_rate": 1e-3, "batch_sise": 4}})
    msg = str(e.value)
    assert "'train.learning_rate'" in msg
    assert "'train.batch_sise'" in msg and "did you mean 'batch_size'" in msg
    assert len(e.value.problems) == 2  # all errors at once


def test_unknown_section_and_type_errors_reported_together():
    with pytest.raises(ConfigError) as e:
        build_config({"trian": {}, "data": {"max_length": "long"}, "target": {"engine": "tensorrt"}})
    problems = e.value.problems
    assert any("unknown section 'trian'" in p and "did you mean 'train'" in p for p in problems)
    assert any("'data.max_length' = 'long': expected int" in p for p in problems)
    assert any("'target.engine' = 'tensorrt'" in p for p in problems)
    assert len(problems) == 3


def test_value_ranges():
    with pytest.raises(ConfigError) as e:
        build_config({"train": {"batch_size": 0, "lr": -1.0, "warmup_fraction": 1.0}, "data": {"sources": []}})
    msg = str(e.value)
    assert "'train.batch_size' = 0" in msg and "'train.lr' = -1.0" in msg and "'data.sources' is empty" in msg
    assert "'train.warmup_fraction' = 1.0: expected a fraction in [0, 1)" in msg


def test_int_accepted_for_float_and_bool_not_for_int():
    cfg = build_config({"train": {"lr": 1}})
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 1.0
    with pytest.raises(ConfigError, match="'train.epochs' = True"):
        build_config({"train": {"epochs": True}})


def test_activation_checkpointing_is_an_off_by_default_bool(tmp_path):
    assert RunConfig().train.activation_checkpointing is False
    p = tmp_path / "run.yaml"
    p.write_text("train:\n  activation_checkpointing: true\n")
    assert load_config(p).train.activation_checkpointing is True
    with pytest.raises(ConfigError, match="'train.activation_checkpointing' = 'yes'"):
        build_config({"train": {"activation_checkpointing": "yes"}})


def test_set_overrides_parse_yaml_values(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("train:\n  lr: 0.001\n  epochs: 2\n")
    cfg = load_config(p, ["train.lr=3e-4", "data.sources=[a.jsonl, b.parquet]", "target.aux_layer_ids=[1,2,3]"])
    assert cfg.train.lr == 3e-4 and cfg.train.epochs == 2
    assert cfg.data.sources == ["a.jsonl", "b.parquet"]
    assert cfg.target.aux_layer_ids == [1, 2, 3]
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_overrides(["lr=3"])
    with pytest.raises(ConfigError, match="did you mean 'max_steps'"):
        load_config(p, ["train.max_step=5"])


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML at line"):
        load_config(bad)


def test_dump_round_trip():
    cfg = build_config({"train": {"lr": 2e-4}, "data": {"draft_vocab_size": None}})
    import yaml

    assert build_config(yaml.safe_load(dump_config(cfg))) == cfg


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_examples_are_valid(name):
    load_config(EXAMPLES / name)


def test_every_family_has_a_smoke_and_a_smollm2_example():
    types = {load_config(p).draft.type: p.name for p in EXAMPLES.glob("smo*.yaml")}
    assert {load_config(EXAMPLES / n).draft.type for n in ("smoke_peagle.yaml", "smollm2_peagle.yaml")} == {"peagle"}
    assert set(types) == set(CHOICES["draft.type"]), types


def test_config_reference_lists_every_config_key():
    """docs/reference/config.md is the user's reference: a key added in code must have its row in its
    section (the page is generated; tests/test_docs.py holds it equal to what the generator writes)."""
    from dataclasses import fields
    from pathlib import Path

    from draftsmith.config import SECTIONS

    page = (Path(__file__).resolve().parents[1] / "docs" / "reference" / "config.md").read_text()
    for section, cls in SECTIONS.items():
        part = page.split(f"## `{section}`", 1)[1].split("\n## ", 1)[0]
        missing = [f.name for f in fields(cls) if f"| `{f.name}` |" not in part]
        assert not missing, f"docs/reference/config.md, section {section}: run make docs-ref ({missing} missing)"
