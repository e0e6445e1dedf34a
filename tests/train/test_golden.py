"""Golden hashes: a fixed-seed tiny run per draft family gives byte-identical files across refactors.

Each family trains a few steps on a tiny Llama target (hf engine, one thread) and its files are hashed:
the final checkpoint's ``model/consolidated/{config.json,model.safetensors}`` (the training export) and
the ``export --to vllm`` copy's ``config.json`` and ``model.safetensors`` (not for Domino, which no engine
serves). The figures in
golden_hashes.json were written before the family-folder refactor (issue 22); a change of the model
math, the init, the data order, the optimizer or an export key map changes them. When a change is
MEANT to alter the bytes, rewrite the file and say why in the commit:

    DRAFTSMITH_WRITE_GOLDEN=1 .venv/bin/python -m pytest -q tests/train/test_golden.py
"""

import hashlib
import json
import os
from pathlib import Path

import pytest

from draftsmith.config import build_config
from draftsmith.serve.export import export_vllm
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer, write_chats

GOLDEN = Path(__file__).with_name("golden_hashes.json")
MASK = 5  # <|start_header_id|>: never in chatml text
NORMS = {"fc_norm": True, "norm_output": True, "norm_before_residual": True, "norm_before_fc": True}
BLOCK = {"mask_token_id": MASK, "block_size": 4, "num_draft_layers": 2, "num_anchors": 4}
# family label -> (draft section, train overrides, target.aux_layer_ids)
RUNS = {
    "eagle3": ({"type": "eagle3", "ttt_steps": 3}, {}, [1, 3, 4]),
    "eagle3_best": ({"type": "eagle3", "ttt_steps": 3, **NORMS, "freeze_lm_head": True}, {"optimizer": "muon"},
                    [1, 3, 4]),
    "peagle": ({"type": "peagle", "mask_token_id": MASK, "num_depths": 3, "num_draft_layers": 2}, {}, [1, 3, 4]),
    "dflash": ({"type": "dflash", **BLOCK}, {}, None),
    "jetspec": ({"type": "jetspec", **BLOCK, "kd_temperature": 2.0}, {}, [1, 6]),
    "domino": ({"type": "domino", **BLOCK, "emb_dim": 16, "gru_hidden_dim": 8, "lambda_start": 1.0,
                "lambda_decay_ratio": 0.5}, {}, [3, 5]),
}

UNSERVABLE = {"domino"}  # no engine has its GRU head: `export --to vllm` refuses it (tests/serve)

pytestmark = pytest.mark.usefixtures("restore_threads")  # tests/conftest.py: train.num_threads 1 is undone


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    return target, write_chats(root / "chats.jsonl", n=10)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_hashes(tiny, out: Path, label: str) -> dict[str, str]:
    target, data = tiny
    draft, train_over, aux = RUNS[label]
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": aux},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 96},
        "draft": draft,
        "train": {"epochs": 1, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1, "num_threads": 1, "seed": 7,
                  **train_over},
        "output": {"dir": str(out / "run"), "tensorboard": False},
    }, f"golden:{label}")
    res = train(cfg, progress=False)
    cons = res.checkpoint / "model" / "consolidated"
    got = {"steps": str(res.step),
           "consolidated/config.json": sha(cons / "config.json"),
           "consolidated/model.safetensors": sha(cons / "model.safetensors")}
    if label not in UNSERVABLE:
        vllm = export_vllm(res.checkpoint, out / "vllm")
        got.update({"vllm/config.json": sha(vllm / "config.json"), "vllm/model.safetensors": sha(vllm / "model.safetensors")})
    return got


@pytest.mark.parametrize("label", list(RUNS))
def test_fixed_seed_run_is_byte_identical_to_the_golden_hashes(tiny, tmp_path, label):
    got = run_hashes(tiny, tmp_path, label)
    # the same run twice in one process gives the same bytes (no hidden global state, no paths in the files)
    assert run_hashes(tiny, tmp_path / "again", label) == got
    if os.environ.get("DRAFTSMITH_WRITE_GOLDEN") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        golden[label] = got
        tmp = GOLDEN.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(golden.items())), indent=2) + "\n")
        os.replace(tmp, GOLDEN)
    assert got == json.loads(GOLDEN.read_text())[label]
