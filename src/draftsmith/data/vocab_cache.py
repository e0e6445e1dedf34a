"""Draft-vocab selection for a dataset, cached on disk by a content fingerprint.

The fingerprint is a sha256 over everything the selection depends on: the tokenizer (its
serialized vocab/merges/added tokens and special ids), ``vocab_size``, ``draft_vocab_size`` and every
example's ids and loss mask. The cache file ``<cache_dir>/vocab_<fingerprint[:16]>.safetensors``
holds ``draft_ids``, ``d2t``, ``t2d`` plus ``coverage``/``fingerprint`` metadata; it is written
atomically (:mod:`draftsmith.atomic`), so a crash never leaves a half-written map behind.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from torch import Tensor

from draftsmith import atomic
from draftsmith.drafts import vocab as vocab_math


@dataclass
class VocabMap:
    """A draft vocab: ``draft_ids`` (Vd,) int64 sorted target ids, ``d2t`` (Vd,) int64 offsets
    (target = draft + d2t[draft]), ``t2d`` (V,) bool membership, supervised-token ``coverage``
    and the ``fingerprint`` of the inputs it was selected from."""

    draft_ids: Tensor
    d2t: Tensor
    t2d: Tensor
    coverage: float
    fingerprint: str

    def to_tensors(self) -> dict[str, Tensor]:
        """Everything as tensors (for checkpoints): the maps plus ``vocab_coverage`` (1,) float64
        and ``vocab_fingerprint`` (the hex string as uint8 bytes)."""
        return {
            "draft_ids": self.draft_ids.clone(),
            "d2t": self.d2t.clone(),
            "t2d": self.t2d.clone(),
            "vocab_coverage": torch.tensor([self.coverage], dtype=torch.float64),
            "vocab_fingerprint": torch.tensor(list(self.fingerprint.encode("ascii")), dtype=torch.uint8),
        }

    @classmethod
    def from_tensors(cls, tensors: dict[str, Tensor]) -> "VocabMap":
        """Inverse of :meth:`to_tensors` (coverage/fingerprint default to 0.0/"" when absent)."""
        missing = [k for k in ("draft_ids", "d2t", "t2d") if k not in tensors]
        if missing:
            raise ValueError(f"VocabMap.from_tensors: missing {missing}; expected the keys written by to_tensors()")
        cov = tensors.get("vocab_coverage")
        fp = tensors.get("vocab_fingerprint")
        return cls(
            draft_ids=tensors["draft_ids"].to(torch.long),
            d2t=tensors["d2t"].to(torch.long),
            t2d=tensors["t2d"].to(torch.bool),
            coverage=float(cov.reshape(-1)[0]) if cov is not None else 0.0,
            fingerprint=bytes(fp.tolist()).decode("ascii") if fp is not None else "",
        )


def _pairs(examples: Iterable[Any]) -> Iterable[tuple[list[int], list[int]]]:
    """Accept :class:`~draftsmith.data.dataset.Example` objects or ``(ids, mask)`` pairs."""
    for ex in examples:
        if hasattr(ex, "input_ids"):
            yield ex.input_ids, ex.loss_mask
        else:
            yield ex[0], ex[1]


def tokenizer_fingerprint_bytes(tokenizer: Any) -> bytes:
    """A stable serialization of what makes a tokenizer map text to ids the way it does."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        body = backend.to_str()
    else:
        body = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    specials = sorted(int(i) for i in getattr(tokenizer, "all_special_ids", []))
    return body.encode("utf-8") + b"\0specials=" + json.dumps(specials).encode()


def fingerprint(examples: Iterable[Any], tokenizer: Any, vocab_size: int, draft_vocab_size: int) -> str:
    """sha256 hex over the tokenizer, the two sizes and every example's ids + mask."""
    h = hashlib.sha256()
    h.update(b"draftsmith-vocab-v1\0")
    h.update(tokenizer_fingerprint_bytes(tokenizer))
    h.update(f"\0V={vocab_size}\0Vd={draft_vocab_size}\0".encode())
    for ids, mask in _pairs(examples):
        # Length-prefixed int64 bytes, so example boundaries are part of the hash.
        h.update(len(ids).to_bytes(8, "little"))
        h.update(torch.as_tensor(ids, dtype=torch.long).numpy().tobytes())
        h.update(torch.as_tensor(mask, dtype=torch.int8).numpy().tobytes())
    return h.hexdigest()


def cache_path(cache_dir: Path, fp: str) -> Path:
    """``<cache_dir>/vocab_<fp[:16]>.safetensors``."""
    return Path(cache_dir) / f"vocab_{fp[:16]}.safetensors"


def _load(path: Path, fp: str) -> Optional[VocabMap]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") != fp:
                return None  # a prefix collision or a stale file: rebuild
            t = {k: f.get_tensor(k) for k in ("draft_ids", "d2t", "t2d")}
        return VocabMap(t["draft_ids"], t["d2t"], t["t2d"], float(meta["coverage"]), fp)
    except Exception:  # unreadable/corrupt cache file: treat as a miss and overwrite it
        return None


def _save(path: Path, vm: VocabMap) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic.replacing(path) as tmp:
        save_file(
            {"draft_ids": vm.draft_ids.contiguous(), "d2t": vm.d2t.contiguous(), "t2d": vm.t2d.contiguous()},
            str(tmp),
            metadata={"coverage": repr(vm.coverage), "fingerprint": vm.fingerprint},
        )


def draft_vocab_for(
    examples: Iterable[Any],
    tokenizer: Any,
    vocab_size: int,
    draft_vocab_size: int,
    cache_dir: Optional[Path],
) -> VocabMap:
    """Select (or reuse from ``cache_dir``) the draft vocab for ``examples``.

    Counts supervised tokens, keeps ``tokenizer.all_special_ids`` first, then the most frequent ids
    (see :func:`draftsmith.drafts.vocab.select_draft_vocab`). ``cache_dir=None`` disables caching.
    """
    examples = list(examples)
    fp = fingerprint(examples, tokenizer, vocab_size, draft_vocab_size)
    path = cache_path(cache_dir, fp) if cache_dir is not None else None
    if path is not None and path.is_file():
        cached = _load(path, fp)
        if cached is not None:
            return cached

    counts = vocab_math.token_counts(_pairs(examples), vocab_size)  # (V,)
    special_ids = list(getattr(tokenizer, "all_special_ids", []))
    draft_ids = vocab_math.select_draft_vocab(counts, special_ids, draft_vocab_size)  # (Vd,)
    d2t, t2d = vocab_math.build_vocab_maps(draft_ids, vocab_size)
    vm = VocabMap(draft_ids, d2t, t2d, vocab_math.coverage(counts, draft_ids), fp)
    if path is not None:
        _save(path, vm)
    return vm


def held_out_coverage(examples: Iterable[Any], draft_ids: Tensor, vocab_size: int) -> Optional[float]:
    """The share of ``examples``' loss-mask tokens inside the draft vocab (``draft_ids``), None when
    they have none. The vocab is chosen on the train split, so its coverage there flatters it; on the
    held-out split it is what text the draft was not chosen on looks like (every other token is a
    certain miss)."""
    counts = vocab_math.token_counts(_pairs(examples), vocab_size)
    return vocab_math.coverage(counts, draft_ids) if int(counts.sum()) else None
