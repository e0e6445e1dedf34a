"""``draftsmith cache``: run the target once over the trainer's rows and store their features.

The rows are exactly the ones :class:`~draftsmith.train.loop.Trainer` builds (same
:func:`~draftsmith.train.loop.render_examples`, train and held-out alike: trainer eval asks the
engine too), deduplicated by token content and cut into shards of ``shard_rows`` rows in example
order. A shard's rows run through the engine in batches that never cross a shard boundary, so a
build resumed after a kill (it continues after the last shard the manifest lists) writes the same
bytes as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from draftsmith.cache import store
from draftsmith.cache.store import CacheError

BUILD_ENGINES = ("hf", "vllm", "sglang")  # engines that run the target in this process


def settings(manifest: dict) -> dict:
    """The manifest fields a resumed build must share with the first run, by user-facing name.

    Specific settings come before the data fingerprint, so a changed max_length is reported as that
    (it changes the fingerprint too) rather than as an opaque hash."""
    t, d = manifest["target"], manifest["data"]
    return {"target.path": t["path"], "target config.json sha256": t["config_sha256"], "target.dtype": t["dtype"],
            "engine": manifest["engine"], "aux layer ids": manifest["aux_layer_ids"],
            "data.max_length": d["max_length"], "data.chat_template sha256": d["chat_template_sha256"],
            "--shard-rows": manifest["shard_rows"],
            "data fingerprint (data.sources/max_rows/train.seed)": d["fingerprint"]}


def _check_resume(old: dict, new: dict, out: Path) -> None:
    for name, now in settings(new).items():
        was = settings(old).get(name)
        if was != now:
            raise CacheError(f"{out / store.MANIFEST}: this cache was built with {name} {was!r}, this run has "
                             f"{now!r}; pass a new --out dir for these settings (or rerun with the old ones)")


def _fresh_manifest(cfg, target_path: str, engine: str, aux_ids: list[int], text_cfg, examples, tokenizer,
                    n_rows: int, shard_rows: int) -> dict:
    template = cfg.data.chat_template or getattr(tokenizer, "chat_template", None) or ""
    H, L = int(text_cfg.hidden_size), int(text_cfg.num_hidden_layers)
    return {
        "format": store.FORMAT, "version": store.VERSION,
        "target": store.target_fingerprint(target_path, cfg.target.dtype),
        "engine": engine, "aux_layer_ids": aux_ids, "num_layers": L, "hidden_size": H,
        "dtype": cfg.target.dtype,
        "data": {"fingerprint": store.data_fingerprint(examples), "max_length": cfg.data.max_length,
                 "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
                 "examples": len(examples), "rows": n_rows},
        "shard_rows": shard_rows,
        "bytes_per_token": store.bytes_per_token(len(aux_ids), H, cfg.target.dtype),
        "rows": 0, "tokens": 0, "shards": [], "complete": False,
    }


def _valid_prefix(out: Path, shards: list[dict]) -> list[dict]:
    """The listed shards that are on disk with their recorded size (a later one is rewritten)."""
    ok = []
    for entry in shards:
        path = out / entry["file"]
        if not path.is_file() or path.stat().st_size != entry["bytes"]:
            break
        ok.append(entry)
    return ok


def build_cache(cfg, out_dir: str | os.PathLike, engine: Optional[str] = None, *, batch_size: Optional[int] = None,
                shard_rows: int = 256, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Build (or resume) the feature cache of ``cfg`` under ``out_dir``; returns the final manifest
    plus ``build``: {tokens, seconds} this call computed (not written to disk: the manifest stays
    byte-identical across resumed and uninterrupted builds).

    ``engine``: an engine name (hf, vllm, sglang) or None for ``target.engine`` (hf when that is
    ``cache``). ``batch_size`` rows per forward (default ``train.batch_size``).
    A rerun with different settings raises :class:`CacheError` naming the setting.
    """
    from tqdm import tqdm
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.models import resolve_target
    from draftsmith.targets import open_engine
    from draftsmith.train.loop import aux_layer_ids, render_examples

    if shard_rows < 1 or (batch_size is not None and batch_size < 1):
        raise CacheError(f"--shard-rows {shard_rows}, --batch-size {batch_size}: expected integers >= 1")
    name = engine or (cfg.target.engine if cfg.target.engine != "cache" else "hf")
    if name not in BUILD_ENGINES:
        raise CacheError(f"--engine/target.engine {name!r} cannot build a cache; use one of {list(BUILD_ENGINES)}")
    out = Path(out_dir)
    target_path = resolve_target(cfg.target.path)
    text_cfg = AutoConfig.from_pretrained(target_path, local_files_only=True).get_text_config()
    L = int(text_cfg.num_hidden_layers)
    aux_ids = aux_layer_ids(cfg, L)
    tokenizer = AutoTokenizer.from_pretrained(target_path, local_files_only=True)
    examples, _, _ = render_examples(cfg, tokenizer)
    rows, seen = [], set()  # unique rows in example order (identical conversations are stored once)
    for ex in examples:
        key = store.row_key(ex.input_ids)
        if key not in seen:
            seen.add(key)
            rows.append(ex)
    manifest = _fresh_manifest(cfg, target_path, name, aux_ids, text_cfg, examples, tokenizer, len(rows), shard_rows)
    if (out / store.MANIFEST).is_file():
        old = store.read_manifest(out)
        _check_resume(old, manifest, out)
        manifest["shards"] = _valid_prefix(out, old["shards"])
    elif out.exists() and any(out.iterdir()):
        raise CacheError(f"--out {out}: the directory is not empty and holds no {store.MANIFEST}; "
                         f"pass a new or empty --out dir")
    out.mkdir(parents=True, exist_ok=True)
    for tmp in out.glob("*.tmp"):  # left by a killed write; never listed, so never read
        tmp.unlink()
    done = len(manifest["shards"])
    n_shards = (len(rows) + shard_rows - 1) // shard_rows
    if done == n_shards and (out / store.MANIFEST).is_file() and store.read_manifest(out).get("complete"):
        log(f"cache: {out} is already complete ({len(rows)} rows); nothing to do")
        return {**store.read_manifest(out), "build": {"tokens": 0, "seconds": 0.0}}
    if done:
        log(f"cache: resuming {out} after {done} of {n_shards} complete shard(s)")
    store.write_manifest(out, _totals(manifest))

    eng = open_engine(name, target_path, dtype=cfg.target.dtype,
                      **({"engine_kwargs": cfg.target.engine_kwargs} if cfg.target.engine_kwargs else {}))
    # Ask for id L too (the pre-norm last state logits are rebuilt from); request order = aux ids, then L.
    request = aux_ids + ([L] if L not in aux_ids else [])
    bs = batch_size or cfg.train.batch_size
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    new_tokens, start = 0, time.perf_counter()
    todo = rows[done * shard_rows:]
    bar = tqdm(total=len(todo), disable=not progress, desc="cache", unit="row")
    try:
        for s in range(done, n_shards):
            chunk = rows[s * shard_rows : (s + 1) * shard_rows]
            shard_rows_out = []
            for i in range(0, len(chunk), bs):  # batches stay inside the shard: resume-stable bytes
                shard_rows_out += _run_batch(eng, chunk[i : i + bs], request, len(aux_ids), L, pad_id)
                bar.update(min(bs, len(chunk) - i))
            data, _, tokens = store.encode_shard(shard_rows_out)
            store.write_atomic(out / store.shard_name(s), data)
            manifest["shards"].append({"file": store.shard_name(s), "rows": len(chunk), "tokens": tokens,
                                       "bytes": len(data)})
            new_tokens += tokens
            manifest["complete"] = s == n_shards - 1
            store.write_manifest(out, _totals(manifest))  # lists the shard only once it is on disk
    finally:
        bar.close()
        eng.close()
    if n_shards == 0:
        manifest["complete"] = True
        store.write_manifest(out, _totals(manifest))
    wall = time.perf_counter() - start
    manifest = store.read_manifest(out)
    log(f"cache: {manifest['rows']} rows, {manifest['tokens']} tokens in {out} ({len(manifest['shards'])} shards); "
        f"built {new_tokens} tokens in {wall:.1f} s ({new_tokens / max(wall, 1e-9):.0f} tok/s); "
        f"{manifest['bytes_per_token']} bytes/token ({manifest['tokens'] * manifest['bytes_per_token'] / 2**20:.1f} MiB)")
    return {**manifest, "build": {"tokens": new_tokens, "seconds": wall}}  # "build": this run only, not on disk


def _totals(manifest: dict) -> dict:
    manifest["rows"] = sum(e["rows"] for e in manifest["shards"])
    manifest["tokens"] = sum(e["tokens"] for e in manifest["shards"])
    return manifest


def _run_batch(engine, examples, request: list[int], n_aux: int, L: int, pad_id: int) -> list[dict]:
    """One forward over ``examples``; per row {input_ids (T,), loss_mask (T,), aux (T, n, H), last (T, H)}."""
    from draftsmith.data.dataset import collate

    batch = collate(examples, pad_id)
    feats = engine.features(batch, request, logits=False)  # aux_hidden (B, S, len(request), H)
    h = feats.aux_hidden.detach().to("cpu")
    out = []
    for b, ex in enumerate(examples):
        T = len(ex.input_ids)
        out.append({"input_ids": torch.tensor(ex.input_ids, dtype=torch.int32),
                    "loss_mask": torch.tensor(ex.loss_mask, dtype=torch.uint8),
                    "aux": h[b, :T, :n_aux].contiguous(),  # (T, n, H)
                    "last": h[b, :T, request.index(L)].contiguous()})  # (T, H) pre-norm id L
    return out
