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

The rest of the rank bookkeeping lives here too, so the trainer's loop reads as one process's:
:class:`DataParallel` joins torchrun's process group, cuts the epoch's *global* order into global
micro-batches of ``batch_size x ranks`` conversations and hands each rank its rows
(:func:`rank_share`), sums losses' denominators, metric sums and token counts over ranks, and runs
rank-0-only I/O (checkpoint writes, TensorBoard) with the others waiting; :class:`Position` is where
the run stands in that global order, which is what a resume with another number of ranks continues.
Training randomness is keyed by conversation (:func:`row_seed`), so N ranks x batch b reach the
weights one rank x batch N*b does.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional, TypeVar

import torch
from torch import nn

from draftsmith import distributed as dist
from draftsmith.config import ConfigError
from draftsmith.distributed import Ranks

PARALLEL = ("ddp", "fsdp2")
T = TypeVar("T")


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



# ---------------------------------------------------------------------------------- the data side
def micro_batches(order: list[int], batch_size: int) -> list[list[int]]:
    """``order`` cut into consecutive micro-batches of ``batch_size`` (the last one may be short)."""
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def rank_share(rows: list[int], batch_size: int, rank: int) -> tuple[list[int], float]:
    """Rank ``rank``'s rows of one global micro-batch and their loss weight: rows
    ``[rank*batch_size, (rank+1)*batch_size)``. A rank left without rows (the epoch's last, short
    global batch) runs the first row at weight 0, so every rank joins the gradient all-reduce."""
    mine = rows[rank * batch_size : (rank + 1) * batch_size]
    return (mine, 1.0) if mine else (rows[:1], 0.0)


def row_seed(seed: int, epoch: int, row: int) -> int:
    """The seed of conversation ``row``'s training randomness in ``epoch`` (P-EAGLE's COD, DFlash's
    anchors): a function of the conversation, not of the rank or micro-batch that holds it."""
    return (((seed * 1_000_003) ^ (epoch * 7_919)) * 1_000_033 + row) % (2**63 - 1)


def refuse_unsupported(t: Any, world: int) -> None:
    """What ``train.*`` asks that the wrapping cannot do on ``world`` ranks: a ConfigError naming
    every such key at once (nothing on one process)."""
    problems = []
    if world > 1 and t.parallel == "fsdp2" and t.spec_eval_every:
        problems.append(f"'train.spec_eval_every' = {t.spec_eval_every} with train.parallel fsdp2 on {world} ranks: "
                        "the exact spec eval needs the whole draft on rank 0; set it to 0 and run `draftsmith eval` on "
                        "the checkpoint, or use train.parallel: ddp")
    if world > 1 and t.parallel == "fsdp2" and t.optimizer == "muon":
        problems.append(f"'train.optimizer' = 'muon' with train.parallel fsdp2 on {world} ranks: Muon orthogonalises "
                        "whole matrices and FSDP2 shards them; use train.parallel: ddp")
    if problems:
        raise ConfigError(problems)


@dataclass
class Position:
    """Where a run stands in its data, counted in the epoch's global order of conversations, so it
    means the same to any number of ranks (a resume may change the world size or the batch)."""

    epoch: int = 0
    batch_pos: int = 0  # global micro-batches done in this epoch
    row_pos: int = 0  # conversations of this epoch's order done: what a resume with another global batch continues from
    group_batch: int = 1  # the global batch this epoch's length grouping was cut with (group_by_length)

    def advance(self, batches: list[list[int]]) -> None:
        """Count the global micro-batches ``batches`` as done."""
        self.row_pos += sum(len(rows) for rows in batches)
        self.batch_pos += len(batches)

    def next_epoch(self, global_batch: int) -> None:
        """The epoch is done: the next starts at its first conversation, grouped with ``global_batch``."""
        self.epoch, self.batch_pos, self.row_pos, self.group_batch = self.epoch + 1, 0, 0, global_batch

    @property
    def name_epoch(self) -> int:
        """The epoch a checkpoint taken here is named after: that of the last batch consumed (a
        finished epoch E is not "epoch E+1")."""
        return self.epoch - 1 if self.batch_pos == 0 and self.epoch > 0 else self.epoch


