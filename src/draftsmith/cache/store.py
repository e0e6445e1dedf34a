"""The on-disk format of an offline feature cache (no engine imports: torch + safetensors only).

A cache directory holds ``manifest.json`` and safetensors shards ``shard-NNNNNN.safetensors``. One
cached *row* is one rendered conversation (a data Example) trimmed to its real length T; a shard
concatenates its R rows along tokens (N = sum of T):

    input_ids  (N,)       int32   the row's tokens
    loss_mask  (N,)       uint8   1 on assistant tokens
    aux        (N, n, H)  dtype   residual streams at the cached aux layer ids (vLLM convention)
    last       (N, H)     dtype   layer id L, the last layer's output BEFORE the final norm
    offsets    (R + 1,)   int64   row r is tokens offsets[r]:offsets[r + 1]

and its metadata entry ``draftsmith`` (JSON) lists each row's key, the sha1 of its int32 token bytes, so a reader serves
any batch of cached rows in any order, epoch or batch size. Full-vocab logits are never stored: the
engine rebuilds them from ``last`` with the target's final norm and lm_head (H values a token, not V).

Every write is atomic (:mod:`draftsmith.atomic`: a temporary file, fsync, ``os.replace``), and the manifest lists a shard only
after the shard is complete, so a killed build never leaves a half-written shard that counts.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch
from torch import Tensor

from draftsmith import atomic
from draftsmith.targets.contract import TargetError  # pure torch: the error type, no engine

FORMAT = "draftsmith-feature-cache"
VERSION = 1
MANIFEST = "manifest.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CacheError(TargetError):
    """An offline feature cache that is missing, incomplete, damaged or built for other settings (target,
    data, layer ids, dtype). Fix: rerun ``draftsmith cache`` with the same ``--out`` to complete it, or pass a
    new ``--out`` for these settings.

    A :class:`TargetError`, so the CLI prints it as one line (exit 2) and serve-target answers 400."""


def shard_name(index: int) -> str:
    return f"shard-{index:06d}.safetensors"


def row_key(input_ids: Sequence[int] | Tensor) -> str:
    """sha1 of the row's tokens as little-endian int32 bytes (the same for a list or any int tensor)."""
    t = input_ids if isinstance(input_ids, Tensor) else torch.tensor(list(input_ids))
    return hashlib.sha1(t.to(torch.int32).contiguous().numpy().astype("<i4").tobytes()).hexdigest()


