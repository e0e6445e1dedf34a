"""Map a parsed AutoModel recipe onto a draftsmith config mapping (see the package docstring)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from draftsmith.config import SECTIONS, ConfigError, build_config, draft_class

from .keys import (BACKENDS, BLOCK_ONLY, DEFAULTS, DIRECT, EAGLE_ONLY, EAGLE_RECIPE, ENGINE_KEYS, HINTS, HOOK_NOTE,
                   NO_EFFECT, OPTIMIZER, PARALLEL_FAMILY, PARALLEL_SIZES, RECIPE_FAMILIES, scope_ok)

__all__ = ["Line", "RecipeMapping", "is_recipe", "map_recipe", "read_recipe"]


@dataclass
class Line:
    """One printed mapping line: ``source -> dest = value``, or ``source = value -> (no effect: note)``."""

    source: str  # AutoModel key, e.g. recipe_args.seq_length
    dest: Optional[str]  # draftsmith section.key; None: accepted, nothing to set
    value: Any  # the draftsmith value (dest set) or the AutoModel value (dest None)
    note: str = ""
    default: bool = False  # the key is absent: AutoModel's default, written explicitly

    def __str__(self) -> str:
        src = self.source + (" (AutoModel default)" if self.default else "")
        if self.dest is None:
            return f"{src} = {self.value!r} -> (no draftsmith key: {self.note})"
        return f"{src} -> {self.dest} = {self.value!r}" + (f"  [{self.note}]" if self.note else "")


@dataclass
class RecipeMapping:
    """A recipe mapped: ``raw`` is a draftsmith config mapping (sections -> keys) for ``build_config``."""

    source: str
    recipe: str  # the AutoModel recipe class
    family: str  # the draftsmith draft.type
    raw: dict = field(default_factory=dict)
    lines: list[Line] = field(default_factory=list)

    def text(self) -> str:
        head = f"AutoModel recipe {self.source} ({self.recipe}) -> draftsmith draft.type {self.family}:"
        return "\n".join([head, *(f"  {line}" for line in self.lines)])


class _Mapper:
    """Walks one recipe: ``put`` sets a draftsmith key, ``keep`` accepts a key with no effect, ``bad``
    lists an unsupported one; ``problems`` collects every unsupported key before anything raises."""

    def __init__(self, source: str, recipe: str, family: str):
        self.m = RecipeMapping(source, recipe, family)
        self.problems: list[str] = []

    def put(self, source: str, dest: str, value: Any, note: str = "", default: bool = False) -> None:
        sec, key = dest.split(".")
        self.m.raw.setdefault(sec, {})[key] = value
        self.m.lines.append(Line(source, dest, value, note, default))

    def keep(self, source: str, value: Any, note: str) -> None:
        self.m.lines.append(Line(source, None, value, note))

    def bad(self, source: str, value: Any, why: str) -> None:
        self.problems.append(f"AutoModel key {source} = {value!r}: {why}")

    def has(self, dest: str) -> bool:
        """True when this build of draftsmith has ``dest`` (section.key) for the recipe's family."""
        sec, key = dest.split(".")
        cls = draft_class(self.m.family) if sec == "draft" else SECTIONS.get(sec)
        return cls is not None and key in typing.get_type_hints(cls)


def is_recipe(raw: Any) -> bool:
    """True when a parsed YAML mapping is an AutoModel recipe (it has a ``recipe_args`` block)."""
    return isinstance(raw, dict) and "recipe_args" in raw


def _family(raw: dict, source: str) -> tuple[str, str]:
    recipe = raw.get("recipe", EAGLE_RECIPE)
    if not isinstance(recipe, str) or recipe not in RECIPE_FAMILIES:
        raise ConfigError([f"AutoModel key recipe = {recipe!r}: draftsmith trains the recipes "
                           f"{', '.join(RECIPE_FAMILIES)} (EAGLE-3, P-EAGLE via parallel_drafting, DFlash, JetSpec, "
                           f"Domino); convert this one by hand"], source)
    ra = raw.get("recipe_args") or {}
    parallel = recipe == EAGLE_RECIPE and ra.get("parallel_drafting") is True
    return recipe, PARALLEL_FAMILY if parallel else RECIPE_FAMILIES[recipe]


def _data_spec(path: Any, split: Any) -> Any:
    """``train_data_path`` + ``train_split`` -> one data source: a local path whole when the split is null
    or ``train`` (a local file is one train split), else ``path:split`` (the hub-id split syntax)."""
    if split is None or (split == "train" and Path(str(path)).exists()):
        return path
    return f"{path}:{split}"


