"""Find the servable draft inside whatever path a user hands to ``serve`` / ``export`` / ``doctor``.

Accepted: a checkpoint dir (``epoch_<E>_step_<S>``), its ``model/``, ``model/consolidated/``, a
bare ``consolidated/``, a plain HF model dir, a run dir or ``checkpoints/`` root (followed through
``BEST`` when train.keep_best wrote one, else ``LATEST``), or a hub id (``org/name``), which is passed through untouched. The first candidate
holding ``config.json`` plus a weight file (``model.safetensors``, a sharded
``model.safetensors.index.json``, or ``pytorch_model.bin``) wins.

Reading what a draft is never loads tensors: safetensors headers and shard indexes are parsed as
JSON (the format is an 8-byte little-endian header length followed by a JSON header); only a
``pytorch_model.bin`` needs ``torch.load`` to list its names.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from draftsmith.drafts import Family, family_of_config, get_family
from draftsmith.drafts import held_layers as layers_in
from draftsmith.drafts import layer_count_fixup as config_layer_fixup
from draftsmith.drafts.family import lookup
from draftsmith.layout import best_checkpoint, latest_checkpoint
from draftsmith.weights import DamagedFile, read_tensors, safetensors_layout

SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
# Files an engine or tokenizer needs next to the weights; copied into every export.
TOKENIZER_ASSETS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ServeError(ValueError):
    """A draft that cannot be served or exported as asked: a path with no draft in it, weights that do not
    fit config.json, a family or K the engine does not serve. Fix: the message names the file or flag and
    what works instead (another K, ``--to``, engine or family)."""


class EngineMissing(ServeError):
    """The inference engine (vLLM, SGLang) or a library a step needs is not importable in this Python.
    Fix: install it with the command the message gives, or use ``--print-only`` to see the command."""


@dataclass
class Draft:
    """A resolved draft: where it lives, its config, its weight files and what kind of draft it is."""

    source: str  # what the user passed
    dir: Optional[Path] = None  # None for a hub id
    config: dict = field(default_factory=dict)
    layout: str = "hub"  # "safetensors" | "sharded" | "bin" | "sharded-bin" | "hub"
    weight_files: list[Path] = field(default_factory=list)  # every file a fingerprint must cover
    index: Optional[dict] = None  # parsed shard index (sharded layouts)

    @property
    def is_hub(self) -> bool:
        return self.dir is None

    @property
    def family(self) -> str:
        """The registered family its config.json describes (drafts.family_of_config; a hub id's empty
        config is the registry's fallback family)."""
        return draft_family(self.config)

    @property
    def described(self) -> Family:
        """The family's description (what serve, export and doctor ask)."""
        return get_family(self.family)

    @property
    def config_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "config.json"

    def checkpoint_root(self) -> Optional[Path]:
        """The ``epoch_*`` dir above ``model/consolidated/`` (holds vocab.safetensors, meta.json), if any."""
        if self.dir is None:
            return None
        for up in (self.dir, self.dir.parent, self.dir.parent.parent):
            if (up / "meta.json").is_file() or (up / "vocab.safetensors").is_file():
                return up
        return None


def draft_family(config: dict) -> str:
    """The registered family a config.json describes (the registry's classification)."""
    return family_of_config(config)


def family_of(config: dict) -> Family:
    """The description of the family a config.json describes."""
    return get_family(family_of_config(config))


def reject_unservable(config: dict, source: Optional[str] = None) -> None:
    """A family no engine serves (its ``serve_refusal``; Domino: vLLM 0.32 and SGLang have no model for
    its GRU correction head): a :class:`ServeError` (exit 2) that says what does work. ``source``:
    the path the user gave, quoted in the eval command."""
    refusal = family_of(config).refusal(config, source)  # the family's, or a variant's it recognises (DFlash 2)
    if refusal:
        raise ServeError(refusal)



def _weight_layout(d: Path) -> Optional[tuple[str, list[Path], Optional[dict]]]:
    """The weight files in ``d`` (layout, files incl. the index, parsed index) or None."""
    for index_name, layout in ((SAFETENSORS_INDEX, "sharded"), (TORCH_BIN_INDEX, "sharded-bin")):
        idx_path = d / index_name
        if idx_path.is_file():
            try:
                index = json.loads(idx_path.read_text())
                shards = sorted(set(index["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as e:
                raise ServeError(f"{idx_path}: unreadable shard index ({type(e).__name__}); "
                                 "it must be JSON with a 'weight_map' of tensor name -> shard file") from None
            missing = [s for s in shards if not (d / s).is_file()]
            if missing:
                raise ServeError(f"{idx_path} lists shard(s) {', '.join(missing)} that are missing from {d}; "
                                 "copy the complete checkpoint")
            return layout, [idx_path] + [d / s for s in shards], index
    if (d / SAFETENSORS).is_file():
        return "safetensors", [d / SAFETENSORS], None
    if (d / TORCH_BIN).is_file():
        return "bin", [d / TORCH_BIN], None
    return None


def candidates(path: Path) -> list[Path]:
    """Directories tried, in order, for a user path."""
    out = [path, path / "consolidated", path / "model" / "consolidated", path / "model"]
    # a run dir or checkpoints/ root: its BEST checkpoint (train.keep_best) before LATEST (layout.py)
    for root in (path, path / "checkpoints"):
        for target in (best_checkpoint(root), latest_checkpoint(root)):
            if target is not None:
                out += [target / "model" / "consolidated", target / "model"]
    return out


def resolve_draft(spec: str | os.PathLike) -> Draft:
    """Resolve ``spec`` to a :class:`Draft` (see the module docstring for what is accepted)."""
    text = os.fspath(spec)
    path = Path(text).expanduser()
    if not path.exists():
        if HUB_ID.match(text) and not text.startswith((".", "/", "~")):
            return Draft(source=text)
        raise ServeError(f"--draft: '{text}' does not exist and is not a hub id (org/name); pass a checkpoint dir "
                         "(epoch_*_step_*), its model/ or model/consolidated/, or a HF model dir")
    if not path.is_dir():
        raise ServeError(f"--draft: '{text}' is a file; pass the directory that holds config.json and the weights")
    for cand in candidates(path):
        if not (cand / "config.json").is_file():
            continue
        found = _weight_layout(cand)
        if found is None:
            continue
        layout, files, index = found
        try:
            config = json.loads((cand / "config.json").read_text())
        except json.JSONDecodeError as e:
            raise ServeError(f"{cand / 'config.json'}: not valid JSON ({e.msg} at line {e.lineno}); "
                             "fix or re-export the draft config") from None
        return Draft(source=text, dir=cand.resolve(), config=config, layout=layout, weight_files=files, index=index)
    tried = ", ".join(str(c) for c in candidates(path)[:4])
    raise ServeError(f"--draft: no draft under '{text}' (tried {tried}); each needs config.json plus "
                     f"{SAFETENSORS}, {SAFETENSORS_INDEX} + shards, or {TORCH_BIN}")


def safetensors_header(path: Path) -> dict:
    """Tensor name -> {dtype, shape, data_offsets} from a safetensors file, without reading tensors
    (weights.safetensors_layout: header parsed, size checked against it), or a one-line ServeError."""
    try:
        return safetensors_layout(path)[0]
    except DamagedFile as e:
        raise ServeError(f"{path}: {e}; re-export the draft or use another checkpoint") from None


def weight_shapes(draft: Draft) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over all weight files (``pytorch_model.bin`` is loaded with torch)."""
    assert draft.dir is not None
    shapes: dict[str, tuple[int, ...]] = {}
    for f in draft.weight_files:
        if f.name.endswith(".json"):
            continue
        if f.suffix == ".safetensors":
            shapes.update({k: tuple(v["shape"]) for k, v in safetensors_header(f).items()})
        else:
            state = read_tensors(f)
            shapes.update({k: tuple(v.shape) for k, v in state.items()})
    return shapes


def weight_names(draft: Draft) -> list[str]:
    """All tensor names of the draft (from the shard index when there is one)."""
    if draft.index is not None:
        return sorted(draft.index["weight_map"])
    return sorted(weight_shapes(draft))


def held_layers(draft: Draft) -> set[int]:
    """Decoder-layer indices an EAGLE-family draft's weights hold (tensor names only)."""
    return layers_in(weight_names(draft))


def layer_count_fixup(draft: Draft) -> Optional[tuple[int, int]]:
    """(declared, held) when config.json declares more decoder layers than the weights hold
    (:func:`draftsmith.drafts.layer_count_fixup`: NeMo AutoModel's checkpoints); None otherwise."""
    if draft.is_hub:
        return None
    return config_layer_fixup(draft.config, weight_names(draft))


def aux_ids_key(config: dict) -> str:
    """Where config.json lists the target layers the draft reads (the key vLLM reads for its family)."""
    return family_of(config).layer_ids_key


def aux_order_fixup(config: dict) -> Optional[tuple[str, list[int], list[int]]]:
    """(key, ids as listed, ascending) when config.json lists its aux layer ids out of ascending order
    (drafts trained before draftsmith sorted them); None otherwise.

    vLLM 0.32 sorts the ids (``EagleModelMixin._set_aux_hidden_state_layers``:
    ``tuple(sorted(set(layers)))``, for EAGLE-3, P-EAGLE and DFlash alike) and SGLang captures them in
    layer order, so both hand fc the states in ascending order while the draft learned the listed
    order. Repeated ids are left to doctor (its layer check names them): no order fixes those."""
    key = aux_ids_key(config)
    ids = lookup(config, key)  # "eagle_config.<ids>", "dflash_config.target_layer_ids" or a top-level key
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids) or len(set(ids)) != len(ids):
        return None
    return None if ids == sorted(ids) else (key, list(ids), sorted(ids))


# Weights whose last dim is the n concatenated aux states, block i = the i-th listed id (``model.`` or not):
# fc (H, n*Ht), norm_before_fc's input_norm (n*Ht,) and P-EAGLE's mask_hidden (1, 1, n*Ht), which
# stands in for the concatenated states. fc_norm.{i} (EAGLE-3.1) is the norm of block i.
AUX_BLOCK_WEIGHTS = ("fc.weight", "input_norm.weight", "mask_hidden")
FC_NORM = re.compile(r"^((?:model\.)?fc_norm\.)(\d+)(\..+)$")


def reorder_aux_blocks(state: dict, order: list[int], src: object = "weights") -> dict:
    """``state`` with the aux blocks reordered: served block j is trained block ``order[j]``, so fc applied
    to the states in the served order equals the trained fc applied to them in the trained order."""
    n, out = len(order), {}
    for name, t in state.items():
        if name.removeprefix("model.") in AUX_BLOCK_WEIGHTS:
            if t.shape[-1] % n:
                raise ServeError(f"{src}: {name} has last dim {t.shape[-1]}, not {n} aux blocks of equal width; "
                                 f"its config.json lists {n} aux layer ids: fix the ids or re-export the draft")
            out[name] = t.unflatten(-1, (n, t.shape[-1] // n))[..., order, :].flatten(-2)
        elif (m := FC_NORM.match(name)) and int(m.group(2)) < n:
            out[f"{m.group(1)}{order.index(int(m.group(2)))}{m.group(3)}"] = t
        else:
            out[name] = t
    return out


def servable_weights(draft: Draft) -> Optional[Callable[[dict, object], dict]]:
    """The tensor fixup matching :func:`servable_config`'s config fixups, as ``(state, source) -> state``
    for one weight file (or shard), or None when the weights are served as they are. Today: the aux
    blocks of :func:`aux_order_fixup`, reordered to the ascending ids the served config lists."""
    fix = None if draft.is_hub else aux_order_fixup(draft.config)
    if fix is None:
        return None
    _, listed, ascending = fix
    order = [listed.index(i) for i in ascending]
    return lambda state, src: reorder_aux_blocks(state, order, src)


def servable_config(draft: Draft) -> tuple[dict, list[str]]:
    """``draft.config`` with the fixups that depend on its weights (a new dict; the source is never
    modified), and one note per fixup. Today: the layer count of :func:`layer_count_fixup` and the aux
    layer order of :func:`aux_order_fixup` (whose weights :func:`servable_weights` reorders in every copy)."""
    config = json.loads(json.dumps(draft.config))  # deep copy
    notes = []
    order = aux_order_fixup(config)
    if order is not None:
        from draftsmith.targets.contract import ENGINE_ORDER_WHY  # (imports torch: only when it is needed)

        key, listed, ascending = order
        *sections, name = key.split(".")
        holder = config
        for section in sections:
            holder = holder[section]
        holder[name] = ascending
        notes.append(f"{key} {listed} -> {ascending} in the served copy, with fc's input blocks reordered to match "
                     f"({ENGINE_ORDER_WHY}; the draft was trained on the listed order); {draft.config_path} is left "
                     "as it is")
    fix = layer_count_fixup(draft)
    if fix is not None:
        declared, held = fix
        config["num_hidden_layers"] = held
        if "num_draft_layers" in config:  # P-EAGLE configs that spell the depth out as well
            config["num_draft_layers"] = held
        notes.append(f"num_hidden_layers {declared} -> {held} in the served copy: the weights hold "
                     f"{held} layer(s) (NeMo AutoModel writes the target's layer count; vLLM would build {declared} "
                     f"layers and run {declared - held} of them uninitialised); {draft.config_path} is left as it is")
    return config, notes


def family_weight_problems(draft: Draft) -> list[str]:
    """EAGLE-family weights that config.json describes as the other family, one line each.

    config.json alone picks the family (and so vLLM's mode and K), and every copy is a plain
    rename, so a P-EAGLE checkpoint whose config lost ``parallel_drafting`` would be served as a
    multi-layer chain draft, and an EAGLE-3 checkpoint labelled P-EAGLE would reach vLLM without
    ``mask_hidden``. Checked from tensor names only (``model.`` prefix or not): ``mask_hidden`` and
    the count of ``layers.{i}`` must match the family and ``num_hidden_layers``. A config that only
    declares more layers than the weights hold is a fixup (:func:`layer_count_fixup`), not a problem.
    """
    fam = draft.described
    if draft.is_hub or not fam.owns_head:
        return []
    names = {n.removeprefix("model.") for n in weight_names(draft)}
    where = f"config.json describes {fam.article} {fam.short} draft"
    out = [rule.problem.format(where=where) for rule in fam.weight_rules if (rule.name in names) != rule.present]
    layers = held_layers(draft)
    want = draft.config.get("num_hidden_layers")
    if layers and want is not None and layers != set(range(int(want))) and layer_count_fixup(draft) is None:
        out.append(f"{where} with num_hidden_layers {want} but its weights hold layers {sorted(layers)}; "
                   "set num_hidden_layers to the number of layers trained (P-EAGLE: num_draft_layers, "
                   "EAGLE-3: 1), or pass the checkpoint you meant")
    return out


def check_family_weights(draft: Draft) -> None:
    """Refuse (one-line ServeError) what :func:`family_weight_problems` finds, before anything is written."""
    problems = family_weight_problems(draft)
    if problems:
        raise ServeError(f"{draft.dir}: {problems[0]}")


__all__ = ["Draft", "ServeError", "check_family_weights", "family_weight_problems", "held_layers",
           "layer_count_fixup", "servable_config", "servable_weights", "aux_order_fixup", "reorder_aux_blocks",
           "EngineMissing", "resolve_draft", "draft_family", "family_of", "reject_unservable",
           "safetensors_header", "weight_shapes", "weight_names", "TOKENIZER_ASSETS"]
