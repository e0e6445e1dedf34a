"""bench/family_compare.py's arms: each arm's run config from its family's recipe and its overrides.

Nothing trains: the configs are built and validated as the bench would before training.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from draftsmith.config import build_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fc():
    return SimpleNamespace(**runpy.run_path(str(ROOT / "bench" / "family_compare.py")))  # not as __main__


def test_dflash_arms_share_the_recipe_and_differ_only_in_their_overrides(fc, tmp_path):
    recipe = yaml.safe_load((ROOT / "examples" / "smollm2_dflash.yaml").read_text())
    raws = {a: fc.arm_config(a, tmp_path / a, tmp_path / "regen", tmp_path / "cache", 600)
            for a in ("dflash", "dflash_w5", "dflash_b4")}
    base = raws["dflash"]
    assert base["draft"]["block_size"] == 8 and base["draft"]["loss_decay_gamma"] == 4.0
    assert base["train"]["warmup_steps"] == recipe["train"]["warmup_steps"] == 30  # the recipe's, untouched
    assert base["train"]["max_time_s"] == 600.0
    # a train.<key> override lands in the train section, never in the draft section
    w5 = raws["dflash_w5"]
    assert w5["train"]["warmup_steps"] == 5 and "train.warmup_steps" not in w5["draft"]
    assert {k: v for k, v in w5["train"].items() if k != "warmup_steps"} == \
        {k: v for k, v in base["train"].items() if k != "warmup_steps"}
    assert w5["draft"] == base["draft"]
    b4 = raws["dflash_b4"]
    assert b4["draft"] == {**base["draft"], "block_size": 4} and b4["train"] == w5["train"]
    assert fc.ARMS["dflash_b4"][2] == (1, 3)  # a block of 4 drafts at most K = 3
    muon = fc.arm_config("dflash_b4_muon", tmp_path / "m", tmp_path / "regen", tmp_path / "cache", 600)
    assert muon["train"] == {**base["train"], "optimizer": "muon"} and muon["draft"] == b4["draft"]
    for name in [a for a in fc.ARMS if a.startswith("dflash")]:  # every DFlash arm is a config the trainer accepts
        raw = fc.arm_config(name, tmp_path / name, tmp_path / "regen", tmp_path / "cache", 600)
        cfg = build_config(raw, f"family_compare:{name}")
        assert cfg.train.warmup_steps == raw["train"]["warmup_steps"]
        assert cfg.train.optimizer == raw["train"].get("optimizer", "adamw")
        assert cfg.draft.block_size == raw["draft"]["block_size"]