def _layer_ids(mp: _Mapper, source: str, ids: Any) -> None:
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        mp.bad(source, ids, "expected a list of decoder-layer indices >= 0 (HF-hook ids)")
        return
    mp.put(source, "target.aux_layer_ids", [i + 1 for i in ids], HOOK_NOTE.format(ids=ids))


def _recipe_args(mp: _Mapper, ra: dict, recipe: str, family: str) -> None:
    given = set(ra)
    for key, value in ra.items():
        src = f"recipe_args.{key}"
        if key in DIRECT:
            dest, scope, conv = DIRECT[key]
            if not scope_ok(scope, recipe, family):
                why = ("read only with parallel_drafting: true (P-EAGLE)" if scope == PARALLEL_FAMILY
                       else f"{recipe} does not read it")
                mp.bad(src, value, why + "; remove it")
            elif not mp.has(dest):
                mp.bad(src, value, f"draft.type {family} takes no {dest}; remove it" if dest.startswith("draft.")
                       else f"its draftsmith key {dest} is not in this build")
            else:
                unused = key == "ttt_steps" and family == PARALLEL_FAMILY
                mp.put(src, dest, conv(value) if conv else value,
                       "unused by P-EAGLE, whose K is num_depths (as in AutoModel)" if unused else "")
        elif key in NO_EFFECT and (key not in EAGLE_ONLY or recipe == EAGLE_RECIPE) \
                and (key not in BLOCK_ONLY or recipe != EAGLE_RECIPE):
            ok, note = NO_EFFECT[key]
            if ok is None or value in ok:
                mp.keep(src, value, note)
            else:
                mp.bad(src, value, HINTS.get(key, "no draftsmith equivalent; remove it"))
        elif key in ("train_split", "val_split"):  # printed with their data path's line when they are set
            path = ra.get(key.replace("split", "data_path"))
            if value is None:
                mp.keep(src, value, "the whole source")
            elif path is None:
                mp.bad(src, value, f"given without {key.replace('split', 'data_path')}; remove it")
        elif key == "train_data_path":
            if value is None:
                mp.bad(src, value, "required: a .jsonl file, a directory or a hub dataset id")
            else:
                split = ra.get("train_split")
                mp.put(src + (" + train_split" if split is not None else ""), "data.sources", [_data_spec(value, split)])
        elif key == "val_data_path":
            split = ra.get("val_split")
            if value is not None:  # null: no validation set, written below
                mp.put(src + (" + val_split" if split is not None else ""), "data.eval_sources",
                       [_data_spec(value, split)], "held-out rows from it; data.eval_size ignored")
        elif key in ("aux_layer_ids", "target_layer_ids"):
            if (key == "aux_layer_ids") != (recipe == EAGLE_RECIPE):
                mp.bad(src, value, f"{recipe} does not read it; remove it")
            elif value is not None:
                _layer_ids(mp, src, value)
        elif key == "packed_sequence_size":  # AutoModel packs rows of this length; draftsmith of data.max_length
            if value in (None, 0):
                mp.keep(src, value, "no packing")
            elif value == ra.get("seq_length") and mp.has("data.packing"):
                mp.put(src, "data.packing", True, "packed rows of data.max_length = seq_length")
            else:
                mp.bad(src, value, HINTS[key])
        elif key == "parallel_drafting":
            if recipe != EAGLE_RECIPE or not isinstance(value, bool):
                mp.bad(src, value, f"expected true or false in a {EAGLE_RECIPE}")
            else:
                mp.put(src, "draft.type", family, "P-EAGLE" if value else "EAGLE-3")
        elif key == "target_model_backend" and recipe == EAGLE_RECIPE:
            if value not in BACKENDS:
                mp.bad(src, value, f"expected one of {list(BACKENDS)}")
            else:
                mp.put(src, "target.engine", BACKENDS[value])
        elif key in ("vllm_args", "sglang_args") and recipe == EAGLE_RECIPE:
            if not isinstance(value, dict):
                mp.bad(src, value, "expected a mapping of engine arguments")
            elif ra.get("target_model_backend") != key[:-5]:
                mp.bad(src, value, f"read only with target_model_backend: {key[:-5]}; remove it")
            else:  # AutoModel gives the engine half the GPU unless told otherwise
                kwarg = "gpu_memory_utilization" if key == "vllm_args" else "mem_fraction_static"
                mp.put(src, "target.engine_kwargs", {kwarg: 0.5, **value},
                       f"{kwarg} 0.5 unless given, as AutoModel")
        elif key in ("remote_urls", "remote_url") and recipe == EAGLE_RECIPE:
            urls = value if key == "remote_urls" else ([value] if value else [])
            if key == "remote_url" and ra.get("remote_urls"):
                mp.keep(src, value, "remote_urls wins, as in AutoModel")
            else:
                mp.put(src, "target.remote_urls", urls)
        elif key == "save_checkpoint_every_epoch":
            if not value:
                mp.keep(src, value, "no per-epoch saves")
            elif mp.has("train.save_every_epoch"):
                mp.put(src, "train.save_every_epoch", value)
            else:
                mp.bad(src, value, "per-epoch saves are not in this build; use ckpt_every_steps")
        elif key in ENGINE_KEYS or key in NO_EFFECT or key in DIRECT:
            mp.bad(src, value, f"{recipe} does not read it; remove it")
        else:
            mp.bad(src, value, HINTS.get(key, "no draftsmith equivalent; remove it"))
    if ra.get("target_model_backend") in ("vllm", "sglang") and f"{ra['target_model_backend']}_args" not in given:
        kwarg = "gpu_memory_utilization" if ra["target_model_backend"] == "vllm" else "mem_fraction_static"
        mp.put(f"recipe_args.{ra['target_model_backend']}_args", "target.engine_kwargs", {kwarg: 0.5}, default=True)
    if ra.get("target_model_backend") == "remote":  # AutoModel's remote client: synchronous, 120 s, 3 retries
        for key, dest, value in (("target_prefetch_depth", "target.prefetch_depth", 0),
                                 ("remote_timeout", "target.remote_timeout_s", 120.0),
                                 ("remote_max_retries", "target.remote_retries", 3)):
            if key not in given:
                mp.put(f"recipe_args.{key}", dest, value, default=True)
    if ra.get("val_data_path") is None:
        mp.put("recipe_args.val_data_path", "data.eval_size", 0, "no validation set, as AutoModel without one",
               default="val_data_path" not in given)
    for required in ("target_model_name_or_path", "train_data_path"):
        if required not in given:
            mp.bad(f"recipe_args.{required}", None, "required by AutoModel, and draftsmith takes it from there")


