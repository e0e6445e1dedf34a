"""NCCL data plane for GPU deployments: metadata over HTTP, tensor bytes over a 2-rank NCCL group.

Protocol: the HTTP answer carries the frame header only (names, dtypes, shapes; no payload). After
the response is flushed, the server (rank 0) sends each tensor over NCCL in :func:`transfer_plan`
order and the client (rank 1) receives into buffers it allocated from that same header, so both
sides derive the order and sizes from the metadata alone. NCCL has no bool and no int16, and int8
reductions are irrelevant here, so bool/int8/int16 travel as uint8 byte views (:func:`send_view`)
and are re-viewed on arrival (:func:`recv_view`).

It is used only when both sides have CUDA (:func:`choose_data_plane`); otherwise the HTTP wire
frame carries the bytes. The pure parts (plan, views, decision) are unit-tested on CPU; the channel
itself needs two CUDA devices and is exercised only on GPU machines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from draftsmith.remote.wire import DTYPES

# Dtypes NCCL cannot carry as themselves (or that we keep byte-exact): sent as uint8 views.
BYTE_VIEW_DTYPES = {"bool", "int8", "int16"}


def choose_data_plane(requested: str, local_cuda: bool, remote_cuda: bool) -> tuple[str, str]:
    """``("nccl" | "wire", reason)``: NCCL only when asked for (``auto``/``nccl``) and both sides have CUDA.

    ``requested`` is ``auto`` (NCCL when possible), ``nccl`` (preferred, still falls back) or ``wire``.
    """
    if requested not in ("auto", "nccl", "wire"):
        raise ValueError(f"data plane {requested!r}: expected one of auto, nccl, wire")
    if requested == "wire":
        return "wire", "wire requested"
    missing = [side for side, ok in (("this side", local_cuda), ("the server", remote_cuda)) if not ok]
    if missing:
        return "wire", f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no CUDA"
    return "nccl", "both sides have CUDA"


@dataclass(frozen=True)
class Transfer:
    """One tensor of a transfer: how it is described (dtype, shape) and how it is sent."""

    name: str
    dtype: str  # wire dtype name
    shape: tuple[int, ...]
    send_dtype: str  # "uint8" for byte-viewed dtypes, else ``dtype``
    send_numel: int  # elements of the sent buffer (bytes for byte views)


def transfer_plan(entries: Sequence[Mapping]) -> list[Transfer]:
    """The send/receive order from frame-header entries (``name``, ``dtype``, ``shape``): header order.

    Both ranks call this on the same header, so they agree on order and sizes without more messages.
    """
    plan, seen = [], set()
    for e in entries:
        name, dtype, shape = e["name"], e["dtype"], tuple(int(d) for d in e["shape"])
        if dtype not in DTYPES or name in seen:
            raise ValueError(f"nccl plan: tensor {name!r} has an unknown dtype {dtype!r} or is repeated")
        seen.add(name)
        numel = 1
        for d in shape:
            numel *= d
        byte_view = dtype in BYTE_VIEW_DTYPES
        plan.append(Transfer(name, dtype, shape, "uint8" if byte_view else dtype,
                             numel * DTYPES[dtype][1] if byte_view else numel))
    return plan


def send_view(t: Tensor) -> Tensor:
    """A flat buffer NCCL can send: bool/int8/int16 -> uint8 bytes (no copy), others flattened."""
    flat = t.contiguous().reshape(-1)
    name = next(k for k, (dt, _) in DTYPES.items() if dt == t.dtype)
    return flat.view(torch.uint8) if name in BYTE_VIEW_DTYPES else flat


def recv_view(buf: Tensor, item: Transfer) -> Tensor:
    """The received flat buffer re-viewed as ``item``'s dtype and shape (inverse of :func:`send_view`)."""
    dt = DTYPES[item.dtype][0]
    return (buf.view(dt) if item.send_dtype != item.dtype else buf).reshape(item.shape)


class NcclChannel:
    """A private 2-rank NCCL process group (rank 0 = server, rank 1 = client) over a TCP store.

    Not the default process group, so a trainer's own torch.distributed setup is untouched.
    """

    def __init__(self, host: str, port: int, rank: int, device: Optional[torch.device] = None, timeout_s: float = 300.0):
        import datetime

        import torch.distributed as dist

        if not torch.cuda.is_available():
            raise RuntimeError("NcclChannel needs CUDA on this side; the wire data plane is the fallback")
        self.rank, self.peer = rank, 1 - rank
        self.device = device or torch.device("cuda", torch.cuda.current_device())
        store = dist.TCPStore(host, port, 2, is_master=(rank == 0), timeout=datetime.timedelta(seconds=timeout_s))
        self.group = dist.ProcessGroupNCCL(store, rank, 2)

    def send(self, tensors: Mapping[str, Tensor], plan: Sequence[Transfer]) -> None:
        for item in plan:  # plan order == header order on both ranks
            buf = send_view(tensors[item.name].to(self.device))
            self.group.send([buf], self.peer, 0).wait()

    def recv(self, plan: Sequence[Transfer]) -> dict[str, Tensor]:
        out = {}
        for item in plan:
            buf = torch.empty(item.send_numel, dtype=DTYPES[item.send_dtype][0], device=self.device)
            self.group.recv([buf], self.peer, 0).wait()
            out[item.name] = recv_view(buf, item)
        return out
