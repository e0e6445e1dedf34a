"""P-EAGLE configs: the run's ``draft`` section (:class:`PEagleDraftConfig`) and the model's
(:class:`PEagleConfig`: the shared EAGLE shape plus the parallel-drafting knobs), both ways between it
and an exported config.json. Torch-free.

What P-EAGLE shares with EAGLE-3 (its layer 0, fc and head are EAGLE-3's) sits in drafts/eagle_config.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..eagle_config import EagleConfig, EagleDraftConfig, eagle_export, eagle_fields, refuse_other_family
from ..family import positive

__all__ = ["PEagleDraftConfig", "PEagleConfig", "config_from_target", "config_from_export"]

MASK_HINT = "e.g. 16 <empty_output> for SmolLM2, 128002 for Llama-3"


@dataclass
class PEagleDraftConfig(EagleDraftConfig):
    """``draft`` section of ``type: peagle``: EAGLE-3's layer knobs plus K tokens drafted in one forward."""

    type: str = "peagle"
    num_depths: int = 8  # K; vLLM's num_speculative_tokens defaults to it at serve time
    mask_token_id: Optional[int] = None  # required: a reserved/unused target token id (the mask slots' token)
    num_draft_layers: int = 4  # layer 0 is the fused 2H EAGLE-3 layer, the rest plain decoder layers
    down_sample_ratio: float = 0.7  # COD: depth d keeps max(r^d, r_min) of the candidate anchors
    down_sample_ratio_min: float = 0.2  # COD: the floor r_min of that kept fraction

    def problems(self) -> list[str]:
        p = []
        if self.mask_token_id is None:
            p.append(f"'draft.mask_token_id' is required for draft.type {self.type}: set a reserved or unused token id "
                     f"of the target ({MASK_HINT})")
        p += positive(self, "num_depths", "num_draft_layers")
        if not (0 < self.down_sample_ratio <= 1 and 0 <= self.down_sample_ratio_min <= 1):
            p.append(f"'draft.down_sample_ratio' = {self.down_sample_ratio}, 'draft.down_sample_ratio_min' = "
                     f"{self.down_sample_ratio_min}: expected (0, 1] and [0, 1]")
        return p + super().problems()


@dataclass
class PEagleConfig(EagleConfig):
    """The EAGLE shape (drafts/eagle_config.py) plus the parallel-drafting knobs."""

    mask_token_id: int | None = None  # required: a reserved/unused target id, its embedding is the mask token
    num_depths: int = 8  # K tokens per forward; must equal vLLM's num_speculative_tokens
    num_draft_layers: int = 4  # the speculators reference uses 4; layer 0 is the fused 2H layer
    down_sample_ratio: float = 0.7  # COD keeps max(r^d, r_min) of the candidates at depth d
    down_sample_ratio_min: float = 0.2

    def __post_init__(self):
        super().__post_init__()
        m = self.mask_token_id
        if m is None or isinstance(m, bool) or not isinstance(m, int) or not 0 <= m < self.vocab_size:
            raise ValueError(f"mask_token_id={m!r} must be an int in 0..{self.vocab_size - 1} (the target vocab); "
                             "set it to a reserved or unused token id, e.g. 128002 for Llama-3")
        for key in ("num_depths", "num_draft_layers"):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{key}={v!r} must be an int >= 1; set {key} to 1 or more")
        if not 0.0 < self.down_sample_ratio <= 1.0:
            raise ValueError(f"down_sample_ratio={self.down_sample_ratio!r} must be in (0, 1]; the default is 0.7")
        if not 0.0 <= self.down_sample_ratio_min <= 1.0:
            raise ValueError(f"down_sample_ratio_min={self.down_sample_ratio_min!r} must be in [0, 1]; "
                             "the default is 0.2")

    @classmethod
    def from_export(cls, config: dict) -> "PEagleConfig":
        """Rebuild from an exported config.json dict (inverse of `PEagleDraft.export_config`)."""
        refuse_other_family(config, "a P-EAGLE")
        if config.get("parallel_drafting") is not True:
            raise ValueError(f"config.json has parallel_drafting={config.get('parallel_drafting')!r}, expected true "
                             "for a P-EAGLE draft; load an EAGLE-3 config with Eagle3Config.from_export")
        mask = config.get("mask_token_id", config.get("pard_token"))
        return cls(**EagleConfig.export_fields(config), mask_token_id=mask,
                   num_depths=config.get("num_depths", cls.num_depths),
                   num_draft_layers=config.get("num_hidden_layers", cls.num_draft_layers),
                   down_sample_ratio=config.get("down_sample_ratio", cls.down_sample_ratio),
                   down_sample_ratio_min=config.get("down_sample_ratio_min", cls.down_sample_ratio_min))

    def to_export(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json: the EAGLE layout with ``num_draft_layers`` decoder layers, then the parallel-drafting
        keys (docs/guides/families.md)."""
        out = eagle_export(self, aux_layer_ids, torch_dtype, num_hidden_layers=self.num_draft_layers,
                           draftsmith={"draft_type": "peagle"})
        out.update(
            parallel_drafting=True,
            mask_token_id=self.mask_token_id,
            num_depths=self.num_depths,
            down_sample_ratio=self.down_sample_ratio,
            down_sample_ratio_min=self.down_sample_ratio_min,
        )
        return out


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> PEagleConfig:
    """The EAGLE shape for this target plus the run's parallel-drafting knobs (``draft``: PEagleDraftConfig)."""
    base = eagle_fields(info, draft, draft_vocab_size=draft_vocab_size, num_layer_ids=num_layer_ids)
    return PEagleConfig(**base, mask_token_id=draft.mask_token_id, num_depths=draft.num_depths,
                        num_draft_layers=draft.num_draft_layers, down_sample_ratio=draft.down_sample_ratio,
                        down_sample_ratio_min=draft.down_sample_ratio_min)


config_from_export = PEagleConfig.from_export