def _optimizer(mp: _Mapper, opt: Any) -> None:
    if not isinstance(opt, dict):
        mp.bad("optimizer", opt, "expected a mapping (lr, betas, weight_decay, warmup_ratio, min_lr_ratio)")
        return
    for key, value in opt.items():
        if key in OPTIMIZER:
            mp.put(f"optimizer.{key}", OPTIMIZER[key], list(value) if key == "betas" and isinstance(value, tuple)
                   else value)
        else:  # AutoModel's speculative recipes build AdamW from these five keys only
            mp.bad(f"optimizer.{key}", value, "AutoModel's speculative recipes read lr, betas, weight_decay, "
                                              "warmup_ratio and min_lr_ratio only; remove it")


def _checkpoint(mp: _Mapper, ck: Any, ra: dict) -> None:
    if not isinstance(ck, dict):
        mp.bad("checkpoint", ck, "expected a mapping")
        return
    out_dir = ra.get("output_dir")
    for key, value in ck.items():
        src = f"checkpoint.{key}"
        if key == "enabled":
            mp.keep(src, value, "draftsmith always saves the final draft" if value is False
                    else "draftsmith saves checkpoints")
        elif key == "model_save_format" and value == "safetensors":
            mp.keep(src, value, "draftsmith saves safetensors")
        elif key == "save_consolidated" and isinstance(value, bool):
            mp.keep(src, value, "draftsmith always saves the consolidated draft (model/consolidated)")
        elif key == "checkpoint_dir":
            path = Path(str(value))
            if out_dir is not None and path == Path(str(out_dir)) / "checkpoints":
                mp.keep(src, value, "= output.dir/checkpoints, where draftsmith saves")
            elif out_dir is None and path.name == "checkpoints":
                mp.put(src, "output.dir", str(path.parent), "draftsmith saves under output.dir/checkpoints")
            else:
                mp.bad(src, value, "draftsmith saves under output_dir/checkpoints; set checkpoint_dir to that "
                                   "or remove it")
        elif key == "restore_from":
            mp.bad(src, value, "pass --resume [CKPT] to draftsmith train instead")
        else:
            mp.bad(src, value, "no draftsmith equivalent (safetensors, consolidated, always on); remove it")


