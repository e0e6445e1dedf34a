"""Where a run's checkpoints sit on disk, and reading that layout back (docs/reference/layouts.md).

``train/checkpoint.py`` writes this layout; ``eval``, ``serve`` and the demo only read it, so the
reading lives here, below all of them, and none of them imports the trainer's package to find a
meta.json::

    <output_dir>/checkpoints/
      epoch_<E>_step_<S>/
        model/consolidated/{config.json, model.safetensors}   # the servable draft (MODEL_SUBDIR)
        vocab.safetensors, optim.pt, rng.pt, meta.json, config.yaml
      LATEST -> epoch_<E>_step_<S>                          # moved only after a complete write
      BEST -> epoch_<E>_step_<S>                            # train.keep_best: the best held-out tau

A run directory given to eval, export or serve means its BEST checkpoint when there is one (the draft
the run judged best), else LATEST; ``--resume`` always continues from LATEST.

Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from draftsmith.weights import CheckpointError

MODEL_SUBDIR = Path("model") / "consolidated"
REQUIRED_FILES = (
    MODEL_SUBDIR / "config.json",
    MODEL_SUBDIR / "model.safetensors",
    Path("vocab.safetensors"),
    Path("optim.pt"),
    Path("rng.pt"),
    Path("meta.json"),
)


def checkpoint_name(epoch: int, step: int) -> str:
    """The directory name of the checkpoint after optimizer step ``step`` of data epoch ``epoch``."""
    return f"epoch_{epoch}_step_{step}"


def find_meta(path: Path) -> dict:
    """The meta.json of the checkpoint holding ``path`` (a checkpoint dir or a dir up to 3 levels inside
    it, e.g. model/consolidated), or {} when there is none (a vLLM export, a bare draft dir)."""
    path = Path(path)
    for parent in [path, *path.parents][:4]:
        meta = parent / "meta.json"
        if meta.is_file():
            try:
                return json.loads(meta.read_text())
            except (ValueError, UnicodeDecodeError):
                raise CheckpointError(f"{meta}: not valid JSON; the checkpoint is damaged, use another") from None
    return {}


def find_run_config(path: Path) -> dict:
    """The run config snapshot (config.yaml) of the checkpoint holding ``path`` (found as
    :func:`find_meta` finds meta.json), parsed, or {} when there is none or it is unreadable: what a
    draft was trained with (``data.max_length``, ``data.chat_template``) is advice, never required."""
    path = Path(path)
    for parent in [path, *path.parents][:4]:
        snap = parent / "config.yaml"
        if snap.is_file() and (parent / "meta.json").is_file():
            import yaml

            try:
                data = yaml.safe_load(snap.read_text())
            except (yaml.YAMLError, UnicodeDecodeError):
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def training_max_length(path: Path) -> Optional[int]:
    """``data.max_length`` the draft at ``path`` was trained with (its checkpoint's config.yaml), or None."""
    value = (find_run_config(path).get("data") or {}).get("max_length")
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def latest_checkpoint(root: Path) -> Optional[Path]:
    """The checkpoint ``LATEST`` points at under ``root``, or None when there is none."""
    return _linked(root, "LATEST")


def best_checkpoint(root: Path) -> Optional[Path]:
    """The checkpoint ``BEST`` points at under ``root`` (train.keep_best), or None when there is none."""
    return _linked(root, "BEST")


def _linked(root: Path, name: str) -> Optional[Path]:
    link = Path(root) / name
    if not (link.is_symlink() or link.exists()):
        return None
    return Path(root) / os.readlink(link) if link.is_symlink() else Path(root) / link.read_text().strip()


def resolve_resume(path: Path) -> Path:
    """Accept a checkpoint dir, a ``checkpoints/`` root, or a run output dir; return the checkpoint dir."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"--resume: '{path}' does not exist; pass a checkpoint dir (epoch_<E>_step_<S>) or the run's output dir")
    for root in (path, path / "checkpoints"):
        latest = latest_checkpoint(root)
        if latest is not None:
            return latest
    return path
