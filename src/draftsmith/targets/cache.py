"""The cache engine: features read from an offline feature cache; no target forward ever runs.

``draftsmith cache CONFIG --out DIR`` stores, per rendered conversation, the aux hidden states and
the pre-norm state at layer id L (cache/store.py). This engine serves them behind the ordinary
:class:`~draftsmith.targets.Engine` contract (``target.engine: cache``, ``target.cache_dir: DIR``):
rows are looked up by the hash of their real tokens, and logits are rebuilt from id L with the
target's final norm and lm_head, read from the checkpoint as :class:`~draftsmith.targets.runner.RunnerEngine`
does for vLLM/SGLang. Every cache holds id L whatever its aux ids, so every cache can serve the kinds
that need the target's output (``eagle3``: logits rebuilt in the cache's dtype; ``dflash_kd``: the
id-L state itself, from which the draft rebuilds them) without storing V values a token. Training from a cache therefore sees the same supervision as the engine that built it
(bitwise for the hf engine on CPU at batch size 1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import Tensor

from draftsmith.cache.store import CacheError, CacheReader, check_target, row_key, target_fingerprint
from draftsmith.targets import Batch, Features
from draftsmith.targets.contract import TargetError, rebuild_logits, validate_layer_ids
from draftsmith.targets.runner import DTYPES, RunnerEngine


class CacheEngine(RunnerEngine):
    """An engine over a feature cache directory ``cache_dir`` built for the target at ``target``.

    Weights and :class:`~draftsmith.targets.TargetInfo` come from the target checkpoint (RunnerEngine's
    safetensors reader); :meth:`features` comes from the cache. ``device`` (the trainer's, serve-target's
    ``--device``) is where features are returned: rows are read from the mapped cache on the CPU, moved
    there once per batch, and the logits are rebuilt there. None: the CPU.
    """

    def __init__(self, target: str | os.PathLike, *, dtype: str = "float32", cache_dir: Optional[str] = None,
                 device: Optional[str] = None):
        from draftsmith.models import resolve_target

        if not cache_dir:
            raise CacheError("target.cache_dir: not set; the cache engine reads a cache built with "
                             "`draftsmith cache CONFIG --out DIR`, so set target.cache_dir: DIR")
        path = Path(resolve_target(target))
        self.reader = CacheReader(cache_dir)  # a missing or foreign cache fails before the weights load
        m = self.reader.manifest
        if not m.get("complete"):
            raise CacheError(f"{cache_dir}: the cache is incomplete ({m.get('rows')} of {m['data'].get('rows')} rows); "
                             f"rerun `draftsmith cache` with the same config and --out {cache_dir} to finish it")
        check_target(m, target_fingerprint(path, dtype), Path(cache_dir))
        super().__init__(path, dtype)
        self.cache_dir = Path(cache_dir)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._head_on_device: Optional[tuple[Tensor, Tensor]] = None  # (norm (H,), lm_head (V, H)) on self.device
        self.cached_ids: list[int] = list(m["aux_layer_ids"])
        L, H = self._info.num_layers, self._info.hidden_size
        if (m["num_layers"], m["hidden_size"]) != (L, H):
            raise CacheError(f"{cache_dir}: cached for a target with {m['num_layers']} layers x {m['hidden_size']} "
                             f"hidden, {path} has {L} x {H}; rebuild the cache for this target")

    def features(self, batch: Batch, layer_ids: Sequence[int], *, logits: bool) -> Features:
        """aux (B, S, n, H) in request order and logits (B, S, V) or None, from the cache.

        Each row is found by the hash of its real tokens (attention_mask trims right padding). Pad
        positions hold zeros in aux and logits, as in RunnerEngine.
        """
        L = self._info.num_layers
        ids = validate_layer_ids(layer_ids, L)
        missing_ids = [i for i in ids if i != L and i not in self.cached_ids]
        if missing_ids:
            raise TargetError(f"target.aux_layer_ids: layer ids {missing_ids} are not in the cache {self.cache_dir} "
                              f"(it holds {self.cached_ids} and {L}); rebuild it with `draftsmith cache` for these "
                              f"ids into a new --out dir")
        B, S = batch.input_ids.shape
        lengths = batch.attention_mask.sum(dim=1).tolist()
        keys = [row_key(batch.input_ids[b, : int(n)]) for b, n in enumerate(lengths)]
        absent = [b for b, k in enumerate(keys) if lengths[b] > 0 and k not in self.reader]
        if absent:
            raise CacheError(f"target.cache_dir: {len(absent)} of {B} rows of this batch are not in the cache "
                             f"{self.cache_dir}; rerun `draftsmith cache` with this run's config (data, max_length, "
                             f"chat template) into a new --out dir")
        H = self._info.hidden_size
        aux = torch.zeros(B, S, len(ids), H, dtype=DTYPES[self.dtype])
        last = torch.zeros(B, S, H, dtype=DTYPES[self.dtype]) if logits else None
        for b, n in enumerate(lengths):
            if n == 0:
                continue
            row = self.reader.row(keys[b])  # aux (T, n_cached, H), last (T, H)
            for j, i in enumerate(ids):
                aux[b, :n, j] = row["last"] if i == L else row["aux"][:, self.cached_ids.index(i)]
            if last is not None:
                last[b, :n] = row["last"]
        # One host-to-device copy per tensor (a no-op on the CPU); the (B, S, V) logits are then built
        # on the device from (B, S, H), so the V-wide tensor never crosses the bus.
        aux = aux.to(self.device)
        out_logits = None
        if last is not None:
            norm, head = self._head()
            out_logits = rebuild_logits(last.to(self.device), norm, head, self._info.rms_norm_eps,
                                        self._info.head_form())
            out_logits[batch.attention_mask.to(self.device) == 0] = 0
        return Features(aux_hidden=aux, logits=out_logits)

    def target_head(self):
        """The head over the weights on ``self.device``: supervision builds logits there, in chunks."""
        from draftsmith.supervision.head import TargetHead

        norm, head = self._head()
        return TargetHead.from_weights(norm, head, self._info.rms_norm_eps, self._info.head_form())

    def _head(self) -> tuple[Tensor, Tensor]:
        """(final norm (H,), lm_head (V, H)) on ``self.device``, copied there once. The CPU copies stay
        what :meth:`embeddings` / :meth:`lm_head_weight` return, as RunnerEngine does."""
        if self._head_on_device is None:
            self._head_on_device = (self.final_norm_weight().to(self.device), self.lm_head_weight().to(self.device))
        return self._head_on_device

    def close(self) -> None:
        """Unmap the cache and drop the cached weights."""
        self.reader.close()
        self._cache.clear()
        self._head_on_device = None
