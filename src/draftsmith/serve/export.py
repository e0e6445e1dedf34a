"""Engine-ready copies of a trained draft: renamed weights, fixed-up config, tokenizer assets.

Why a copy at all: vLLM's EAGLE-3 loader (``vllm/model_executor/models/llama_eagle3.py``, 0.32,
``load_weights``) prepends ``model.`` to every name except ``lm_head``/``d2t``/``mask_hidden``, so the
``model.``-prefixed names draftsmith saves (the NeMo AutoModel layout) would become ``model.model.*``
and be dropped. The copy strips that prefix and keeps ``lm_head.weight``, ``d2t`` (vLLM maps draft id ->
target id as ``id + d2t[id]``), ``mask_hidden`` and ``t2d`` unchanged: vLLM skips ``t2d``, but the
serving contract carries it for other readers (doctor, SGLang's token map, other tools).

Cached exports (``serve``): the copy lives in ``<draft dir>/vllm_export/`` (``sglang_export/`` for
SGLang) with a stamp file holding a fingerprint of every source weight file (name, size, mtime) and
a hash of the source ``config.json`` plus the export options. It is reused while the fingerprint
matches and rebuilt when a weight file is touched or the config changes. Every copy is built in a
hidden sibling directory and swapped in with ``os.replace`` (:mod:`draftsmith.atomic`), so a crash never leaves a half copy
that looks valid. The source is never modified here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from draftsmith import atomic
from draftsmith.weights import read_tensors

from .resolve import (TOKENIZER_ASSETS, Draft, EngineMissing, ServeError, check_family_weights, resolve_draft,
                      servable_config, servable_weights)

VLLM_EAGLE3_ARCH = "LlamaForCausalLMEagle3"
EXPORT_VERSION = 4  # 2: t2d is carried; 3: the layer count the weights hold; 4: aux ids ascending (fc reordered). Bump when the copy format changes so old caches rebuild
STAMP = "draftsmith_export.json"
# On-disk draftsmith name -> vLLM name: only the `model.` prefix changes; top-level tensors keep
# their names (vLLM reads lm_head, d2t, mask_hidden and skips t2d, which is carried for other readers).
TOP_LEVEL_KEYS = ("lm_head.weight", "d2t", "t2d", "mask_hidden")

KeyMap = Callable[[str], Optional[str]]
StateMap = Callable[[dict, Path], dict]  # (tensors of one source file, that file) -> tensors, before the rename


def vllm_key(name: str) -> str | None:
    """Map one draftsmith weight name to vLLM's (every weight is kept)."""
    if name in TOP_LEVEL_KEYS:
        return name
    return name[len("model."):] if name.startswith("model.") else name


def has_wrapper_prefix(names: list[str]) -> bool:
    """True when weights carry the ``model.`` wrapper prefix vLLM would double."""
    return any(n.startswith("model.") for n in names)


def fingerprint(draft: Draft, options: dict) -> str:
    """sha256 over (name, size, mtime_ns) of every source weight file, the config bytes and ``options``."""
    assert draft.dir is not None
    files = []
    for f in draft.weight_files:
        st = f.stat()
        files.append([f.name, st.st_size, st.st_mtime_ns])
    config_sha = hashlib.sha256(draft.config_path.read_bytes()).hexdigest()
    blob = json.dumps({"v": EXPORT_VERSION, "files": files, "config": config_sha, "options": options}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_fresh(out: Path, fp: str) -> bool:
    """True when ``out`` holds a complete export stamped with fingerprint ``fp``."""
    try:
        return json.loads((out / STAMP).read_text()).get("fingerprint") == fp
    except (OSError, json.JSONDecodeError):
        return False


def require_safetensors() -> None:
    """Rewriting weights needs safetensors (and torch); say how to get it instead of a traceback."""
    for mod in ("safetensors", "torch"):
        if importlib.util.find_spec(mod) is None:
            raise EngineMissing(f"renaming the draft's weights needs the '{mod}' package, which is not installed; "
                                f"run `pip install safetensors torch==2.13.0` (or pass a draft without the model. prefix)")


def _save(state: dict, path: Path) -> None:
    from safetensors.torch import save_file

    # safetensors refuses shared or strided storage; drafts are small, so copy.
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, str(path), metadata={"format": "pt"})


def _rename(state: dict, key_map: KeyMap, src: Path) -> dict:
    out = {}
    for name, tensor in state.items():
        new = key_map(name)
        if new is None:
            continue
        if new in out:
            raise ServeError(f"{src}: tensors '{name}' and another both map to '{new}'; the checkpoint holds the same "
                             "weight with and without the model. prefix, keep one")
        out[new] = tensor
    return out


