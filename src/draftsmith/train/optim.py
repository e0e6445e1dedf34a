"""The trainer's optimizer: AdamW (default), or Muon on the 2-D hidden weights with AdamW on the rest.

Why Muon here: speculators trains its EAGLE-3 drafts with Muon. Muon orthogonalises each matrix's
momentum (Newton-Schulz), which only means something for a 2-D weight that maps one hidden space to
another; embeddings and the lm_head are lookups/read-outs whose rows move independently, and norms and
vectors are not matrices, so those stay on AdamW (the usual split). torch 2.13 ships
``torch.optim.Muon``; ``adjust_lr_fn="match_rms_adamw"`` scales its update to AdamW's RMS, so it can
reuse AdamW's learning rate and weight decay (``train.muon_lr`` / ``train.muon_weight_decay`` null).

:class:`MuonAdamW` is one ``torch.optim.Optimizer`` over both: the LR scheduler sees every param group
(the same dicts the two inner optimizers step with, so the cosine scales both), and its state dict is
``{"parts": {"adamw": ..., "muon": ...}}`` of plain tensors, which ``optim.pt`` holds as before.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

# Parameters that stay on AdamW under train.optimizer: muon, by name (2-D, but not hidden-to-hidden maps)
ADAMW_ONLY = ("embed_tokens", "lm_head")


def is_muon_param(name: str, p: torch.Tensor) -> bool:
    """A 2-D hidden weight (attention/MLP projections, fc, GRU matrices): Muon; anything else: AdamW."""
    return p.ndim == 2 and not any(part in name.split(".") for part in ADAMW_ONLY)


class MuonAdamW(torch.optim.Optimizer):
    """Muon over ``muon_params`` and AdamW over ``adamw_params``, stepped together."""

    def __init__(self, muon_params: list[torch.Tensor], adamw_params: list[torch.Tensor], *, lr: float,
                 betas: tuple[float, float], weight_decay: float, muon_lr: float, muon_weight_decay: float):
        self.parts: dict[str, torch.optim.Optimizer] = {}
        if adamw_params:  # first, so the logged lr (param group 0) is train.lr as with plain AdamW
            self.parts["adamw"] = torch.optim.AdamW(adamw_params, lr=lr, betas=betas, weight_decay=weight_decay)
        if muon_params:
            self.parts["muon"] = torch.optim.Muon(muon_params, lr=muon_lr, weight_decay=muon_weight_decay,
                                                  adjust_lr_fn="match_rms_adamw")
        groups = [g for o in self.parts.values() for g in o.param_groups]
        # Optimizer.__init__ keeps the group dicts it is given: the scheduler's lr writes reach the parts
        super().__init__(groups, defaults={"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 (torch's signature)
        loss = closure() if closure is not None else None
        for o in self.parts.values():
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.parts.values():
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": {name: o.state_dict() for name, o in self.parts.items()}}

    def load_state_dict(self, state: dict) -> None:
        parts = state.get("parts") if isinstance(state, dict) else None
        if not isinstance(parts, dict) or set(parts) != set(self.parts):
            have = sorted(parts) if isinstance(parts, dict) else "a plain AdamW state"
            raise ValueError(f"the checkpoint's optimizer state holds {have}, this run's train.optimizer: muon holds "
                             f"{sorted(self.parts)}; resume with the optimizer the checkpoint was trained with")
        for name, o in self.parts.items():
            o.load_state_dict(parts[name])
        # load_state_dict gives each part NEW group dicts: point ours (what the LR scheduler writes) at them
        self.param_groups = [g for o in self.parts.values() for g in o.param_groups]


def build_optimizer(named: Iterable[tuple[str, nn.Parameter]], t) -> torch.optim.Optimizer:
    """The optimizer ``train.optimizer`` names over the trainable parameters (``t``: TrainConfig)."""
    named = [(n, p) for n, p in named if p.requires_grad]
    if t.optimizer == "adamw":
        return torch.optim.AdamW([p for _, p in named], lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay)
    muon = [p for n, p in named if is_muon_param(n, p)]
    adamw = [p for n, p in named if not is_muon_param(n, p)]
    return MuonAdamW(muon, adamw, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                     muon_lr=t.lr if t.muon_lr is None else t.muon_lr,
                     muon_weight_decay=t.weight_decay if t.muon_weight_decay is None else t.muon_weight_decay)


__all__ = ["MuonAdamW", "build_optimizer", "is_muon_param", "ADAMW_ONLY"]
