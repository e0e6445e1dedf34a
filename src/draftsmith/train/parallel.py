"""Data parallelism around the trainer's draft, from outside (as torchtitan does): the draft's code
never knows about ranks.

- ``ddp``: :class:`torch.nn.parallel.DistributedDataParallel`; gradients are averaged over ranks in
  the backward of a window's last micro-batch.
- ``fsdp2``: ``torch.distributed.fsdp.fully_shard`` on the whole draft as one unit: parameters are
  gathered for the forward and backward and resharded after, gradients are reduce-scattered and the
  AdamW state lives sharded (1/world per rank) -- the memory that dominates a draft with a 128k-256k
  vocab head. One unit because the families call their submodules' helper methods (not only
  ``forward``), which per-layer units would not gather.

Both wrap :class:`Supervised`, whose ``forward`` is the family's ``supervised(sup, generators)``, so
the wrapper sees the forward it must hook. Checkpoints stay in the one-process format either way:
:func:`full_state` gathers plain tensors (model keys and an id-keyed optimizer state, as
``optimizer.state_dict()`` writes them), :func:`load_optimizer` takes that format back.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

PARALLEL = ("ddp", "fsdp2")


class Supervised(nn.Module):
    """``forward(sup, generators)`` = ``draft.supervised(sup, generators)``; the module DDP/FSDP wrap."""

    def __init__(self, draft: nn.Module):
        super().__init__()
        self.draft = draft

    def forward(self, sup: Any, generators: Any = None) -> Any:
        return self.draft.supervised(sup, generators)


def wrap(draft: nn.Module, how: str, world: int, device: torch.device) -> nn.Module:
    """The module the trainer calls: ``Supervised(draft)``, wrapped in DDP or FSDP2 when ``world`` > 1."""
    model = Supervised(draft)
    if world == 1:
        return model
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        # every trainable parameter reaches every loss (a family with nothing to learn in a batch
        # returns a zero loss over all of them), so no unused-parameter search per step
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    if how == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
        return model
    raise ValueError(f"train.parallel {how!r}: expected one of {list(PARALLEL)}")


def grad_sync(model: nn.Module, sync: bool):
    """Context for one micro-batch's backward: gradients are reduced over ranks only when ``sync``
    (the window's last micro-batch); earlier ones accumulate locally."""
    if hasattr(model, "no_sync"):  # DDP
        return nullcontext() if sync else model.no_sync()
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
    return nullcontext()


def is_fsdp(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def full_state(model: nn.Module, draft: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """(draft state_dict, optimizer state_dict) as plain full tensors on the CPU, in the one-process
    format. A collective under FSDP2 (every rank calls it; only rank 0 receives the tensors);
    otherwise local."""
    if not is_fsdp(model):
        return draft.state_dict(), optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {k.removeprefix("draft."): v for k, v in get_model_state_dict(model, options=opts).items()}
    full = get_optimizer_state_dict(model, optimizer, options=opts)
    if "param_groups" not in full:  # cpu_offload gathers onto rank 0 only: the others get {} (they do not write)
        return state, {}
    # FQN-keyed -> id-keyed: id i is the i-th parameter of the optimizer's groups, as optimizer.state_dict() numbers them
    ids, groups, next_id = {}, [], 0
    for group in full["param_groups"]:
        names = group["params"]
        for name in names:
            ids[name] = next_id
            next_id += 1
        groups.append({**group, "params": [ids[n] for n in names]})
    return state, {"state": {ids[n]: s for n, s in full["state"].items()}, "param_groups": groups}


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Restore an id-keyed (one-process format) optimizer state, whatever the wrapping."""
    if not is_fsdp(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {p: n for n, p in model.named_parameters()}
    order = [names[p] for g in optimizer.param_groups for p in g["params"]]  # id i -> FQN
    groups = [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]]
    full = {"state": {order[int(i)]: s for i, s in state["state"].items()}, "param_groups": groups}
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))

