"""Ranks, devices and the few collectives draftsmith needs, on torch's own distributed stack.

Jobs that run on several processes are launched by ``torchrun`` (``torchrun --nproc-per-node N -m
draftsmith train CONFIG``), which sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them a
job is one process (rank 0 of 1) and every helper here is a no-op. The process group uses NCCL when
the job's device is a GPU and gloo on the CPU.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch


class DistError(ValueError):
    """A bad device or launch setting: ``train.device`` / ``--device`` naming a device this machine lacks,
    or torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK) that do not fit. Fix: pick a device that exists
    (``auto``, ``cpu``, ``cuda:N``), or launch with torchrun (``draftsmith train --nproc N``)."""


@dataclass(frozen=True)
class Ranks:
    """Where this process sits in the job: ``rank`` of ``world`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes checkpoints, logs and the progress bar."""
        return self.rank == 0


def ranks_from_env() -> Ranks:
    """The ranks torchrun set (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); rank 0 of 1 without them."""
    def read(name: str, default: int) -> int:
        text = os.environ.get(name)
        if text is None or text == "":
            return default
        try:
            return int(text)
        except ValueError:
            raise DistError(f"environment {name}={text!r}: expected an integer (torchrun sets it); unset it "
                            "or launch with torchrun") from None

    ranks = Ranks(read("RANK", 0), read("WORLD_SIZE", 1), read("LOCAL_RANK", 0))
    if ranks.world < 1 or not 0 <= ranks.rank < ranks.world:
        raise DistError(f"environment RANK={ranks.rank} WORLD_SIZE={ranks.world}: expected 0 <= RANK < WORLD_SIZE; "
                        "launch with torchrun")
    return ranks


def resolve_device(spec: str, local_rank: int = 0, key: str = "train.device") -> torch.device:
    """``train.device`` (or a command's ``--device``) -> a torch device. ``auto``: the local rank's GPU
    when CUDA is present (GPU ``local_rank % count``), else the CPU; ``cpu``; ``cuda`` (=
    ``cuda:<local_rank>``); ``cuda:N``. Errors name ``key`` (the config key or the flag) and its fix."""
    spec = str(spec).strip().lower()
    # how the fix is spelled: `train.device: cpu` in a run config, `--device cpu` on a command line
    fix = f"{key} cpu" if key.startswith("--") else f"{key}: cpu"
    if spec == "auto":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        return torch.device("cuda", local_rank % count) if count else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise DistError(f"{key} {spec!r}: this machine has no CUDA GPU (torch {torch.__version__}); "
                            f"use {fix} (or auto)")
        index = local_rank if spec == "cuda" else spec.partition(":")[2]
        try:
            index = int(index)
        except ValueError:
            raise DistError(f"{key} {spec!r}: expected auto, cpu, cuda or cuda:N") from None
        if not 0 <= index < torch.cuda.device_count():
            raise DistError(f"{key} {spec!r}: GPU {index} does not exist ({torch.cuda.device_count()} "
                            "visible); use cuda (the local rank's GPU) or a smaller index")
        return torch.device("cuda", index)
    raise DistError(f"{key} {spec!r}: expected auto, cpu, cuda or cuda:N")


def local_device(spec: str, key: str = "--device") -> torch.device:
    """:func:`resolve_device` for this process's ``LOCAL_RANK`` (0 outside torchrun): where a command
    that is not a training run (cache, regenerate, eval, serve-target) places its target."""
    return resolve_device(spec, ranks_from_env().local_rank, key=key)  # the module's name: tests patch it


# torch modules with ``group=dist.group.WORLD`` default arguments (torch.distributed.nn.functional,
# fsdp's ShardedGradScaler, ZeroRedundancyOptimizer). Imported AFTER the group is joined (transformers
# imports them while it loads a model), those defaults hold the group, so destroy_process_group cannot
# free it: gloo's worker threads outlive shutdown, and when one is still releasing the last collective's
# tensors as Python exits, the rank aborts ("terminate called without an active exception", SIGABRT,
# about 1 run in 8 here). Imported before, the defaults are None and shutdown joins those threads.
_HOLD_THE_GROUP = ("torch.distributed.nn", "torch.distributed.fsdp", "torch.distributed.optim")


def init(ranks: Ranks, device: torch.device, timeout_s: float = 1800.0) -> None:
    """Join torchrun's process group (nccl on a GPU, gloo on the CPU); nothing for one process."""
    import datetime

    import torch.distributed as dist

    if ranks.world == 1 or (dist.is_available() and dist.is_initialized()):
        return
    if not dist.is_available():
        raise DistError(f"WORLD_SIZE={ranks.world} but this torch build has no torch.distributed; "
                        "run one process or install a torch with distributed support")
    import importlib

    for name in _HOLD_THE_GROUP:  # before the group exists: see above
        importlib.import_module(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s),
                            **({"device_id": device} if device.type == "cuda" else {}))


def active() -> bool:
    """True inside a process group of more than one rank."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def barrier() -> None:
    """Wait for every rank (no-op for one process)."""
    import torch.distributed as dist

    if active():
        dist.barrier()


def _all_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    """``tensor`` reduced over ranks (``op``: SUM or MAX); unchanged for one process. NCCL reduces
    only GPU tensors: a CPU tensor travels through this rank's GPU and comes back on the CPU."""
    import torch.distributed as dist

    if not active():
        return tensor
    via_gpu = dist.get_backend() == "nccl" and tensor.device.type == "cpu"
    box = tensor.to(torch.device("cuda", torch.cuda.current_device())) if via_gpu else tensor
    dist.all_reduce(box, op=getattr(dist.ReduceOp, op))
    return box.cpu() if via_gpu else box


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` summed over ranks, on ``tensor``'s device (unchanged for one process)."""
    return _all_reduce(tensor, "SUM")


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s element-wise maximum over ranks, on ``tensor``'s device (unchanged for one process)."""
    return _all_reduce(tensor, "MAX")


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; ``[obj]`` for one process."""
    import torch.distributed as dist

    if not active():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj: Optional[Any], src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank (``obj`` itself for one process)."""
    import torch.distributed as dist

    if not active():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


# How long leaving the process group may take. destroy_process_group can hang after every collective
# has returned (pytorch#75097, open; gloo's worker threads at teardown): a finished run, its checkpoint
# and LATEST written, would then hold torchrun (and whoever waits on it) forever.
SHUTDOWN_WAIT_S = 60.0
_left_hanging = False


def shutdown(wait_s: float = SHUTDOWN_WAIT_S) -> None:
    """Leave the process group (if this process joined one), waiting at most ``wait_s`` seconds.
    Past that, one line on stderr, and :func:`left_hanging` tells the CLI to
    end the process at once with its exit code (``os._exit``: the interpreter's own teardown would
    wait on the same stuck group)."""
    global _left_hanging
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    rank = dist.get_rank()
    leave = threading.Thread(target=dist.destroy_process_group, name="draftsmith-leave-group", daemon=True)
    leave.start()
    leave.join(wait_s)
    if leave.is_alive():
        _left_hanging = True
        print(f"draftsmith: rank {rank}: leaving the process group did not finish in {wait_s:g} s (torch's "
              "destroy_process_group hang, pytorch#75097); what the command wrote before it is complete, "
              "so this rank ends without it", file=sys.stderr, flush=True)


def left_hanging() -> bool:
    """True once :func:`shutdown` gave up on a stuck process group: the process must end with
    ``os._exit`` (see :func:`draftsmith.cli.main`)."""
    return _left_hanging
