"""Golden figures: a fixed-seed tiny run per draft family gives the same files across refactors.

Each family trains a few steps on a tiny Llama target (hf engine, one thread) and its files are hashed:
the final checkpoint's ``model/consolidated/{config.json,model.safetensors}`` (the training export) and
the ``export --to vllm`` copy's ``config.json`` and ``model.safetensors`` (not for Domino, which no engine
serves). The figures in
golden_hashes.json were written before the family-folder refactor (issue 22); a change of the model
math, the init, the data order, the optimizer or an export key map changes them. When a change is
MEANT to alter the bytes, rewrite the file and say why in the commit:

    DRAFTSMITH_WRITE_GOLDEN=1 .venv/bin/python -m pytest -q tests/train/test_golden.py

Weight bytes depend on the machine's float kernels as well as on our code (the same commit gave other
weight hashes on an AMD EPYC / AVX512 machine than on the one the file was first written on), so the file
keeps per label: the step count and config.json hashes, compared everywhere; the weight-file hashes per
machine (``machine()``: torch version, ATen CPU capability, CPU model), compared byte for byte where the
machine has an entry; and each weight tensor's sum and absolute sum, compared everywhere within 1e-4 of
the absolute sum -- kernel noise moves them by ~1e-6, a change of the math by far more.
"""

import hashlib
import json
import os
import platform
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

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


def machine() -> str:
    """What the weight bytes depend on besides our code: torch, its CPU kernels' ISA, the CPU."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() \
        else platform.processor()
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {model}"


def sums(path: Path) -> dict[str, list[float]]:
    """Each tensor's [sum, absolute sum] in float64, rounded to 9 significant digits."""
    return {k: [float(f"{v.double().sum().item():.9g}"), float(f"{v.double().abs().sum().item():.9g}")]
            for k, v in sorted(load_file(str(path)).items())}


def run_files(tiny, out: Path, label: str) -> dict:
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
    configs = {"steps": str(res.step), "consolidated/config.json": sha(cons / "config.json")}
    weights = {"consolidated/model.safetensors": sha(cons / "model.safetensors")}
    values = {"consolidated": sums(cons / "model.safetensors")}
    if label not in UNSERVABLE:
        vllm = export_vllm(res.checkpoint, out / "vllm")
        configs["vllm/config.json"] = sha(vllm / "config.json")
        weights["vllm/model.safetensors"] = sha(vllm / "model.safetensors")
        values["vllm"] = sums(vllm / "model.safetensors")
    return {"configs": configs, "weights": {machine(): weights}, "values": values}


@pytest.mark.parametrize("label", list(RUNS))
def test_fixed_seed_run_gives_the_golden_files(tiny, tmp_path, label):
    got = run_files(tiny, tmp_path, label)
    # the same run twice in one process gives the same bytes (no hidden global state, no paths in the files)
    assert run_files(tiny, tmp_path / "again", label) == got
    if os.environ.get("DRAFTSMITH_WRITE_GOLDEN") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.is_file() else {}
        old = golden.get(label, {})
        keep = old.get("weights", {}) if old.get("configs") == got["configs"] else {}  # other machines' bytes
        golden[label] = {**got, "weights": {**keep, **got["weights"]}}
        tmp = GOLDEN.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(sorted(golden.items())), indent=2) + "\n")
        os.replace(tmp, GOLDEN)
    want = json.loads(GOLDEN.read_text())[label]
    assert got["configs"] == want["configs"]
    if machine() in want["weights"]:  # the machine the bytes were written on: byte for byte
        assert got["weights"][machine()] == want["weights"][machine()]
    assert got["values"].keys() == want["values"].keys()
    for part, tensors in want["values"].items():
        assert got["values"][part].keys() == tensors.keys(), part
        for name, (total, size) in tensors.items():
            g_total, g_size = got["values"][part][name]
            assert abs(g_total - total) <= 1e-4 * size + 1e-9 and abs(g_size - size) <= 1e-4 * size + 1e-9, \
                f"{part}/{name}: sum {g_total} / abs sum {g_size}, golden {total} / {size}"