def write_weights(draft: Draft, tmp: Path, key_map: KeyMap, transform: Optional[StateMap] = None) -> None:
    """Write ``draft``'s weights renamed by ``key_map`` into ``tmp`` as safetensors (shards stay shards),
    each file's tensors passed through ``transform`` first (source names; None: as they are)."""
    require_safetensors()
    assert draft.dir is not None

    def read(f: Path) -> dict:
        state = read_tensors(f)
        return transform(state, f) if transform is not None else state

    if draft.index is None:  # one file (safetensors or pytorch_model.bin) -> model.safetensors
        _save(_rename(read(draft.weight_files[0]), key_map, draft.weight_files[0]), tmp / "model.safetensors")
        return
    # Sharded: rename shard by shard; a .bin shard becomes a .safetensors shard of the same stem.
    shard_names: dict[str, str] = {}
    weight_map: dict[str, str] = {}
    total = 0
    for shard in draft.weight_files[1:]:
        new_name = shard.name if shard.suffix == ".safetensors" else shard.stem + ".safetensors"
        shard_names[shard.name] = new_name
        state = _rename(read(shard), key_map, shard)
        _save(state, tmp / new_name)
        total += sum(t.numel() * t.element_size() for t in state.values())
        weight_map.update({k: new_name for k in state})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def copy_tokenizer_assets(src: Path, dst: Path) -> list[str]:
    """Copy tokenizer/generation files that sit next to the draft; return the names copied."""
    copied = []
    for name in TOKENIZER_ASSETS:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def build_copy(draft: Draft, out: Path, *, key_map: KeyMap, config: dict, fp: Optional[str] = None,
               extra: Optional[Callable[[Path], None]] = None) -> Path:
    """Write a complete engine-ready copy of ``draft`` to ``out`` atomically; return ``out``.

    ``config`` is the servable config (:func:`servable_config` plus the engine's renames); the weights
    get the tensor side of the same fixups (:func:`servable_weights`: fc's aux blocks in the order
    that config lists), so every copy, vLLM, SGLang or speculators, is consistent with its config."""
    assert draft.dir is not None
    out = Path(out)
    if out.resolve() == draft.dir:
        raise ServeError(f"export destination '{out}' is the draft itself; pick another directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic.remove_stale_temps(out.parent, f".{out.name}.*.tmp")  # a killed export's half copy
    tmp = atomic.temp_dir_beside(out)
    try:
        write_weights(draft, tmp, key_map, servable_weights(draft))
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        copy_tokenizer_assets(draft.dir, tmp)
        if extra is not None:
            extra(tmp)
        # The stamp goes last: its presence marks a complete copy.
        stamp = {"fingerprint": fp, "source": str(draft.dir), "version": EXPORT_VERSION}
        (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        atomic.swap_dir(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@dataclass
class Prepared:
    """Where an engine should read the draft, and what preparing it did (or, dry, would do)."""

    path: str  # directory (or hub id) handed to the engine
    action: str  # "hub" | "reuse" | "export" | "update-config" | "as-is"
    note: str = ""
    fixups: list[str] = field(default_factory=list)  # config fixups the copy carries (resolve.servable_config)

    def describe(self, dry_run: bool) -> str:
        verb = {"export": ("would export", "exported"), "update-config": ("would fix up", "fixed up")}
        if self.action in verb:
            return f"{verb[self.action][0 if dry_run else 1]} {self.note}".strip()
        return self.note


def prepare_cached(draft: Draft, *, kind: str, key_map: KeyMap, config: dict, options: dict,
                   out: Optional[Path] = None, dry_run: bool = False,
                   extra: Optional[Callable[[Path], None]] = None) -> Prepared:
    """Reuse or (re)build the cached ``<draft dir>/<kind>_export/`` copy; nothing is written when dry."""
    assert draft.dir is not None
    out = Path(out) if out is not None else draft.dir / f"{kind}_export"
    fp = fingerprint(draft, {"kind": kind, **options})
    if is_fresh(out, fp):
        return Prepared(str(out), "reuse", f"reusing {out} (source unchanged since it was exported)")
    why = "stale: a source weight file or config.json changed" if (out / STAMP).exists() else "not built yet"
    if not dry_run:
        build_copy(draft, out, key_map=key_map, config=config, fp=fp, extra=extra)
    return Prepared(str(out), "export", f"{draft.dir} -> {out} ({why})")


def export_draft(src: str | os.PathLike, dst: str | os.PathLike, *, to: str, target: Optional[str] = None,
                 num_speculative_tokens: Optional[int] = None, **flags: bool) -> Path:
    """``draftsmith export --to vllm|sglang|speculators``: a standalone engine-ready copy at ``dst``.

    ``target`` (the target's path or hub id) is required for ``speculators``, which records it (its
    ``verifier`` field) so ``vllm serve <dst>`` needs nothing else; ``num_speculative_tokens`` defaults as in
    ``serve vllm``; ``flags``: the families' serve flags by dest (``dflash_causal``), for vllm and speculators.
    """
    draft = resolve_draft(src)
    if draft.is_hub:
        raise ServeError(f"export: '{src}' is a hub id; download it first (huggingface-cli download {src}) "
                         "and export the local directory")
    check_family_weights(draft)  # a rename would carry mislabelled weights to the engine unnoticed
    config, _ = servable_config(draft)  # the copy's config (the CLI prints its fixups); the source is never modified
    if to == "vllm":
        from .vllm import vllm_config

        return build_copy(draft, Path(dst), key_map=vllm_key, config=vllm_config(config, **flags))
    if to == "sglang":
        from .sglang import sglang_copy_args

        return build_copy(draft, Path(dst), **sglang_copy_args(draft))
    if to == "speculators":
        from .vllm import speculators_config

        if not target:
            raise ServeError("export --to speculators: --target is required (the target path or hub id vLLM "
                             "should load as the target)")
        cfg = speculators_config(config, target=target, k=num_speculative_tokens, **flags)
        return build_copy(draft, Path(dst), key_map=vllm_key, config=cfg)
    raise ServeError(f"export --to {to!r}: expected one of vllm, sglang, speculators")


def export_vllm(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Write a vLLM-loadable copy of the draft in ``src`` (any layout ``serve`` accepts) to ``dst``."""
    return export_draft(src, dst, to="vllm")


__all__ = ["export_draft", "export_vllm", "vllm_key", "has_wrapper_prefix", "fingerprint", "prepare_cached",
           "build_copy", "Prepared", "VLLM_EAGLE3_ARCH", "STAMP"]
