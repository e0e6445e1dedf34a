"""What a new user meets first, through the real command line (a subprocess each): a corrupt
checkpoint under every command that reads one, data that is not UTF-8, bad rows reported by
``train``, the progress bar of a time-bound run, the shipped prompt sets, and the export of ``t2d``.

Every bad input must end with exit 2 and exactly one stderr line naming the file, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.config import CHOICES
from draftsmith.train.schedule import reachable_step
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parents[1]
GOOD = {"messages": [{"role": "user", "content": "What is the capital of France?"},
                     {"role": "assistant", "content": "The capital of France is Paris."}]}


def cli(*argv: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "draftsmith.cli", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and err.startswith("draftsmith: error:") and "\n" not in err, r.stderr[-3000:]
    for n in needles:
        assert n in err, err
    return err


def run_config(tmp: Path, target: Path, sources: list, **sections) -> Path:
    body = {"target": {"path": str(target)},
            "data": {"sources": [str(s) for s in sources], "max_length": 48, "eval_size": 1, "draft_vocab_size": 64},
            "draft": {"ttt_steps": 2}, "train": {"max_steps": 2, "batch_size": 2},
            "output": {"dir": str(tmp / "out"), "tensorboard": False}}
    for sec, kv in sections.items():
        body[sec].update(kv)
    path = tmp / "run.yaml"
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny target and a 2-step run trained through the CLI: (tmp dir, target, run config, checkpoint)."""
    tmp = tmp_path_factory.mktemp("first-run")
    target = make_tiny_llama(tmp / "target", make_tokenizer("chatml"), num_layers=4)
    cfg = run_config(tmp, target, [write_jsonl(tmp / "chats.jsonl", [GOOD] * 6)])
    r = cli("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return tmp, target, cfg, tmp / "out" / "checkpoints" / "epoch_0_step_2"


def corrupt_copy(run, tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A copy of the run's output with model.safetensors cut mid-header or mid-tensor-data."""
    out = tmp_path / "out"
    shutil.copytree(run[0] / "out", out, symlinks=True)
    weights = out / "checkpoints" / "epoch_0_step_2" / "model" / "consolidated" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:5] if how == "header" else data[: len(data) // 2])
    return out, weights


READERS = {
    "export": lambda out, run, tmp: ("export", "--to", "vllm", out, tmp / "exported"),
    "eval": lambda out, run, tmp: ("eval", "--draft", out, "--target", run[1], "--prompts", "mt_bench", "--limit", "1",
                                   "--max-new-tokens", "2", "--no-plot", "--out", tmp / "eval"),
    "serve vllm": lambda out, run, tmp: ("serve", "vllm", "--target", run[1], "--draft", out, "--print-only",
                                         "--num-speculative-tokens", "2"),
    "serve sglang": lambda out, run, tmp: ("serve", "sglang", "--target", run[1], "--draft", out, "--print-only"),
    "doctor": lambda out, run, tmp: ("doctor", out, "--target", run[1]),
    "train --resume": lambda out, run, tmp: ("train", run[2], "--set", f"output.dir={out}", "--resume", "--no-progress"),
}


@pytest.mark.parametrize("command", list(READERS))
def test_truncated_weights_are_one_line_under_every_reader(run, tmp_path, command):
    out, weights = corrupt_copy(run, tmp_path, "header")
    one_line_error(cli(*READERS[command](out, run, tmp_path)), str(weights), "truncated")


@pytest.mark.parametrize("command", ["export", "serve vllm", "doctor"])
def test_weights_cut_inside_the_tensor_data_are_caught_too(run, tmp_path, command):
    out, weights = corrupt_copy(run, tmp_path, "data")
    one_line_error(cli(*READERS[command](out, run, tmp_path)), str(weights), "truncated")


def test_train_reports_bad_rows_by_reason_and_the_setup(run, tmp_path):
    tmp, target, _, _ = run
    data = tmp_path / "mixed.jsonl"
    good = (json.dumps(GOOD) + "\n").encode()
    # 3 good rows, then: bytes that are not UTF-8, invalid JSON, and a row of the wrong shape
    data.write_bytes(good * 3 + b'{"messages": "caf\xe9"}\n' + b"{oops\n" + b'{"messages": "not a list"}\n')
    r = cli("train", run_config(tmp_path, target, [data]), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("data: 3 conversations kept"))
    assert re.fullmatch(r"data: 3 conversations kept of 6 rows \(3 bad: .*\)", summary), summary
    for reason in ("not UTF-8 x1", "invalid JSON x1"):
        assert reason in summary, summary
    assert any(f"{data}:4: not UTF-8 (byte 0xe9 at offset" in line for line in lines), r.stdout
    assert any(line.startswith("setup: 2 train / 1 held-out conversations, draft vocab ") for line in lines), r.stdout
    assert any(line.startswith("budget: 1 steps") for line in lines), r.stdout


def test_a_json_file_that_is_not_utf8_is_one_line_with_the_offset(run, tmp_path):
    tmp, target, _, _ = run
    data = tmp_path / "latin1.json"
    data.write_bytes(b'[{"messages": [{"role": "user", "content": "caf\xe9"}]}]')
    one_line_error(cli("train", run_config(tmp_path, target, [data]), "--no-progress"), str(data),
                   "not UTF-8", "byte 0xe9 at offset 47")


def test_reachable_step_by_hand():
    # 20 steps took 10 s: 30 s left buy 60 more steps -> 80, never past the run's total
    assert reachable_step(20, 1000, 40.0, 10.0, 20) == 80
    assert reachable_step(20, 50, 40.0, 10.0, 20) == 50
    assert reachable_step(20, 1000, 40.0, 45.0, 20) == 20  # over budget: no more steps
    assert reachable_step(0, 1000, 40.0, 0.0, 0) == 1000  # nothing measured yet


def test_time_bound_progress_bar_shows_the_budget_not_the_epoch(run, tmp_path):
    tmp, target, _, _ = run
    data = write_jsonl(tmp_path / "many.jsonl", [GOOD] * 2000)  # 1000 steps an epoch at batch 2
    cfg = run_config(tmp_path, target, [data], train={"max_steps": None, "max_time_s": 3})
    r = cli("train", cfg)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "at most 1000 steps (1000/epoch x 1 epochs)" in r.stdout
    done = int(re.search(r"trained (\d+) steps", r.stdout).group(1))
    assert 0 < done < 1000
    frames = re.findall(r"train:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+)(?: \w+)? \[", r.stderr)  # "355/355 step ["
    assert frames, r.stderr[-2000:]
    assert frames[-1] == (str(done), str(done))  # the bar ends full at the budget, not at done/1000
    assert all(int(total) < 1000 for _, total in frames[2:])  # its total is the budget's estimate from the start


def test_eval_runs_a_shipped_prompt_set_without_shared(run, tmp_path):
    tmp, target, _, ckpt = run
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    assert not (cwd.parent / "shared").exists()
    r = cli("eval", "--draft", ckpt, "--target", target, "--prompts", "mt_bench", "--limit", "2", "-k", "2",
            "--max-new-tokens", "3", "--no-plot", "--out", "report", cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "prompts: 2 from mt_bench (writing 2; 2 turns asked)" in r.stdout
    report = json.loads((cwd / "report" / "report.json").read_text())
    assert report["config"]["prompts"] == "mt_bench" and len(report["records"]) == 2
    one_line_error(cli("eval", "--draft", ckpt, "--target", target, "--prompts", "mtbench", cwd=cwd),
                   "'mtbench' not found", "mt_bench, gsm8k, humaneval")


def test_export_to_vllm_carries_t2d_unchanged(run, tmp_path):
    _, _, _, ckpt = run
    r = cli("export", "--to", "vllm", ckpt, tmp_path / "vllm")
    assert r.returncode == 0, r.stderr[-3000:]
    exported = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    source = load_file(str(ckpt / "model" / "consolidated" / "model.safetensors"))
    assert torch.equal(exported["t2d"], source["t2d"]) and torch.equal(exported["d2t"], source["d2t"])


def test_domino_refusal_points_somewhere_that_works(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent / "serve"))
    import serve_ckpts as sc

    draft = sc.make("domino", tmp_path / "d")
    err = one_line_error(cli("serve", "vllm", "--target", "t", "--draft", draft,
                             "--print-only"), "Domino")
    assert "draftsmith eval --draft" in err and "dflash or jetspec" in err  # eval runs Domino; vLLM serves those


def test_package_description_names_only_trainable_families():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    trains = re.match(r"Train (.+?) speculative-decoding drafts", meta["description"])
    assert trains, meta["description"]
    names = {"EAGLE-3": "eagle3", "P-EAGLE": "peagle", "DFlash": "dflash", "JetSpec": "jetspec", "Domino": "domino"}
    claimed = [names[n.strip()] for n in re.split(r",| and ", trains.group(1)) if n.strip()]
    assert claimed and set(claimed) <= set(CHOICES["draft.type"]), (claimed, CHOICES["draft.type"])


# ------------------------------------------------------------------ P-EAGLE bad input
PEAGLE = {"type": "peagle", "mask_token_id": 5, "num_depths": 3, "num_draft_layers": 2}  # 5: unused in chatml


@pytest.fixture(scope="module")
def peagle_run(run, tmp_path_factory):
    """A 2-step P-EAGLE run through the CLI on the same target and data: (run config, checkpoint)."""
    tmp = tmp_path_factory.mktemp("peagle-run")
    cfg = run_config(tmp, run[1], [run[0] / "chats.jsonl"], draft=PEAGLE)
    r = cli("train", cfg, "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    return cfg, tmp / "out" / "checkpoints" / "epoch_0_step_2"


@pytest.mark.parametrize("draft, needles", [
    ({"type": "peagle"}, ["'draft.mask_token_id' is required for draft.type peagle"]),
    ({**PEAGLE, "mask_token_id": 384}, ["draft.mask_token_id=384", "0..383"]),  # the tiny target's vocab is 384
    ({**PEAGLE, "mask_token_id": -1}, ["draft.mask_token_id=-1", "0..383"]),
    ({**PEAGLE, "num_depths": 0}, ["'draft.num_depths' = 0", ">= 1"]),
], ids=["mask-missing", "mask-past-vocab", "mask-negative", "num-depths-0"])
def test_bad_peagle_config_is_one_line(run, tmp_path, draft, needles):
    one_line_error(cli("train", run_config(tmp_path, run[1], [run[0] / "chats.jsonl"], draft=draft), "--no-progress"),
                   *needles)
    assert not (tmp_path / "out" / "checkpoints").exists()  # refused before any step


def test_a_checkpoint_of_one_family_cannot_resume_the_other(run, peagle_run, tmp_path):
    _, _, cfg, eagle_ckpt = run
    peagle_cfg, peagle_ckpt = peagle_run
    one_line_error(cli("train", peagle_cfg, "--set", f"output.dir={tmp_path / 'a'}", "--set", "draft.type=eagle3",
                       "--resume", peagle_ckpt, "--no-progress"),
                   str(peagle_ckpt), "a peagle checkpoint cannot resume a draft.type eagle3 run")
    one_line_error(cli("train", cfg, "--set", f"output.dir={tmp_path / 'b'}", "--set", "draft.type=peagle",
                       "--set", "draft.mask_token_id=5", "--resume", eagle_ckpt, "--no-progress"),
                   str(eagle_ckpt), "a eagle3 checkpoint cannot resume a draft.type peagle run")


def test_resume_refuses_a_changed_mask_token(run, peagle_run, tmp_path):
    # the weights were trained with mask token 5: another id would load and train on silently
    peagle_cfg, peagle_ckpt = peagle_run
    one_line_error(cli("train", peagle_cfg, "--set", f"output.dir={tmp_path / 'a'}", "--set", "draft.mask_token_id=6",
                       "--resume", peagle_ckpt, "--no-progress"),
                   str(peagle_ckpt), "the draft's config changed since this checkpoint (mask_token_id 5 -> 6)")


def relabelled(ckpt: Path, tmp_path: Path, to: str) -> Path:
    """A copy of ``ckpt`` whose config.json claims the other family (its weights are unchanged)."""
    out = shutil.copytree(ckpt, tmp_path / ckpt.name)
    path = out / "model" / "consolidated" / "config.json"
    cfg = json.loads(path.read_text())
    for key in ("parallel_drafting", "mask_token_id", "num_depths", "down_sample_ratio", "down_sample_ratio_min"):
        cfg.pop(key, None)
    if to == "peagle":
        cfg.update(parallel_drafting=True, mask_token_id=5, num_depths=3)
    else:
        cfg["num_hidden_layers"] = 1
    path.write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("claims", ["eagle3", "peagle"])
@pytest.mark.parametrize("command", ["eval", "export", "serve vllm", "serve sglang"])
def test_weights_of_one_family_under_the_other_config_are_one_line(run, peagle_run, tmp_path, command, claims):
    # config.json decides the loader: P-EAGLE weights (mask_hidden, layers 1..L-1) under an EAGLE-3
    # config, or EAGLE-3 weights under a P-EAGLE config, must not load, export or serve quietly.
    real = peagle_run[1] if claims == "eagle3" else run[3]
    ckpt = relabelled(real, tmp_path, claims)
    r = cli(*READERS[command](ckpt, run, tmp_path))
    one_line_error(r, str(ckpt / "model" / "consolidated"))
    assert not (tmp_path / "exported").exists()
