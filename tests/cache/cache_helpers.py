"""A tiny target (2 layers, hidden 32), chat data and run configs for the feature-cache tests."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from draftsmith.config import build_config
from fixtures import make_tiny_llama, make_tokenizer, write_chats  # noqa: F401  (write_chats re-exported)

AUX = [0, 1]  # a 2-layer target has no default EAGLE-3 ids; L = 2 is always cached as the last state


def tiny_setup(root: Path, n_chats: int = 12) -> tuple[Path, Path]:
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=2, hidden=32)
    return target, write_chats(root / "chats.jsonl", n_chats, numbered=True)


def tiny_run_config(root: Path, n_chats: int) -> tuple[Path, Path, Path]:
    """(target, chats, run.yaml) under ``root``: a tiny target, ``n_chats`` chats and their hf run config."""
    import yaml

    target, data = tiny_setup(root, n_chats=n_chats)
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(raw_config(target, data, root / "run")))
    return target, data, path


def raw_config(target, data, out, engine="hf", cache_dir=None, draft=None, **train) -> dict:
    return {
        "target": {"path": str(target), "aux_layer_ids": AUX, "engine": engine,
                   **({"cache_dir": str(cache_dir)} if cache_dir else {})},
        "data": {"sources": [str(data)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 64},
        "draft": {"ttt_steps": 2, **(draft or {})},
        # batch 1: no padding, so the hf engine's forward has the cache build's shapes (bitwise parity)
        "train": {"epochs": 1, "batch_size": 1, "lr": 3e-3, "max_steps": 4, "eval_max_batches": 1, **train},
        "output": {"dir": str(out), "tensorboard": False},
    }


def config(*args, **kwargs):
    return build_config(raw_config(*args, **kwargs))


def final_weights(result) -> dict:
    return load_file(str(result.checkpoint / "model" / "consolidated" / "model.safetensors"))


def same_weights(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
