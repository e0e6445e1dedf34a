"""Where the trainer's scalars go: TensorBoard (``output.tensorboard``, on by default) and Weights & Biases
(``output.wandb``, off by default; the optional extra ``pip install 'draftsmith[wandb]'``).

The trainer (and its spec-eval hook) calls ``add_scalar(tag, value, step)`` once per scalar; :class:`Scalars`
hands each call to every sink, so W&B receives exactly the tags, values and steps TensorBoard does
(``train/loss``, ``eval/...``, ``spec/real_tau``, ...). Rank 0 opens it; the other ranks log nothing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Optional

from draftsmith import atomic
from draftsmith.config import ConfigError, OutputConfig

WANDB_INSTALL_HINT = "pip install 'draftsmith[wandb]' (or pip install wandb)"
WANDB_PROJECT = "draftsmith"  # output.wandb_project's default


def check_wandb(output: OutputConfig) -> None:
    """``output.wandb`` without the wandb package: one line with the install hint, before any heavy work."""
    if output.wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError([f"'output.wandb' is true but the wandb package is not installed; {WANDB_INSTALL_HINT}, "
                           "or set output.wandb: false (TensorBoard logs the same scalars)"])


RUN_ID_FILE = "wandb_run_id"  # <output.dir>/wandb_run_id: the W&B run a --resume continues


class WandbSink:
    """One W&B run: ``output.wandb_project`` (default ``draftsmith``), ``output.wandb_name`` (default the run
    dir's name), ``output.wandb_mode`` (online | offline | disabled; null = WANDB_MODE, else online); files
    under ``<output.dir>/wandb`` unless WANDB_DIR says elsewhere. The run config is its W&B config.

    A ``resumed`` training run continues the W&B run whose id ``<output.dir>/wandb_run_id`` holds (one
    curve across the interruption); a fresh one starts a new W&B run and records its id there."""

    def __init__(self, output: OutputConfig, out: Path, config: dict, resumed: bool = False):
        check_wandb(output)
        import os

        import wandb

        wandb_dir = Path(os.environ.get("WANDB_DIR") or out)
        for folder in (out, wandb_dir):
            folder.mkdir(parents=True, exist_ok=True)
        id_file = out / RUN_ID_FILE
        run_id = (id_file.read_text().strip() if resumed and id_file.is_file() else "") or None
        self.run = wandb.init(project=output.wandb_project or WANDB_PROJECT, name=output.wandb_name or out.resolve().name,
                              mode=output.wandb_mode, dir=str(wandb_dir), config=config, id=run_id,
                              resume="allow" if run_id else None)
        if run_id is None and self.run.id:
            atomic.write_text(id_file, self.run.id + "\n")

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        # several tags at one step: W&B merges them into one row (a step is committed when a later one arrives)
        self.run.log({tag: float(value)}, step=int(step))

    def close(self) -> None:
        self.run.finish()


class Scalars:
    """The trainer's ``writer``: ``add_scalar`` and ``close`` fanned out to every sink (TensorBoard's
    SummaryWriter, :class:`WandbSink`)."""

    def __init__(self, sinks: list[Any]):
        self.sinks = sinks

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        for sink in self.sinks:
            sink.add_scalar(tag, value, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def open_scalars(output: OutputConfig, out: Path, config: dict, resumed: bool = False) -> Optional[Scalars]:
    """The sinks ``output`` asks for (TensorBoard under ``<out>/tensorboard``, W&B), or None for neither;
    ``resumed``: a ``--resume`` run (W&B continues the run it was cut from)."""
    sinks: list[Any] = []
    if output.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        sinks.append(SummaryWriter(str(out / "tensorboard")))
    if output.wandb:
        sinks.append(WandbSink(output, out, config, resumed))
    return Scalars(sinks) if sinks else None


__all__ = ["Scalars", "WandbSink", "open_scalars", "check_wandb", "WANDB_INSTALL_HINT"]
