"""The tiny run behind docs/reference/layouts.md: a tiny Llama target built in code (tests/fixtures.py,
no download), two CPU training steps per registered draft family, every ``draftsmith export --to``
layout of each checkpoint, and what is on disk afterwards (file names, JSON keys, tensor names, dtypes
and shapes). Nothing depends on the clock or the machine's paths: shapes follow the tiny config, paths
are relative or placeholders, listings are sorted."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
import os
import random
import re
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXPORTS = ("vllm", "sglang", "speculators")
K = 2  # --num-speculative-tokens of the speculators exports
# The tiny run's knobs, set where a family's draft section has the key (the rest keep their defaults).
TINY_TARGET = {"num_layers": 6, "hidden": 64}
TINY_DATA = {"max_length": 48, "eval_size": 2, "draft_vocab_size": 96}
TINY_DRAFT = {"ttt_steps": 2, "mask_token_id": 5, "num_depths": 2, "num_draft_layers": 2, "block_size": 4,
              "num_anchors": 4, "emb_dim": 16, "gru_hidden_dim": 8}
TINY_TRAIN = {"max_steps": 2, "batch_size": 2, "log_every": 1, "device": "cpu", "num_threads": 1}


def _fixtures():
    """tests/fixtures.py (the tiny tokenizer and target the tests build), loaded by path."""
    spec = importlib.util.spec_from_file_location("draftsmith_docs_fixtures", ROOT / "tests" / "fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def tensors(path: Path) -> list[list[Any]]:
    """[name, safetensors dtype, shape] of every tensor in a .safetensors file, sorted by name."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return sorted([k, f.get_slice(k).get_dtype(), list(f.get_slice(k).get_shape())] for k in f.keys())


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """A JSON object as dotted key -> value (lists and scalars are values)."""
    if isinstance(obj, dict) and obj:
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: obj}


def tree(root: Path) -> list[str]:
    """Every path under ``root``, relative and sorted; a symlink as ``name -> its target``."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            out.append(f"{rel} -> {os.readlink(p)}" if p.is_symlink() else rel + ("/" if p.is_dir() else ""))
    return sorted(out)


def _draft_section(family) -> dict:
    keys = {f.name for f in dataclasses.fields(family.config)}
    return {"type": family.name, **{k: v for k, v in TINY_DRAFT.items() if k in keys}}


@contextlib.contextmanager
def _kept_state():
    """Training seeds the global RNGs and may set torch's threads: give the caller its own back."""
    import numpy as np
    import torch

    states = torch.get_rng_state(), random.getstate(), np.random.get_state(), torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])
        torch.set_num_threads(states[3])


def _describe(path: Path) -> dict:
    """What a file outside safetensors/JSON holds: the top-level keys of a torch pickle-free file."""
    import torch

    obj = torch.load(path, weights_only=True)
    if isinstance(obj, dict):
        return {"keys": sorted(obj)}
    if isinstance(obj, torch.Tensor):
        return {"tensor": [str(obj.dtype).removeprefix("torch."), list(obj.shape)]}
    return {"type": type(obj).__name__}


def _dir_facts(d: Path, scrub) -> dict:
    facts: dict[str, Any] = {"files": tree(d), "json": {}, "tensors": {}, "other": {}}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if p.suffix == ".json":
            facts["json"][rel] = json.loads(scrub(p.read_text()))
        elif p.suffix == ".safetensors":
            facts["tensors"][rel] = tensors(p)
        elif p.suffix == ".pt":
            facts["other"][rel] = _describe(p)
    return facts


def run() -> dict:
    """Do the tiny run in a temporary directory and return what it left on disk (JSON-able)."""
    from draftsmith.config import build_config
    from draftsmith.drafts import FAMILIES
    from draftsmith.serve.export import export_draft
    from draftsmith.serve.resolve import ServeError
    from draftsmith.train.loop import train

    fx = _fixtures()
    facts: dict[str, Any] = {"families": {}, "tiny": {"target": TINY_TARGET, "data": TINY_DATA, "train": TINY_TRAIN,
                                                      "draft": {}}}
    with tempfile.TemporaryDirectory(prefix="draftsmith-layouts-") as tmp, _kept_state(), \
            contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        root = Path(tmp).resolve()
        target = fx.make_tiny_llama(root / "target", fx.make_tokenizer("chatml"), **TINY_TARGET)
        data = fx.write_chats(root / "chats.jsonl", n=8)

        def scrub(text: str, out: Path = root) -> str:
            return text.replace(str(target), "<target>").replace(str(out), "<output_dir>").replace(str(root), "<tmp>")

        for name, family in FAMILIES.items():
            out = root / "runs" / name
            draft = _draft_section(family)
            facts["tiny"]["draft"][name] = draft
            cfg = build_config({"target": {"path": str(target)}, "data": {"sources": [str(data)], **TINY_DATA},
                                "draft": draft, "train": TINY_TRAIN, "output": {"dir": str(out), "tensorboard": False}})
            result = train(cfg, progress=False, announce=lambda *a, **k: None)
            ckpt = Path(result.checkpoint)
            fam_scrub = lambda text, out=out: scrub(text, out)  # noqa: E731
            fam = {"run": _dir_facts(out, fam_scrub), "checkpoint": ckpt.relative_to(out).as_posix(), "exports": {}}
            for to in EXPORTS:
                dst = root / "exports" / f"{name}-{to}"
                try:
                    export_draft(ckpt, dst, to=to, target=str(target), num_speculative_tokens=K)
                except ServeError as e:
                    fam["exports"][to] = {"refused": fam_scrub(str(e))}
                    continue
                fam["exports"][to] = _dir_facts(dst, fam_scrub)
            facts["families"][name] = fam
    return json.loads(re.sub(r"vocab_[0-9a-f]{16}\.safetensors", "vocab_<fingerprint>.safetensors",
                             json.dumps(facts)))
