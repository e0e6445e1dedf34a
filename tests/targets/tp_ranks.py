"""Fake tensor-parallel ranks for TPRunner tests: each rank holds a shard and the output needs an all-reduce.

Imported by name in the spawned rank processes (spawn hands them the parent's sys.path), so it lives in a
module of its own rather than in the test file.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class GlooRank:
    """Rank r's share of a row of token t is (r + 1) * t; the all-reduce sums the shares over the ranks.

    So rank 0's output is sum_r (r + 1) * t (3t for 2 ranks) only when every rank ran the same ``run``
    with the same capture ids: a rank left out would leave rank 0 waiting at the all-reduce.
    """

    def __init__(self, rank: int, world: int, init: str, hidden: int, fail_rank: int = -1, timeout_s: float = 60.0):
        if rank == fail_rank:
            raise RuntimeError(f"CUDA error: no device {rank}")
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s))
        self.rank, self.hidden, self.ids = rank, hidden, None

    def set_capture_layers(self, layer_ids):
        self.ids = list(layer_ids)

    def run(self, rows):
        out = []
        for r in rows:  # (T,) -> (T, n_ids, H), each rank's share, then summed over ranks
            x = torch.tensor(r, dtype=torch.float32)[:, None, None].repeat(1, len(self.ids), self.hidden)
            x = x * (self.rank + 1)
            dist.all_reduce(x)
            out.append(x)
        return out

    def close(self):
        dist.destroy_process_group()