class DataParallel:
    """This process's part in a data-parallel run: its rank, its device and its share of the data.

    Built by :meth:`start` (torchrun's environment; rank 0 of 1 without it, where every method is
    the one-process identity). The model side is :meth:`wrap`; the trainer's loop asks this object
    for its rows, its cross-rank sums and rank-0-only I/O, and never reads a rank itself.
    """

    def __init__(self, ranks: Ranks, device: torch.device, how: str, batch_size: int):
        self.ranks, self.device, self.how, self.batch_size = ranks, device, how, batch_size

    @classmethod
    def start(cls, t: Any) -> "DataParallel":
        """torchrun's ranks, this rank's device (``train.device``) and the joined process group (gloo
        on the CPU, nccl on GPUs), after refusing what ``train.*`` asks that cannot run on them."""
        ranks = dist.ranks_from_env()
        device = dist.resolve_device(t.device, ranks.local_rank)
        refuse_unsupported(t, ranks.world)
        dist.init(ranks, device)
        return cls(ranks, device, t.parallel, t.batch_size)

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs and the progress bar."""
        return self.ranks.main

    @property
    def global_batch(self) -> int:
        """Conversations per micro-step, all ranks together."""
        return self.batch_size * self.ranks.world

    def wrap(self, draft: nn.Module) -> nn.Module:
        """The module the trainer calls (see :func:`wrap`)."""
        return wrap(draft, self.how, self.ranks.world, self.device)

    def describe(self, grad_accum: int, bf16: bool) -> str:
        """The setup line on ranks, batch, wrapping, device and precision."""
        how = f"{self.how}, {'nccl' if self.device.type == 'cuda' else 'gloo'}, " if self.ranks.world > 1 else ""
        return (f"batch: {self.ranks.world} rank(s) x batch {self.batch_size} x grad_accum {grad_accum} = global batch "
                f"{self.global_batch * grad_accum} ({how}device {self.device}, bf16 {'on' if bf16 else 'off'})")

    # ------------------------------------------------------------------ rows
    def global_batches(self, order: list[int]) -> list[list[int]]:
        """``order`` (conversation indices) cut into global micro-batches."""
        return micro_batches(order, self.global_batch)

    def share(self, rows: list[int]) -> tuple[list[int], float]:
        """This rank's rows of one global micro-batch and their loss weight (:func:`rank_share`)."""
        return rank_share(rows, self.batch_size, self.ranks.rank)

    # ------------------------------------------------------------------ sums over ranks
    def loss(self, out: Any, weight: float = 1.0) -> tuple[torch.Tensor, float]:
        """(loss to backpropagate, loss value) of this rank's share of a global micro-batch.

        One rank: the family's loss. Several: its LossParts with the denominators summed over ranks,
        times the world size (DDP and FSDP average gradients over ranks), so the gradient equals one
        process holding the whole global micro-batch; the value is that process's loss."""
        if self.ranks.world == 1:
            return out.loss, float(out.loss.detach())
        p = out.parts
        num, den = p.num * weight, p.den * weight
        both = dist.all_reduce_sum(torch.cat([num.detach(), den]).float())
        g_num, g_den = both[: num.numel()], both[num.numel() :]
        return p.loss(den=g_den, num=num) * self.ranks.world, float(p.loss(den=g_den, num=g_num))

    def reduce(self, sums: dict, tokens: int) -> tuple[dict, int]:
        """Metric sums and real tokens added over ranks (one all-reduce; unchanged for one rank)."""
        if self.ranks.world == 1:
            return sums, tokens
        keys = sorted(sums)
        flat = torch.cat([sums[k].reshape(-1).double().cpu() for k in keys] + [torch.tensor([float(tokens)], dtype=torch.float64)])
        flat = dist.all_reduce_sum(flat)
        out, i = {}, 0
        for k in keys:
            n = sums[k].numel()
            out[k] = flat[i : i + n].reshape(sums[k].shape).to(sums[k].dtype)
            i += n
        return out, int(flat[-1])

    def slowest(self, seconds: float) -> float:
        """The largest ``seconds`` over ranks: every rank takes the same stop and LR decisions from it
        (a rank that stopped alone would hang the others' all-reduce)."""
        if self.ranks.world == 1:
            return seconds
        return float(dist.all_reduce_max(torch.tensor([seconds], dtype=torch.float64)))

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (e.g. RNG states for a checkpoint)."""
        return dist.all_gather_objects(obj)

    # ------------------------------------------------------------------ rank-0 I/O
    def on_main(self, fn: Callable[[], T], default: Optional[T] = None) -> Optional[T]:
        """``fn()`` on rank 0 (``default`` elsewhere), then every rank waits for it: no rank runs ahead
        of a checkpoint write that may yet fail, or into a collective rank 0 has not reached."""
        result = fn() if self.main else default
        dist.barrier()
        return result

    # ------------------------------------------------------------------ resume
    def resume(self, meta: dict, n_train: int, n_rng: int) -> tuple[Position, Optional[str]]:
        """The data position a checkpoint's meta.json records, continued by this run's ranks, and the
        note to print when it was cut by another world size or global batch (``n_rng``: the ranks
        whose RNG states it holds; ``n_train``: this run's training conversations)."""
        # checkpoints before ranks counted micro-batches of train.batch_size on one process
        was_batch = meta.get("global_batch") or (meta.get("data_order") or {}).get("train.batch_size", self.batch_size)
        was_world = meta.get("world_size", 1)
        batch_pos = meta["batch_pos"]
        row_pos = meta.get("row_pos", min(batch_pos * was_batch, n_train))
        pos = Position(meta["data_epoch"], batch_pos, row_pos, was_batch)  # the epoch's rest keeps its grouping
        if (was_world, was_batch) == (self.ranks.world, self.global_batch):
            return pos, None
        world = self.ranks.world
        return pos, (f"resume: the checkpoint was cut by {was_world} rank(s), global batch {was_batch}; this run has "
                     f"{world} rank(s), global batch {self.global_batch}: the same global order of "
                     f"conversations continues at conversation {pos.row_pos} of epoch {pos.epoch}"
                     + ("" if world <= n_rng else f"; ranks {n_rng}..{world - 1} start from "
                        "rank 0's RNG state (training draws are keyed by conversation, not by rank)"))

    def position_meta(self, pos: Position) -> dict:
        """The meta.json fields that let :meth:`resume` continue from ``pos`` with any number of ranks."""
        return {
            "data_epoch": pos.epoch,  # where the data order resumes: (epoch, conversations done in it)
            "row_pos": pos.row_pos,
            "batch_pos": pos.batch_pos,  # global micro-batches done in the epoch
            "global_batch": self.global_batch,  # the batch the rest of the epoch is grouped with (group_by_length)
            "world_size": self.ranks.world,
            "parallel": self.how if self.ranks.world > 1 else None,
        }

    def close(self) -> None:
        """Leave the process group (if this process joined one)."""
        dist.shutdown()
