"""Split a sharded offline job (``draftsmith cache``, ``draftsmith regenerate``) across torchrun ranks.

Both jobs cut their work into shards that are written whole (tmp + ``os.replace``) and skipped on a
rerun. Under ``torchrun --nproc-per-node N -m draftsmith cache|regenerate ...`` every rank computes
the same plan, shard ``i`` belongs to rank ``i % N``, and rank 0 alone writes the manifest:

1. :func:`main_first`: rank 0 validates/writes the manifest settings, clears temporaries and lists
   the shards already on disk; the others wait for that (a barrier that also carries rank 0's
   answer, or its error, so a refused resume stops every rank with the same one-line message);
2. each rank writes its own missing shards;
3. :func:`gather`: every rank reports (its result or its error); then rank 0 merges the manifest.

A kill -9 of any rank leaves only whole shards, which the rerun finds and skips, so nothing is
redone or lost and the merged manifest lists each shard once. Every rank must see the same output
dir (one machine, or a filesystem shared by the nodes).
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Optional, Sequence, TypeVar

import torch

from draftsmith import distributed
from draftsmith.distributed import Ranks

T = TypeVar("T")

# Ranks wait for each other at the merge for as long as the slowest rank's shards take (hours on a
# big job, more when a rerun leaves one rank most of the work), so the process group's per-collective
# timeout must outlast a whole build rather than torch's 30 minutes. A dead rank does not hang the
# others: torchrun tears the whole job down when one worker dies.
JOB_TIMEOUT_S = 7 * 24 * 3600.0


def job_ranks(error: type[Exception]) -> Ranks:
    """This process's ranks; ``error`` when torchrun launched several but no process group was joined
    (each process would then believe it is alone and write every shard)."""
    ranks = distributed.ranks_from_env()
    if ranks.world > 1 and not distributed.active():
        raise error(f"environment WORLD_SIZE={ranks.world} but this process joined no process group; launch "
                    "through the CLI (`torchrun --nproc-per-node N -m draftsmith cache|regenerate ...`) or call "
                    "draftsmith.distributed.init(ranks_from_env(), torch.device('cpu')) first")
    return ranks


def start(ranks: Ranks) -> None:
    """Join the process group for a sharded job (gloo: the collectives carry only small objects)."""
    distributed.init(ranks, torch.device("cpu"), timeout_s=JOB_TIMEOUT_S)


def owned(indices: Sequence[int], ranks: Ranks) -> list[int]:
    """The shard indices among ``indices`` that this rank writes: ``i % world == rank``."""
    return [i for i in indices if i % ranks.world == ranks.rank]


def _portable(e: BaseException) -> BaseException:
    """``e`` if it pickles (so other ranks raise the same type: exit 2 for a user error), else a
    RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def main_first(ranks: Ranks, fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and return its result on every rank; if it raises, every rank raises
    that error (instead of the others waiting forever at a barrier rank 0 never reaches)."""
    if ranks.world == 1:
        return fn()
    result: Any = None
    error: Optional[BaseException] = None
    if ranks.main:
        try:
            result = fn()
        except Exception as e:
            error = _portable(e)
    result, error = distributed.broadcast_object((result, error))
    if error is not None:
        raise error
    return result


def agree(ranks: Ranks, values: dict, where: str, error: type[Exception]) -> None:
    """Refuse when the ranks computed different settings (``values``, by user-facing name): every rank
    must cut the same shards, or two ranks would write different rows under one shard name."""
    gathered = distributed.all_gather_objects(values)
    for r, theirs in enumerate(gathered):
        for name in sorted(set(theirs) | set(gathered[0])):
            if theirs.get(name) != gathered[0].get(name):
                raise error(f"{where}: ranks disagree on {name}: rank {r} has {theirs.get(name)!r}, rank 0 has "
                            f"{gathered[0].get(name)!r}; run every rank with the same config, data files and "
                            "draftsmith version")


def gather(ranks: Ranks, fn: Callable[[], T], error: type[Exception], fix: str) -> list[T]:
    """Run this rank's work ``fn``, then wait for every rank; their results in rank order. A rank whose
    work raised re-raises its own error; the others raise ``error`` naming that rank and ``fix``."""
    if ranks.world == 1:
        return [fn()]
    result: Any = None
    mine: Optional[BaseException] = None
    try:
        result = fn()
    except Exception as e:
        mine = e
    reports = distributed.all_gather_objects((result, None if mine is None else f"{type(mine).__name__}: {mine}"))
    if mine is not None:
        raise mine
    failed = [(r, msg) for r, (_, msg) in enumerate(reports) if msg is not None]
    if failed:
        r, msg = failed[0]
        raise error(f"rank {r} failed ({msg.splitlines()[0]}); the shards every rank finished are kept: {fix}")
    return [res for res, _ in reports]
