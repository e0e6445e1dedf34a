"""bench/data_curve.py's split and per-point run config: which rows a point trains and is scored on, and
that a run YAML (the 60-minute recipe) becomes a step-budgeted point; nothing trains or evaluates."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.config import build_config, load_config
from draftsmith.data.regenerated import FORMAT, finish, shard_name

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def curve():
    return SimpleNamespace(**runpy.run_path(str(ROOT / "bench" / "data_curve.py")))  # not as __main__


def regen_dir(path: Path, n: int) -> Path:
    path.mkdir(parents=True)
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]
    for i, part in enumerate([rows[: n // 2], rows[n // 2:]]):
        (path / shard_name(i)).write_text("".join(json.dumps(r) + "\n" for r in part))
    finish(path, {"format": FORMAT, "settings": {}}, 2, {})
    return path


def test_split_holds_out_the_same_24_and_keeps_every_row_once(curve, tmp_path):
    d = regen_dir(tmp_path / "regen", 30)
    held, pool = curve.split(d)
    assert (len(held), len(pool)) == (24, 6)
    assert curve.split(d) == (held, pool)  # seeded: every point and arm sees the same split
    prompts = sorted(r["messages"][0]["content"] for r in held + pool)
    assert prompts == sorted(f"q{i}" for i in range(30))


def test_point_config_from_the_recipe_yaml_is_step_budgeted(curve, tmp_path):
    base = load_config(ROOT / "examples" / "smollm2_best.yaml").to_dict()  # as main() reads --config
    raw = curve.point_config(base, tmp_path / "rows_8", tmp_path / "train_8.jsonl", tmp_path / "held.jsonl",
                             tmp_path / "cache", steps=40, eval_every=10, patience=2)
    cfg = build_config(raw, "test")
    assert cfg.target.engine == "cache" and cfg.target.cache_dir == str(tmp_path / "cache")
    assert cfg.data.sources == [str(tmp_path / "train_8.jsonl")]
    assert cfg.data.eval_sources == [str(tmp_path / "held.jsonl")]
    assert cfg.train.max_time_s is None and cfg.train.max_steps == 40  # steps, not the YAML's 3300 s
    assert (cfg.train.eval_every, cfg.train.keep_best, cfg.train.early_stop_patience) == (10, True, 2)
    assert cfg.output.dir == str(tmp_path / "rows_8") and cfg.output.tensorboard is False
    # the recipe's own knobs stay: batch 4, 2 TTT steps, Muon, the Qwen3-shaped layer
    assert (cfg.train.batch_size, cfg.draft.ttt_steps, cfg.train.optimizer, cfg.draft.qk_norm) == (4, 2, "muon", True)
    assert base["train"]["max_time_s"] == 3300  # the caller's mapping (reused by every point) is not changed


def test_data_without_cache_is_one_line_exit(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "data_curve.py"), "--data", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2  # bad input: the CLI's status (bench/bench_errors.py)
    assert "--data and --cache go together" in r.stderr


def test_a_bad_config_fails_before_any_point_trains(tmp_path):
    bad = tmp_path / "run.yaml"
    bad.write_text("train:\n  batch_sise: 4\n")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "data_curve.py"), "--config", str(bad)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().startswith(f"data_curve: --config {bad}:") and "batch_size" in r.stderr
