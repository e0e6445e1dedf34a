"""Reading weight files of drafts and checkpoints, with one error for every command.

``train --resume``, ``eval``, ``export``, ``serve`` and ``doctor`` all read the same files
(``model.safetensors``, shards, ``pytorch_model.bin``, ``vocab.safetensors``). A truncated or corrupt
file must end each of them the same way: one line naming the file, what is wrong and what to do,
exit 2 (:class:`CheckpointError` is one of the CLI's user errors). Nothing here imports torch at
module import time.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterable, Optional

MAX_HEADER = 100_000_000  # a safetensors header longer than this is a corrupt length field, not a header


class CheckpointError(ValueError):
    """A checkpoint or weight file that cannot be used: incomplete, truncated, corrupt, or written for
    another draft type, target or data. Fix: the message names the path; resume from another checkpoint
    (or start a new ``output.dir``), or re-export the draft."""


class DamagedFile(ValueError):
    """A safetensors file that is truncated or corrupt (its header or size does not add up). Fix: none
    here; each caller knows the one that fits its file (re-export a draft, rebuild a cache shard) and
    raises its own error with it."""


def safetensors_layout(path: str | Path, noun: str = "file") -> tuple[dict, int]:
    """``(header, size)`` of a safetensors file, reading the header only: tensor name -> {dtype, shape,
    data_offsets} (``__metadata__`` removed) and the size in bytes the header says the file has.

    A file cut short keeps a valid header when the cut falls in the tensor bytes, and safetensors
    memory-maps the rest, so the size is checked here: a shorter file raises :class:`DamagedFile`
    (``"truncated safetensors <noun> (N of M bytes)"``), as do a missing or corrupt header.
    """
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise DamagedFile(f"truncated safetensors {noun} ({len(raw)} bytes, no header)")
        (n,) = struct.unpack("<Q", raw)  # little-endian u64 header length
        if n > MAX_HEADER:
            raise DamagedFile(f"corrupt safetensors {noun} (a header of {n} bytes is not plausible)")
        text = f.read(n)
    size = path.stat().st_size
    if len(text) < n:
        raise DamagedFile(f"truncated safetensors {noun} ({size} of at least {8 + n} bytes, cut in the header)")
    try:
        header = json.loads(text)
        header.pop("__metadata__", None)
        end = 8 + n + max((int(v["data_offsets"][1]) for v in header.values()), default=0)
    except (ValueError, UnicodeDecodeError, TypeError, KeyError, IndexError, AttributeError):
        raise DamagedFile(f"corrupt safetensors {noun} (unreadable header)") from None
    if size < end:
        raise DamagedFile(f"truncated safetensors {noun} ({size} of {end} bytes)")
    return header, end


def _unreadable(path: Path, e: BaseException) -> CheckpointError:
    detail = (str(e).splitlines() or [type(e).__name__])[0][:120]
    return CheckpointError(f"{path}: corrupt or truncated weights file ({type(e).__name__}: {detail}); use another "
                           "checkpoint, or re-save / re-export this one")


def read_tensors(path: str | Path, keys: Optional[Iterable[str]] = None) -> dict:
    """Tensors of a ``.safetensors`` or torch (``.bin``/``.pt``, weights only) file, on the CPU.

    ``keys`` reads only those names that the file holds (a safetensors file then reads just their
    bytes); None reads everything. Any failure to read is a one-line :class:`CheckpointError`.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: weights file not found; point at a complete checkpoint")
    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="pt") as f:
                names = list(f.keys()) if keys is None else [k for k in keys if k in set(f.keys())]
                return {k: f.get_tensor(k) for k in names}
        import torch

        state = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(state, dict):
            raise TypeError(f"expected a dict of tensors, got {type(state).__name__}")
        return dict(state) if keys is None else {k: state[k] for k in keys if k in state}
    except CheckpointError:
        raise
    except Exception as e:  # SafetensorError, pickle/zip errors, OSError: all mean an unusable file
        raise _unreadable(path, e) from None
