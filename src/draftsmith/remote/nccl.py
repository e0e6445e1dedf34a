"""The tensor data plane: metadata over HTTP, tensor bytes over a private 2-rank process group.

Protocol (docs/reference/wire.md):

1. Handshake, once per (client, server): the client ``POST /data-plane {"session", "plane"}``; the
   server opens a one-use TCP store on a free port, answers ``{"store_port"}``, and builds rank 0 of a
   2-rank group in the background; the client builds rank 1 against that store. The server then
   sends a fixed 8-byte probe, which proves the group works both ways of the handshake and, on NCCL,
   creates the communicator before the first real transfer.
2. Per request: ``/features`` carries ``meta.session``; the HTTP answer is a header-only frame whose
   ``meta.transfer`` lists names, dtypes and shapes. After that response is flushed, the server
   (rank 0) sends each tensor in :func:`transfer_plan` order, and the client (rank 1) receives into
   buffers it allocated from the same header, so both sides derive order and sizes from the metadata
   alone. NCCL has no bool and no int16 (and int8 is kept byte-exact), so bool/int8/int16 travel as
   uint8 byte views (:func:`send_view`) and are re-viewed on arrival (:func:`recv_view`).

Backends: ``nccl`` between CUDA processes (used only when both sides have CUDA,
:func:`choose_data_plane`), and ``gloo``, the same protocol over TCP between CPU processes, which is
how this path is exercised end to end on machines without GPUs. Anything that fails in the handshake
falls back to the HTTP wire frame for that server.
"""

from __future__ import annotations

import datetime
import os
import re
import socket
import threading
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

import torch
from torch import Tensor

from draftsmith.remote.wire import DTYPES

PLANES = ("auto", "nccl", "gloo", "wire")  # target.remote_data_plane: auto = nccl when both sides have CUDA on different GPUs, else the wire
# Dtypes NCCL cannot carry as themselves (or that we keep byte-exact): sent as uint8 views.
BYTE_VIEW_DTYPES = {"bool", "int8", "int16"}
PROBE = bytes(b"DSPLANE1")  # the handshake's first transfer, server -> client
SESSION_RE = re.compile(r"^[0-9a-f]{32}$")  # uuid4().hex
JOINED_KEY = "draftsmith/joined"  # the client sets it in the store once it joined; the server waits for it
_NAMES = {dt: name for name, (dt, _) in DTYPES.items()}
_ENV_LOCK = threading.Lock()


def cuda_uuid(device: Optional[torch.device] = None) -> Optional[str]:
    """The UUID of this process's CUDA device (None without CUDA): two ranks on one GPU cannot use NCCL."""
    if not torch.cuda.is_available():
        return None
    try:
        return str(torch.cuda.get_device_properties(device or torch.cuda.current_device()).uuid)
    except (RuntimeError, AttributeError):
        return None


def nccl_usable() -> bool:
    """True when this process could join an NCCL group (a CUDA device and an NCCL-enabled torch)."""
    import torch.distributed as dist

    return torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available()


def local_planes() -> list[str]:
    """Data planes this process can serve: always ``wire``; ``gloo`` with torch.distributed; ``nccl`` with CUDA."""
    import torch.distributed as dist

    planes = ["wire"]
    if dist.is_available() and dist.is_gloo_available():
        planes.append("gloo")
    if nccl_usable():
        planes.append("nccl")
    return planes


def choose_data_plane(requested: str, local_cuda: bool, remote_cuda: bool,
                      remote_planes: Sequence[str] = ("wire", "gloo", "nccl"), same_gpu: bool = False) -> tuple[str, str]:
    """``("nccl" | "gloo" | "wire", reason)`` for one client/server pair.

    ``auto`` takes NCCL when both sides have CUDA on different GPUs (NCCL refuses two ranks on one
    device) and the wire otherwise; ``nccl`` is the same but says why it fell back; ``gloo`` (CPU
    processes) is used when the server offers it; ``wire`` always travels over HTTP.
    """
    if requested not in PLANES:
        raise ValueError(f"data plane {requested!r}: expected one of {', '.join(PLANES)}")
    if requested == "wire":
        return "wire", "wire requested"
    if requested == "gloo":
        if "gloo" not in remote_planes:
            return "wire", "the server does not offer gloo"
        return "gloo", "gloo requested"
    missing = [side for side, ok in (("this side", local_cuda), ("the server", remote_cuda)) if not ok]
    if missing:
        return "wire", f"{' and '.join(missing)} {'has' if len(missing) == 1 else 'have'} no CUDA"
    if same_gpu:
        return "wire", "this side and the server use the same GPU (NCCL needs one GPU per rank)"
    return "nccl", "both sides have CUDA"


