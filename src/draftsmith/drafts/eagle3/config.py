"""EAGLE-3 configs: the run's ``draft`` section (:class:`Eagle3DraftConfig`) and the model's
(:class:`Eagle3Config`: the shared EAGLE shape plus the training-time-test unroll), both ways between
it and an exported config.json. Torch-free.

What EAGLE-3 shares with P-EAGLE (its layer 0, fc and head are this family's) sits in
drafts/eagle_config.py: the ``draft`` knobs, the shape, the config.json keys both write and read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..eagle_config import EagleConfig, EagleDraftConfig, eagle_export, eagle_fields, refuse_other_family

__all__ = ["Eagle3DraftConfig", "Eagle3Config", "config_from_target", "config_from_export", "ttt_depth"]


@dataclass
class Eagle3DraftConfig(EagleDraftConfig):
    """``draft`` section of ``type: eagle3``: the training-time-test unroll on top of the shared knobs."""

    type: str = "eagle3"
    step_weight: float = 0.8  # step k weighs step_weight**k (ttt_steps, the unroll depth, is DraftConfig's)
    # A depth curriculum: the unroll starts at 1 step (what K=1 serves, a step of its cost) and deepens by one
    # step every ttt_ramp_fraction / (ttt_steps - 1) of the run's planned optimizer steps (a time-bound run's:
    # those train.max_time_s is expected to reach), reaching ttt_steps at this fraction of the run; 0 = ttt_steps
    # from the start. Held-out evaluation always runs the full unroll.
    ttt_ramp_fraction: float = 0.0

    def problems(self) -> list[str]:
        p = super().problems()
        if not 0.0 <= self.ttt_ramp_fraction < 1.0:
            p.append(f"'draft.ttt_ramp_fraction' = {self.ttt_ramp_fraction}: expected a fraction of the run in "
                     "[0, 1) (0 = the full unroll from the start)")
        return p


@dataclass
class Eagle3Config(EagleConfig):
    """The EAGLE shape (drafts/eagle_config.py) plus the training-time-test (TTT) unroll: ``ttt_steps``
    steps, step k's loss weighted by ``step_weight**k``, reached over ``ttt_ramp_fraction`` of the run
    (:func:`ttt_depth`)."""

    ttt_steps: int = 7
    step_weight: float = 0.8
    ttt_ramp_fraction: float = 0.0  # a training schedule (Eagle3DraftConfig's), not exported: serving never reads it

    def __post_init__(self):
        super().__post_init__()
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps={self.ttt_steps} must be >= 1 (the training-time-test unroll's steps)")

    @classmethod
    def from_export(cls, config: dict) -> "Eagle3Config":
        """Rebuild the config from an exported config.json dict (inverse of `Eagle3Draft.export_config`).

        Also reads plain third-party EAGLE-3 configs: missing fields take vLLM's defaults. A P-EAGLE
        config (`parallel_drafting: true`) is refused: its extra layers and mask_hidden would be lost.
        """
        refuse_other_family(config, "an EAGLE-3")
        if config.get("parallel_drafting"):
            raise ValueError("config.json has parallel_drafting=true (a P-EAGLE draft), expected an EAGLE-3 "
                             "config; load it with draftsmith.drafts.peagle.config.PEagleConfig.from_export")
        extra = config.get("draftsmith") or {}
        return cls(**EagleConfig.export_fields(config), ttt_steps=extra.get("ttt_steps", cls.ttt_steps),
                   step_weight=extra.get("step_weight", cls.step_weight))

    def to_export(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json for vLLM's LlamaForCausalLMEagle3 / NeMo AutoModel (inverse of :meth:`from_export`;
        the weights are the draft's ``state_dict()``): one decoder layer, the unroll in ``draftsmith``."""
        return eagle_export(self, aux_layer_ids, torch_dtype, num_hidden_layers=1, draftsmith={
            "draft_type": "eagle3", "ttt_steps": self.ttt_steps, "step_weight": self.step_weight})


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> Eagle3Config:
    """A draft shaped like one target decoder layer (``info``: TargetInfo), over ``draft_vocab_size``."""
    return Eagle3Config(**eagle_fields(info, draft, draft_vocab_size=draft_vocab_size, num_layer_ids=num_layer_ids),
                        ttt_steps=draft.ttt_steps, step_weight=draft.step_weight,
                        ttt_ramp_fraction=draft.ttt_ramp_fraction)


config_from_export = Eagle3Config.from_export


def ttt_depth(ttt_steps: int, ramp_fraction: float, step: int, total: int) -> int:
    """The TTT steps trained at optimizer step ``step`` of ``total`` under the depth curriculum: with the
    run's progress p = step / total and ramp r, depth = min(ttt_steps, 1 + floor(p (ttt_steps - 1) / r)),
    so 1 step until p = r / (ttt_steps - 1), one more each further r / (ttt_steps - 1), all from p = r on.
    r = 0 (or one TTT step): ttt_steps throughout. A pure function of (step, total), so a resumed run
    trains the depth the uninterrupted one would."""
    if ramp_fraction <= 0 or ttt_steps <= 1 or total <= 0:
        return ttt_steps
    p = min(1.0, max(0.0, step / total))
    return min(ttt_steps, 1 + int(p * (ttt_steps - 1) / ramp_fraction))
