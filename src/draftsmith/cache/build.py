"""``draftsmith cache``: run the target once over the trainer's rows and store their features.

The rows are exactly the ones :class:`~draftsmith.train.loop.Trainer` builds (same
:func:`~draftsmith.inputs.render_examples`, train and held-out alike: trainer eval asks the
engine too), deduplicated by token content and cut into shards of ``shard_rows`` rows in example
order. A shard's rows run through the engine in batches that never cross a shard boundary, so a
build resumed after a kill (it checks each shard file and writes only the missing ones) writes the
same bytes as an uninterrupted one. Under torchrun the ranks split the shards (shard i: rank i % N)
and rank 0 merges one manifest; see :mod:`draftsmith.ranked`.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from draftsmith import atomic, console, ranked
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


@dataclass
class _Plan:
    """The unique rows in example order, cut into shards of ``shard_rows``: every rank computes the same."""

    rows: list
    keys: list[str]  # store.row_key of each row: what a shard file's metadata must list
    shard_rows: int

    @property
    def n_shards(self) -> int:
        return (len(self.rows) + self.shard_rows - 1) // self.shard_rows

    def span(self, s: int) -> slice:
        return slice(s * self.shard_rows, (s + 1) * self.shard_rows)

    def tokens(self, s: int) -> int:
        return sum(len(ex.input_ids) for ex in self.rows[self.span(s)])  # rows are stored at their real length


def _shard_on_disk(out: Path, plan: _Plan, s: int) -> Optional[dict]:
    """Shard ``s``'s manifest entry when its file holds exactly the plan's rows, else None.

    Shards can finish out of order (several ranks, or a kill between a shard and the manifest
    update), so a resume checks each shard file itself instead of trusting a listed prefix. Writes are
    atomic, so a file is whole; one that is unreadable or holds other rows is not counted and gets
    rewritten."""
    from safetensors import safe_open

    path = out / store.shard_name(s)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:  # reads the header only
            keys = json.loads(f.metadata()["draftsmith"])["keys"]
    except Exception:  # any unreadable header (foreign file, other format): not done, rewrite it
        return None
    if keys != plan.keys[plan.span(s)]:
        return None
    return {"file": path.name, "rows": len(keys), "tokens": plan.tokens(s), "bytes": path.stat().st_size}


def _prepare(out: Path, manifest: dict, plan: _Plan, log: Callable[[str], None]) -> dict:
    """Rank 0, before any rank writes a shard: check the settings against an existing manifest, clear
    temporaries, find the shards already on disk and write the manifest listing them.
    Returns {"done": {index: entry}, "complete": bool (nothing left to do)}."""
    old = None
    if (out / store.MANIFEST).is_file():
        old = store.read_manifest(out)
        _check_resume(old, manifest, out)
    elif out.exists() and any(not console.is_engine_log(p.name) for p in out.iterdir()):  # its engine log may be there
        raise CacheError(f"--out {out}: the directory is not empty and holds no {store.MANIFEST}; "
                         f"pass a new or empty --out dir")
    out.mkdir(parents=True, exist_ok=True)
    atomic.remove_stale_temps(out, "*.tmp")  # a killed write's; a live one (another process's) stays
    done = {s: e for s in range(plan.n_shards) if (e := _shard_on_disk(out, plan, s)) is not None}
    if len(done) == plan.n_shards and old is not None and old.get("complete"):
        log(f"cache: {out} is already complete ({len(plan.rows)} rows); nothing to do")
        return {"done": done, "complete": True}
    if done:
        log(f"cache: resuming {out} after {len(done)} of {plan.n_shards} complete shard(s)")
    manifest["shards"] = [done[s] for s in sorted(done)]
    store.write_manifest(out, _totals(manifest))
    return {"done": done, "complete": False}


def _merge(out: Path, manifest: dict, plan: _Plan, entries: dict[int, dict]) -> dict:
    """Rank 0, after every rank finished: list every shard once, in index order, and mark the cache
    complete. An entry whose file is not on disk at its size (it cannot be, short of a foreign
    writer) is an error rather than a silently shorter cache."""
    for s in range(plan.n_shards):
        e = entries.get(s)
        path = out / store.shard_name(s)
        if e is None or not path.is_file() or path.stat().st_size != e["bytes"]:
            raise CacheError(f"{path}: missing or changed after every rank finished; every rank must write the "
                             f"same --out {out} (one machine or a shared filesystem) and nothing else may; rerun "
                             "the same command to rebuild it")
    manifest["shards"] = [entries[s] for s in range(plan.n_shards)]
    manifest["complete"] = True
    store.write_manifest(out, _totals(manifest))
    return manifest


def build_cache(cfg, out_dir: str | os.PathLike, engine: Optional[str] = None, *, batch_size: Optional[int] = None,
                shard_rows: int = 256, progress: bool = True, log: Callable[[str], None] = console.say,
                device: Optional[str] = None) -> dict:
    """Build (or resume) the feature cache of ``cfg`` under ``out_dir``; returns the final manifest
    plus ``build``: {tokens, seconds} this call computed, over all ranks (not written to disk: the
    manifest stays byte-identical across resumed and uninterrupted builds).

    ``engine``: an engine name (hf, vllm, sglang) or None for ``target.engine`` (hf when that is
    ``cache``). ``batch_size`` rows per forward (default ``train.batch_size``). ``device``: where the hf
    engine runs the target (auto, cpu, cuda, cuda:N; the CLI's ``--device``), None for ``train.device``;
    ``target.device_map: auto`` spreads it over the GPUs instead. The device is not a cache setting: a
    build resumed on another device continues the same cache.
    A rerun with different settings raises :class:`CacheError` naming the setting.

    Under torchrun (``torchrun --nproc-per-node N -m draftsmith cache ...``; the CLI joins the process
    group) shard i is written by rank i % N and rank 0 writes the one manifest (see
    :mod:`draftsmith.ranked`); the files equal a one-process build's on the same device. Each rank
    opens its own engine (hf: on its device, ``auto`` = the local rank's GPU); vllm and sglang run one
    instance per rank, each on its own GPU (on one machine, give each local rank its own
    ``CUDA_VISIBLE_DEVICES``): the ranks split the shards, they do not form a vLLM data-parallel
    group. Progress and the summary come from rank 0 only.
    """
    if shard_rows < 1 or (batch_size is not None and batch_size < 1):
        raise CacheError(f"--shard-rows {shard_rows}, --batch-size {batch_size}: expected integers >= 1")
    name = engine or (cfg.target.engine if cfg.target.engine != "cache" else "hf")
    if name not in BUILD_ENGINES:
        raise CacheError(f"--engine/target.engine {name!r} cannot build a cache; use one of {list(BUILD_ENGINES)}")
    ranks = ranked.job_ranks(CacheError)
    log = log if ranks.main else _quiet  # one summary, from rank 0
    out = Path(out_dir)
    placed = placement(cfg, name, device, ranks.local_rank)  # a bad device fails before the data renders
    _preflight(cfg, name)  # a target the engine cannot run: one line before the data renders or a file is written
    job = _job(cfg, name, shard_rows, batch_size or cfg.train.batch_size, placed)
    from draftsmith.inputs import aux_order_note

    if note := aux_order_note(cfg):  # the manifest holds the ids ascending, as training reads them
        log(f"cache: {note}")
    # Every rank must cut the same shards, or two ranks would write different rows under one name.
    ranked.agree(ranks, settings(job.manifest), f"draftsmith cache --out {out}", CacheError)
    state = ranked.main_first(ranks, lambda: _prepare(out, job.manifest, job.plan, log))
    if state["complete"]:
        return {**store.read_manifest(out), "build": {"tokens": 0, "seconds": 0.0}}
    todo = ranked.owned([s for s in range(job.plan.n_shards) if s not in state["done"]], ranks)
    start = time.perf_counter()
    written = ranked.gather(ranks, lambda: _run_rank(job, out, todo, state["done"], ranks, progress), CacheError,
                            f"fix it and rerun the same command to finish {out}")
    entries = {**state["done"], **{s: e for part in written for s, e in part.items()}}
    final = ranked.main_first(ranks, lambda: _merge(out, job.manifest, job.plan, entries))
    wall = time.perf_counter() - start
    new_tokens = sum(e["tokens"] for part in written for e in part.values())
    log(f"cache: {final['rows']} rows, {final['tokens']} tokens in {out} ({len(final['shards'])} shards); "
        f"built {new_tokens} tokens in {wall:.1f} s ({new_tokens / max(wall, 1e-9):.0f} tok/s)"
        + (f" on {ranks.world} ranks" if ranks.world > 1 else "") + "; "
        f"{final['bytes_per_token']} bytes/token ({final['tokens'] * final['bytes_per_token'] / 2**20:.1f} MiB)")
    return {**final, "build": {"tokens": new_tokens, "seconds": wall}}  # "build": this run only, not on disk


@dataclass
class _Job:
    """What every rank derives from the config alone: the engine to open, the shard plan, the manifest."""

    cfg: object
    engine: str
    target_path: str
    aux_ids: list[int]
    L: int
    pad_id: int
    batch_size: int
    plan: _Plan
    manifest: dict
    placed: dict  # device / device_map keywords for the engine (hf only; vllm and sglang place the target)

    @property
    def request(self) -> list[int]:
        """Layer ids asked of the engine: the aux ids, then id L (logits are rebuilt from it)."""
        return self.aux_ids + ([self.L] if self.L not in self.aux_ids else [])


def placement(cfg, engine: str, device: Optional[str], local_rank: int) -> dict:
    """Where engine ``engine`` puts the target: {device, device_map} for hf, {} for the engines that
    place it themselves. ``device`` (``--device``) overrides ``train.device``; errors name the one given."""
    if engine != "hf":
        return {}
    from draftsmith import distributed

    spec, key = (device, "--device") if device is not None else (cfg.train.device, "train.device")
    placed = {"device": str(distributed.resolve_device(spec, local_rank, key=key))}
    if cfg.target.device_map is not None:
        placed["device_map"] = cfg.target.device_map
    return placed


def _preflight(cfg, engine: str) -> None:
    """The target's architecture against ``engine`` (targets/architecture.py), with the layer ids the cache will
    ask for (vLLM's Transformers backend cannot capture id 0)."""
    from draftsmith.inputs import aux_layer_ids
    from draftsmith.models import resolve_target
    from draftsmith.targets.architecture import check_engine_target, num_layers, read_config

    path = resolve_target(cfg.target.path)
    L = num_layers(read_config(path)[0] or {}) if engine == "vllm" else None
    ids = [*aux_layer_ids(cfg, L), L] if L else None
    check_engine_target(engine, path, engine_kwargs=cfg.target.engine_kwargs, layer_ids=ids)


def _job(cfg, name: str, shard_rows: int, batch_size: int, placed: dict) -> _Job:
    """Render the trainer's rows, deduplicate them by token content (in example order) and cut shards."""
    from transformers import AutoConfig, AutoTokenizer

    from draftsmith.models import resolve_target
    from draftsmith.inputs import aux_layer_ids, render_examples

    target_path = resolve_target(cfg.target.path)
    text_cfg = AutoConfig.from_pretrained(target_path, local_files_only=True).get_text_config()
    L = int(text_cfg.num_hidden_layers)
    aux_ids = aux_layer_ids(cfg, L)
    tokenizer = AutoTokenizer.from_pretrained(target_path, local_files_only=True)
    examples, _, _ = render_examples(cfg, tokenizer)
    if cfg.data.eval_sources:  # the held-out split comes from there, and trainer eval asks the engine for it too
        examples += render_examples(cfg, tokenizer, held_out=True)[0]
    rows, keys, seen = [], [], set()  # identical conversations are stored once
    for ex in examples:
        key = store.row_key(ex.input_ids)
        if key not in seen:
            seen.add(key)
            rows.append(ex)
            keys.append(key)
    manifest = _fresh_manifest(cfg, target_path, name, aux_ids, text_cfg, examples, tokenizer, len(rows), shard_rows)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return _Job(cfg, name, target_path, aux_ids, L, pad_id, batch_size, _Plan(rows, keys, shard_rows), manifest,
                placed)


def _run_rank(job: _Job, out: Path, todo: list[int], done: dict[int, dict], ranks, progress: bool) -> dict[int, dict]:
    """Write this rank's missing shards ``todo``; their entries by index. Rank 0 also keeps the manifest
    listing every shard it knows is on disk as it goes (the others' join at the merge)."""
    if not todo:
        return {}  # no engine to load: this rank's shards are all on disk
    listed = dict(done)

    def on_shard(s: int, entry: dict) -> None:
        if ranks.main:  # only rank 0 writes the manifest
            listed[s] = entry
            job.manifest["shards"] = [listed[i] for i in sorted(listed)]
            store.write_manifest(out, _totals(job.manifest))  # lists the shard only once it is on disk

    eng = _open(job)
    bar = console.PhaseBar(sum(len(job.plan.rows[job.plan.span(s)]) for s in todo), disable=not (progress and ranks.main),
                           desc="cache" if ranks.world == 1 else f"cache (rank 0 of {ranks.world})", unit="rows")
    try:
        return _write_shards(eng, job, out, todo, bar, on_shard)
    finally:
        bar.close()
        eng.close()


def _quiet(_: str) -> None:
    pass


def _open(job: _Job):
    """This rank's own engine (every rank loads the target; see build_cache for GPUs)."""
    from draftsmith.targets import TP_KWARG, open_engine, tp_engine_kwargs

    t = job.cfg.target
    kwargs = tp_engine_kwargs(job.engine, t.tp_size, t.engine_kwargs) if job.engine in TP_KWARG else t.engine_kwargs
    return open_engine(job.engine, job.target_path, dtype=t.dtype, **job.placed,
                       **({"engine_kwargs": kwargs} if kwargs else {}))


def _write_shards(eng, job: _Job, out: Path, todo: list[int], bar, on_shard: Callable[[int, dict], None]
                  ) -> dict[int, dict]:
    """Run and write the shards ``todo``; their manifest entries by index."""
    entries, bs, n_aux = {}, job.batch_size, len(job.aux_ids)
    for s in todo:
        chunk = job.plan.rows[job.plan.span(s)]
        shard_rows_out = []
        for i in range(0, len(chunk), bs):  # batches stay inside the shard: resume-stable bytes
            shard_rows_out += _run_batch(eng, chunk[i : i + bs], job.request, n_aux, job.L, job.pad_id)
            bar.update(min(bs, len(chunk) - i))
        data, _, tokens = store.encode_shard(shard_rows_out)
        atomic.write_bytes(out / store.shard_name(s), data)  # whole or absent: a kill never leaves half
        entries[s] = {"file": store.shard_name(s), "rows": len(chunk), "tokens": tokens, "bytes": len(data)}
        on_shard(s, entries[s])
    return entries


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