def data_fingerprint(examples: Iterable[Any]) -> str:
    """sha256 over every example's token ids and loss mask, in order (what the cache was built from)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(torch.tensor(ex.input_ids, dtype=torch.int32).numpy().astype("<i4").tobytes())
        h.update(bytes(int(m) for m in ex.loss_mask))
        h.update(b"|")  # row boundary: [1, 2][3] and [1][2, 3] must differ
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def bytes_per_token(num_aux: int, hidden: int, dtype: str) -> int:
    """Stored bytes per token: int32 id + uint8 mask + (n aux + 1 last) x H values of ``dtype``."""
    return 4 + 1 + (num_aux + 1) * hidden * DTYPES[dtype].itemsize


def write_manifest(cache_dir: Path, manifest: dict) -> None:
    atomic.write_json(Path(cache_dir) / MANIFEST, manifest)


def read_manifest(cache_dir: Path) -> dict:
    """The manifest of ``cache_dir``; a missing dir/manifest or a foreign format is a :class:`CacheError`."""
    path = Path(cache_dir) / MANIFEST
    if not path.is_file():
        raise CacheError(f"target.cache_dir: {path} does not exist; build the cache first with "
                         f"`draftsmith cache CONFIG --out {cache_dir}`")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CacheError(f"{path}: unreadable ({e.__class__.__name__}); rebuild it with `draftsmith cache` "
                         f"into a new --out dir") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CacheError(f"{path}: format {manifest.get('format')!r} v{manifest.get('version')!r}, expected "
                         f"{FORMAT!r} v{VERSION}; rebuild it with this draftsmith's `draftsmith cache`")
    return manifest


def encode_shard(rows: Sequence[dict[str, Tensor]]) -> tuple[bytes, list[str], int]:
    """Serialise rows ({input_ids (T,), loss_mask (T,), aux (T, n, H), last (T, H)}) as one shard.

    Returns ``(safetensors bytes, row keys, tokens)``. Deterministic: the same rows give the same bytes.
    """
    from safetensors.torch import save

    keys = [row_key(r["input_ids"]) for r in rows]
    lengths = [int(r["input_ids"].shape[0]) for r in rows]
    offsets = torch.tensor([0] + lengths, dtype=torch.int64).cumsum(0)
    tensors = {
        "input_ids": torch.cat([r["input_ids"].to(torch.int32) for r in rows]),
        "loss_mask": torch.cat([r["loss_mask"].to(torch.uint8) for r in rows]),
        "aux": torch.cat([r["aux"] for r in rows]).contiguous(),
        "last": torch.cat([r["last"] for r in rows]).contiguous(),
        "offsets": offsets,
    }
    # One metadata entry: safetensors writes its metadata map in hash order, which varies between
    # processes, so several entries would make a resumed build's bytes differ from a single run's.
    meta = {"draftsmith": json.dumps({"format": FORMAT, "version": VERSION, "keys": keys})}
    return save(tensors, metadata=meta), keys, int(offsets[-1])


def rebuild_command(cache_dir: str | os.PathLike, manifest: dict) -> str:
    """The ``draftsmith cache`` command that redoes ``cache_dir``'s damaged or missing shards.

    A rerun into the same --out checks every shard file and rewrites only those that are not whole,
    and it must repeat the first build's engine and --shard-rows (the manifest holds both); the
    config is not recorded, so the user names it."""
    engine = f" --engine {manifest['engine']}" if manifest.get("engine") else ""
    rows = f" --shard-rows {manifest['shard_rows']}" if manifest.get("shard_rows") else ""
    return f"`draftsmith cache CONFIG --out {cache_dir}{engine}{rows}` (CONFIG: the run config it was built from)"


class CacheReader:
    """Memory-mapped access to a cache's rows by key (safetensors ``safe_open`` + ``get_slice``).

    Only the shards the manifest lists are read (a shard written after the last manifest update does
    not count). ``row(key)`` returns {input_ids (T,) int32, loss_mask (T,) uint8, aux (T, n, H), last (T, H)},
    views of the mapping (copy them before the file can change: a page cut from it is a SIGBUS).
    A damaged shard, at open or when a row is read, is a :class:`CacheError` naming the shard and
    the command that rebuilds it.
    """

    def __init__(self, cache_dir: str | os.PathLike):
        self.dir = Path(cache_dir)
        self.manifest = read_manifest(self.dir)
        self._shards: list[_Shard] = []
        self.index: dict[str, tuple[int, int, int]] = {}  # key -> (shard, start, end) token offsets
        for s, entry in enumerate(self.manifest["shards"]):
            path = self.dir / entry["file"]
            if not path.is_file():
                raise CacheError(f"{self.dir / MANIFEST} lists {entry['file']} but it is missing; rebuild it with "
                                 f"{rebuild_command(self.dir, self.manifest)}")
            shard = self._open(path)
            for r, key in enumerate(shard.keys):
                self.index.setdefault(key, (s, shard.offsets[r], shard.offsets[r + 1]))
            self._shards.append(shard)

    def _open(self, path: Path) -> "_Shard":
        from safetensors import safe_open

        from draftsmith.weights import DamagedFile, safetensors_layout

        try:
            # The size check first: safe_open's own error for a cut file is a SafetensorError that
            # names neither the file nor its size.
            _, end = safetensors_layout(path, noun="shard")
            inode = os.stat(path).st_ino
            f = safe_open(str(path), framework="pt")  # kept open: slices read lazily from the mapping
            keys = json.loads(f.metadata()["draftsmith"])["keys"]
            offsets = f.get_tensor("offsets").tolist()
        except DamagedFile as e:
            raise self._damaged(path, str(e)) from None
        except Exception as e:  # SafetensorError, a foreign file's metadata: the shard is not usable
            raise self._unreadable(path, e) from None
        return _Shard(path, f, keys, offsets, inode, end)

    def _damaged(self, path: Path, problem: str) -> CacheError:
        return CacheError(f"{path}: {problem}; rebuild it with {rebuild_command(self.dir, self.manifest)}")

    def _unreadable(self, path: Path, e: BaseException) -> CacheError:
        detail = (str(e).splitlines() or [""])[0][:120]
        return self._damaged(path, f"unreadable cache shard ({type(e).__name__}: {detail})")

    def _current(self, s: int) -> "_Shard":
        """Shard ``s``, checked against its file before a read.

        Reading a mapped page past the end of a file cut after open kills the process with SIGBUS,
        which no handler can turn into a message, so each read first stats the file. A file replaced
        since (a new inode: ``draftsmith cache`` rewrote a damaged shard) is mapped afresh, as the old
        mapping may be the damaged file; a removed one leaves the mapping whole, so it is read on."""
        shard = self._shards[s]
        try:
            st = os.stat(shard.path)
        except OSError:
            return shard
        if st.st_ino != shard.inode:
            fresh = self._open(shard.path)
            if (fresh.keys, fresh.offsets) != (shard.keys, shard.offsets):
                raise CacheError(f"{shard.path}: replaced while this run read it, by a shard holding other rows; "
                                 f"restart the run (one cache dir per config: `draftsmith cache` into a new --out)")
            self._shards[s] = shard = fresh
        elif st.st_size < shard.end:
            raise self._damaged(shard.path, f"truncated safetensors shard ({st.st_size} of {shard.end} bytes, "
                                            "cut while this run read it)")
        return shard

    def __contains__(self, key: str) -> bool:
        return key in self.index

    def __len__(self) -> int:
        return len(self.index)

    def row(self, key: str) -> dict[str, Tensor]:
        s, a, b = self.index[key]
        shard = self._current(s)
        try:
            return {name: shard.file.get_slice(name)[a:b] for name in ("input_ids", "loss_mask", "aux", "last")}
        except Exception as e:  # SafetensorError
            raise self._unreadable(shard.path, e) from None

    def close(self) -> None:
        self._shards.clear()
        self.index.clear()


@dataclass
class _Shard:
    """One open shard: its mapping, rows and what its file looked like when mapped."""

    path: Path
    file: Any  # safetensors safe_open handle
    keys: list[str]
    offsets: list[int]
    inode: int
    end: int  # the file's size by its header


def target_fingerprint(path: str | os.PathLike, dtype: str) -> dict:
    """What identifies the target a cache was built from: resolved path, config.json sha256, dtype."""
    p = Path(path).resolve()
    return {"path": str(p), "config_sha256": file_sha256(p / "config.json"), "dtype": dtype}


def check_target(manifest: dict, fingerprint: dict, cache_dir: Path, key: str = "target") -> None:
    """Refuse a cache built for another target or dtype, naming the field, both values and the fix."""
    was = manifest.get("target", {})
    for name in ("path", "config_sha256", "dtype"):
        if was.get(name) != fingerprint[name]:
            raise CacheError(
                f"{Path(cache_dir) / MANIFEST}: built for {key}.{name} {was.get(name)!r}, this run has "
                f"{fingerprint[name]!r}; train with the cache's target settings or build a cache for this one "
                f"(`draftsmith cache CONFIG --out NEW_DIR`)")