@dataclass(frozen=True)
class Transfer:
    """One tensor of a transfer: how it is described (dtype, shape) and how it is sent."""

    name: str
    dtype: str  # wire dtype name
    shape: tuple[int, ...]
    send_dtype: str  # "uint8" for byte-viewed dtypes, else ``dtype``
    send_numel: int  # elements of the sent buffer (bytes for byte views)


def transfer_entries(tensors: Mapping[str, Tensor]) -> list[dict]:
    """The header a server announces before sending ``tensors``: ``[{name, dtype, shape}]`` in send order."""
    return [{"name": k, "dtype": _NAMES[t.dtype], "shape": list(t.shape)} for k, t in tensors.items()]


def transfer_plan(entries: Sequence[Mapping], max_elements: Optional[int] = None) -> list[Transfer]:
    """The send/receive order from header entries (``name``, ``dtype``, ``shape``): header order.

    Both ranks call this on the same header, so they agree on order and sizes without more messages.
    A receiver passes ``max_elements`` so a corrupt header cannot make it allocate without bound.
    """
    if not isinstance(entries, (list, tuple)):
        raise ValueError("transfer plan: the header's 'transfer' must be a list of {name, dtype, shape}")
    plan, seen, total = [], set(), 0
    for e in entries:
        if not isinstance(e, Mapping) or not {"name", "dtype", "shape"} <= set(e) or not isinstance(e["shape"], list):
            raise ValueError(f"transfer plan: entry {str(e)[:64]} must hold name, dtype and a shape list")
        name, dtype = e["name"], e["dtype"]
        if dtype not in DTYPES or name in seen:
            raise ValueError(f"transfer plan: tensor {name!r} has an unknown dtype {dtype!r} or is repeated")
        seen.add(name)
        numel = 1
        for d in e["shape"]:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise ValueError(f"transfer plan: tensor {name!r} dimension {d!r} is not a count")
            numel *= d
        total += numel
        if max_elements is not None and total > max_elements:
            raise ValueError(f"transfer plan: more than {max_elements} elements announced")
        shape = tuple(e["shape"])
        byte_view = dtype in BYTE_VIEW_DTYPES
        plan.append(Transfer(name, dtype, shape, "uint8" if byte_view else dtype,
                             numel * DTYPES[dtype][1] if byte_view else numel))
    return plan


def send_view(t: Tensor) -> Tensor:
    """A flat buffer NCCL can send: bool/int8/int16 -> uint8 bytes (no copy), others flattened."""
    flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8) if _NAMES[t.dtype] in BYTE_VIEW_DTYPES else flat


def recv_view(buf: Tensor, item: Transfer) -> Tensor:
    """The received flat buffer re-viewed as ``item``'s dtype and shape (inverse of :func:`send_view`)."""
    dt = DTYPES[item.dtype][0]
    return (buf.view(dt) if item.send_dtype != item.dtype else buf).reshape(item.shape)


def open_store(host: str, timeout_s: float):
    """The server's one-use rendezvous store on a free port of ``host``: ``(store, port)``.

    The socket is bound here and handed to the store, because a store that binds its own port
    listens on every interface, and a loopback-only server must not open a port beyond loopback.
    The store gets a duplicate of the descriptor and owns it (it closes it when destroyed, and
    already has when its construction fails), so ours is closed here whatever happens: closing
    the store's after a failure would close whatever number the process reused meanwhile.
    """
    import torch.distributed as dist

    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(8)
        port = sock.getsockname()[1]
    except BaseException:
        sock.close()
        raise
    with sock:  # the store's duplicate keeps the socket listening after ours is closed
        store = dist.TCPStore(host, port, 2, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=os.dup(sock.fileno()))
    return store, port


