"""The binary tensor frame that `serve-target` and the remote engine exchange (never pickle).

Layout (all integers little-endian)::

    offset 0   4 bytes   magic  b"DSTF"
    offset 4   u16       version (VERSION)
    offset 6   u16       reserved, must be 0
    offset 8   u32       header length N (bytes of UTF-8 JSON)
    offset 12  N bytes   header: {"meta": {...}, "tensors": [{"name", "dtype", "shape", "offset", "nbytes"}]}
    12 + N     ...       payload: raw little-endian tensor bytes; each tensor's ``offset`` is relative to
                         the payload start, tensors are packed back to back in header order

Decoding trusts nothing: the magic, version, header length, JSON shape, dtype (whitelist), ndim,
every dimension, element counts (per frame, against :class:`Limits`), ``nbytes == numel * itemsize``,
offsets (contiguous, in bounds) and the total length are all checked before any tensor is built, and
bool payloads must hold only 0/1. Decoded tensors are zero-copy views of the body buffer.
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

MAGIC = b"DSTF"  # the first 4 bytes of every frame
VERSION = 1  # the frame layout version; a decoder refuses any other
_PREFIX = struct.Struct("<4sHHI")  # magic, version, reserved, header length
PREFIX_SIZE = _PREFIX.size  # bytes before the JSON header (12)

# The dtype whitelist: wire name -> (torch dtype, bytes per element).
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "float32": (torch.float32, 4),
    "float16": (torch.float16, 2),
    "bfloat16": (torch.bfloat16, 2),
    "int64": (torch.int64, 8),
    "int32": (torch.int32, 4),
    "int16": (torch.int16, 2),
    "int8": (torch.int8, 1),
    "uint8": (torch.uint8, 1),
    "bool": (torch.bool, 1),
}
_NAMES = {dt: name for name, (dt, _) in DTYPES.items()}

if sys.byteorder != "little":  # raw tensor bytes are written in host order; the frame says little-endian
    raise ImportError("draftsmith.remote.wire: big-endian hosts are not supported (the frame is little-endian)")


class FrameError(ValueError):
    """A tensor frame that is malformed or exceeds a limit; the message says which field and why. Fix:
    client and server must run the same draftsmith; raise ``--max-body-mb`` for a frame over the body limit.

    ``status`` is the HTTP status a server answers with (400 malformed, 413 over a limit); ``redo``
    names what the client must send again before retrying (``vocab-map``, ``data-plane``), if anything.
    """

    def __init__(self, message: str, status: int = 400, redo: Optional[str] = None):
        super().__init__(message)
        self.status, self.redo = status, redo


@dataclass(frozen=True)
class Limits:
    """Upper bounds a decoder enforces before it allocates or views anything."""

    max_body: int = 1 << 30  # bytes of a whole frame (1 GiB)
    max_header: int = 1 << 16  # bytes of JSON header
    max_tensors: int = 16  # tensors in one frame
    max_ndim: int = 6  # dimensions of one tensor
    max_elements: int = 1 << 28  # summed over all tensors of a frame


@dataclass
class Frame:
    """Decoded frame: a JSON-able ``meta`` dict and named tensors (in frame order)."""

    meta: dict
    tensors: dict[str, Tensor]


def encode(tensors: Mapping[str, Tensor], meta: Optional[Mapping[str, Any]] = None) -> bytes:
    """Serialise ``tensors`` (any device; copied to CPU contiguous) and ``meta`` into one frame."""
    entries, chunks, offset = [], [], 0
    for name, t in tensors.items():
        if t.dtype not in _NAMES:
            raise FrameError(f"encode: tensor {name!r} has dtype {t.dtype}; supported: {sorted(DTYPES)}")
        t = t.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8)  # (numel * itemsize,) bytes view, no copy
        entries.append({"name": str(name), "dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "offset": offset, "nbytes": int(raw.numel())})
        chunks.append(raw.numpy().data if raw.numel() else b"")
        offset += int(raw.numel())
    header = json.dumps({"meta": dict(meta or {}), "tensors": entries}, separators=(",", ":")).encode()
    header += b" " * (-(PREFIX_SIZE + len(header)) % 64)  # JSON-legal padding: payload starts 64-byte aligned
    return b"".join([_PREFIX.pack(MAGIC, VERSION, 0, len(header)), header, *chunks])


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise FrameError(f"frame header: {what} must be an integer, got {type(v).__name__}")
    return v


def decode(body: bytes | bytearray | memoryview, limits: Limits = Limits()) -> Frame:
    """Parse and validate one frame; raise :class:`FrameError` on anything malformed."""
    n = len(body)
    if n > limits.max_body:
        raise FrameError(f"frame: {n} bytes exceeds the limit of {limits.max_body}", 413)
    if n < PREFIX_SIZE:
        raise FrameError(f"frame: {n} bytes is shorter than the {PREFIX_SIZE}-byte prefix")
    magic, version, reserved, hlen = _PREFIX.unpack_from(body, 0)
    if magic != MAGIC:
        raise FrameError(f"frame: bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise FrameError(f"frame: version {version} is not supported (this side speaks {VERSION})")
    if reserved != 0:
        raise FrameError(f"frame: reserved field is {reserved}, expected 0")
    if hlen > limits.max_header or PREFIX_SIZE + hlen > n:
        raise FrameError(f"frame: header length {hlen} exceeds the body ({n} bytes) or the limit {limits.max_header}")
    try:
        header = json.loads(bytes(body[PREFIX_SIZE : PREFIX_SIZE + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FrameError(f"frame header: not UTF-8 JSON ({e.__class__.__name__})") from None
    if not isinstance(header, dict) or set(header) != {"meta", "tensors"}:
        raise FrameError("frame header: expected an object with exactly the keys 'meta' and 'tensors'")
    meta, entries = header["meta"], header["tensors"]
    if not isinstance(meta, dict) or not isinstance(entries, list):
        raise FrameError("frame header: 'meta' must be an object and 'tensors' a list")
    if len(entries) > limits.max_tensors:
        raise FrameError(f"frame header: {len(entries)} tensors exceeds the limit {limits.max_tensors}", 413)
    base, payload = PREFIX_SIZE + hlen, n - PREFIX_SIZE - hlen
    specs, expected_offset, total_elems = [], 0, 0
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"name", "dtype", "shape", "offset", "nbytes"}:
            raise FrameError(f"frame header: tensor #{i} must have exactly name, dtype, shape, offset, nbytes")
        name, dtype, shape = e["name"], e["dtype"], e["shape"]
        if not isinstance(name, str) or not name or len(name) > 64:
            raise FrameError(f"frame header: tensor #{i} name must be a non-empty string of <= 64 chars")
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise FrameError(f"frame header: tensor {name!r} dtype {str(dtype)[:32]!r} is not one of {sorted(DTYPES)}")
        if not isinstance(shape, list) or len(shape) > limits.max_ndim:
            raise FrameError(f"frame header: tensor {name!r} shape must be a list of <= {limits.max_ndim} dims")
        numel = 1
        for d in shape:
            d = _int(d, f"tensor {name!r} dimension")
            if d < 0 or d > limits.max_elements:
                raise FrameError(f"frame header: tensor {name!r} dimension {d} is outside 0..{limits.max_elements}", 413)
            numel *= d
            if numel > limits.max_elements:  # checked per dim so a huge product never gets built
                raise FrameError(f"frame header: tensor {name!r} has more than {limits.max_elements} elements", 413)
        total_elems += numel
        if total_elems > limits.max_elements:
            raise FrameError(f"frame: more than {limits.max_elements} elements in all tensors", 413)
        offset, nbytes = _int(e["offset"], f"tensor {name!r} offset"), _int(e["nbytes"], f"tensor {name!r} nbytes")
        if nbytes != numel * DTYPES[dtype][1]:
            raise FrameError(f"frame header: tensor {name!r} nbytes {nbytes} != numel {numel} x {DTYPES[dtype][1]}")
        if offset != expected_offset:
            raise FrameError(f"frame header: tensor {name!r} offset {offset}, expected {expected_offset} (packed in order)")
        expected_offset += nbytes
        if expected_offset > payload:
            raise FrameError(f"frame: tensor {name!r} ends at payload byte {expected_offset} but the payload has {payload}")
        if any(s[0] == name for s in specs):
            raise FrameError(f"frame header: tensor name {name!r} is repeated")
        specs.append((name, dtype, shape, offset, nbytes))
    if expected_offset != payload:
        raise FrameError(f"frame: payload has {payload} bytes but the tensors cover {expected_offset}")
    buf = body if isinstance(body, bytearray) else bytearray(body)  # frombuffer needs a writable buffer
    tensors: dict[str, Tensor] = {}
    for name, dtype, shape, offset, nbytes in specs:
        raw = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=base + offset) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        if dtype == "bool" and nbytes and int(raw.max()) > 1:
            raise FrameError(f"frame: bool tensor {name!r} holds bytes other than 0/1")
        tensors[name] = raw.view(DTYPES[dtype][0]).reshape(shape)
    return Frame(meta=meta, tensors=tensors)