def _distributed(mp: _Mapper, dist: Any) -> None:
    if not isinstance(dist, dict):
        mp.bad("distributed", dist, "expected a mapping")
        return
    for key, value in dist.items():
        src = f"distributed.{key}"
        if key == "strategy":
            if value in ("ddp", "fsdp2"):
                mp.put(src, "train.parallel", value, "draftsmith shards the draft over the ranks (fsdp2) "
                                                     "or replicates it (ddp); the target runs whole per rank")
            else:
                mp.bad(src, value, "expected ddp or fsdp2")
        elif key in PARALLEL_SIZES and value in (None, 1):
            mp.keep(src, value, "one-way: no tensor, context, pipeline or expert parallelism")
        elif key in ("sequence_parallel", "activation_checkpointing") and value in (False, None):
            mp.keep(src, value, "off; they concern the sharded target, which draftsmith does not shard")
        elif key in PARALLEL_SIZES:
            mp.bad(src, value, "draftsmith does not shard the hf target over ranks; target.device_map: auto spreads "
                               "it over one process's GPUs, or use target_model_backend vllm/sglang (target.tp_size) "
                               "or remote serve-target processes")
        else:
            mp.bad(src, value, "no draftsmith equivalent; remove it")


def _wandb(mp: _Mapper, wb: Any) -> None:
    if not isinstance(wb, dict):
        mp.bad("wandb", wb, "expected a mapping (project, name, entity, save_dir)")
        return
    mp.put("wandb", "output.wandb", True, "a wandb section turns W&B logging on, as in AutoModel")
    for key, value in wb.items():
        src = f"wandb.{key}"
        if key in ("project", "name", "mode"):
            mp.put(src, f"output.wandb_{key}", value)
        elif key == "entity":
            mp.keep(src, value, "not a draftsmith key: export WANDB_ENTITY to log under that entity")
        elif key in ("save_dir", "dir"):
            mp.keep(src, value, "not a draftsmith key: export WANDB_DIR to put W&B's files there")
        else:
            mp.bad(src, value, "draftsmith's W&B keys are project, name and mode (output.wandb_*); remove it")


def map_recipe(raw: dict, source: str = "recipe") -> RecipeMapping:
    """Map a parsed AutoModel recipe onto a draftsmith config mapping; a ConfigError lists every key
    without an equivalent (and every value the draftsmith config then refuses), all at once."""
    recipe, family = _family(raw, source)
    mp = _Mapper(source, recipe, family)
    mp.put("recipe", "draft.type", family, "parallel_drafting: true" if family == PARALLEL_FAMILY else "",
           default="recipe" not in raw)
    ra = raw.get("recipe_args")
    if not isinstance(ra, dict):
        raise ConfigError([f"AutoModel key recipe_args = {ra!r}: expected a mapping of recipe arguments"], source)
    _recipe_args(mp, ra, recipe, family)
    for sec, value in raw.items():
        if sec in ("recipe", "recipe_args"):
            continue
        if sec == "optimizer":
            _optimizer(mp, value)
        elif sec == "checkpoint":
            _checkpoint(mp, value, ra)
        elif sec == "distributed":
            _distributed(mp, value)
        elif sec == "dist_env":
            mp.keep(sec, value, "draftsmith's torchrun ranks use nccl on CUDA, gloo on the CPU")
        elif sec == "rng":
            mp.keep(sec, value, "AutoModel's speculative recipes seed from recipe_args.shuffle_seed")
        elif sec == "wandb":
            _wandb(mp, value)
        elif sec in ("fp8", "compile") and isinstance(value, dict) and value.get("enabled") is False:
            mp.keep(sec, value, "off")
        else:
            mp.bad(sec, value if not isinstance(value, dict) else {k: "..." for k in value},
                   HINTS.get(sec, "no draftsmith equivalent; remove the section"))
    given = {line.source for line in mp.m.lines}
    for src, dest, scope, value in DEFAULTS:
        sec, key = src.split(".")
        present = key in (raw.get(sec) or {}) if sec != "recipe_args" else key in ra
        if not present and src not in given and scope_ok(scope, recipe, family) and mp.has(dest):
            mp.put(src, dest, value, default=True)
    if mp.problems:  # with what the draftsmith config refuses in the rest, so one error lists everything
        try:
            build_config(mp.m.raw, source)
        except ConfigError as e:
            mp.problems += [f"mapped: {p}" for p in e.problems]
        raise ConfigError(mp.problems, source)
    return mp.m


def read_recipe(path: str | Path) -> Optional[RecipeMapping]:
    """The mapping of the AutoModel recipe at ``path``, or None when the file is not one (a draftsmith
    config); a ConfigError when it is one draftsmith cannot run."""
    import yaml

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None  # load_config reports a missing file or bad YAML itself
    return map_recipe(raw, str(path)) if is_recipe(raw) else None