def join_store(host: str, port: int, timeout_s: float):
    """The client's side of the server's rendezvous store (marked joined, which the server waits for)."""
    import torch.distributed as dist

    store = dist.TCPStore(host, port, 2, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
    store.set(JOINED_KEY, "1")
    return store


class Channel:
    """A private 2-rank process group over ``store`` (rank 0 = server, sends; rank 1 = client, receives).

    Not the default process group, so a trainer's own torch.distributed setup is untouched. Every
    operation waits at most ``timeout_s`` and raises on a dead or silent peer; the caller then
    closes the channel and falls back (client: another server or a new handshake).
    """

    def __init__(self, backend: str, store, rank: int, timeout_s: float = 300.0, local_host: str = "127.0.0.1",
                 device: Optional[torch.device] = None):
        import torch.distributed as dist

        if backend not in ("nccl", "gloo"):
            raise ValueError(f"data plane backend {backend!r}: expected nccl or gloo")
        self.backend, self.rank, self.peer, self.store = backend, rank, 1 - rank, store
        self.ready = False  # set once both ranks joined (server: as its probe goes out)
        self.lock = threading.RLock()  # one transfer at a time (sends and receives pair up in order); close waits
        self.timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "nccl":
            if not nccl_usable():
                raise RuntimeError("the nccl data plane needs CUDA and an NCCL-enabled torch on this side")
            self.device = device or torch.device("cuda", torch.cuda.current_device())
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            # Blocking-wait mode: a failed or timed-out transfer raises in our wait() and nothing else.
            # Under the default async error handling the watchdog thread would rethrow the failure
            # and abort the whole process (the server, or the trainer) instead of failing over.
            # The constructor reads the variable once, so it is set only around it.
            with _ENV_LOCK:
                old = os.environ.get("TORCH_NCCL_BLOCKING_WAIT")
                os.environ["TORCH_NCCL_BLOCKING_WAIT"] = "1"
                try:
                    self.group = dist.ProcessGroupNCCL(store, rank, 2, opts)
                finally:
                    if old is None:
                        os.environ.pop("TORCH_NCCL_BLOCKING_WAIT", None)
                    else:
                        os.environ["TORCH_NCCL_BLOCKING_WAIT"] = old
        else:
            self.device = torch.device("cpu")  # gloo moves CPU tensors
            # Gloo listens on the address it is given (by default: whatever the hostname resolves to);
            # ``local_host`` is the address this side's HTTP connection uses, so the pair follows it.
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = self.timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host)]
            self.group = dist.ProcessGroupGloo(store, rank, 2, opts)  # blocks until both ranks join

    def _send(self, buf: Tensor) -> None:
        self.group.send([buf], self.peer, 0).wait(self.timeout)

    def _recv(self, buf: Tensor) -> None:
        self.group.recv([buf], self.peer, 0).wait(self.timeout)

    def send(self, tensors: Mapping[str, Tensor], plan: Sequence[Transfer]) -> None:
        """Send ``tensors`` in ``plan`` order (plan order == header order on both ranks)."""
        for item in plan:
            if item.send_numel:  # the receiver skips empty tensors too
                self._send(send_view(tensors[item.name].to(self.device)))

    def recv(self, plan: Sequence[Transfer]) -> dict[str, Tensor]:
        """Receive the tensors ``plan`` announces, on this channel's device."""
        out = {}
        for item in plan:
            buf = torch.empty(item.send_numel, dtype=DTYPES[item.send_dtype][0], device=self.device)
            if item.send_numel:
                self._recv(buf)
            out[item.name] = recv_view(buf, item)
        return out

    def send_probe(self) -> None:
        # Ready (evictable) from here: both ranks joined the group. Marked before the send, because
        # the client can hold the probe, and open its next session, before our send returns.
        self.ready = True
        self._send(torch.frombuffer(bytearray(PROBE), dtype=torch.uint8).to(self.device))

    def recv_probe(self) -> None:
        buf = torch.zeros(len(PROBE), dtype=torch.uint8, device=self.device)
        self._recv(buf)
        if bytes(buf.cpu().tolist()) != PROBE:
            raise RuntimeError("data plane probe arrived corrupted")
        self.ready = True

    def close(self) -> None:
        """Tear the group down after any transfer in flight (best effort: the peer may already be gone)."""
        with self.lock:
            group, self.group = self.__dict__.pop("group", None), None
        if group is not None and self.backend == "nccl":  # every op waits with a timeout, so the lock frees
            try:
                group.abort()  # frees the communicator without waiting on a dead peer
            except Exception:
                pass
        self.store = None
