"""``draftsmith doctor CKPT [--target T] [--engine vllm|sglang]``: catch "good training, bad serving".

Every check reads config.json files, safetensors headers and the small vocab-map tensors; nothing
loads a model. Each finding is one line naming the key, what was found, what is expected and the
fix. Without ``--target`` the target facts come from the checkpoint's ``meta.json`` (``target_info``)
when there is one.

Checked: the engine can load this draft type and its required keys are present; weight shapes
agree with the config (fc width = n_aux * target_hidden, lm_head rows = draft_vocab_size); d2t/t2d
agree with each other and with the target vocab; aux layer ids are distinct and in range for the
target (vLLM ids 0..L; DFlash ``target_layer_ids`` index layer outputs 0..L-1), and when an EAGLE
config has none (NeMo AutoModel writes none), which ids the engines default to and whether that is
what the checkpoint was trained on; the mask
token (P-EAGLE, DFlash) is set, inside the embedding and not the target's pad/eos/bos; hidden sizes,
vocab size and rope settings match the target; K (num_depths, block_size) is sensible.
The target's architecture (``--target``): whether the installed vLLM serves this draft's family on it natively,
only through its Transformers backend (a problem unless ``--transformers-backend``), or not at all, and whether
transformers knows it; one that cannot work at all is one line and exit 2 (serve/preflight.py). Per-layer-type
``rope_parameters`` (Gemma 3) are read as full attention's, which is what the draft uses (a note says so).
What serve and export fix in their copy (a config that declares more layers than the weights hold)
is reported as a ``fixup:`` note, not a problem.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from draftsmith.weights import read_tensors

from draftsmith.drafts import Family, get_family
from draftsmith.drafts.family import lookup

from .resolve import Draft, ServeError, family_weight_problems, servable_config, weight_shapes

MAX_K = 16  # beyond this the verify cost outgrows any realistic acceptance


@dataclass
class TargetFacts:
    """What doctor needs to know about the target (from its config.json or the checkpoint's meta.json)."""

    num_layers: int
    hidden_size: int
    vocab_size: int
    rope_theta: Optional[float] = None
    rope_scaling: Optional[dict] = None
    special_ids: dict = None  # name -> id (pad, eos, bos)
    source: str = ""
    rope_note: Optional[str] = None  # which of per-layer-type rope_parameters the draft is held to


def rope_parameters(config: dict) -> tuple[dict, Optional[str]]:
    """A config's transformers-5 ``rope_parameters`` as one dict, and a note when it had one per layer type.

    Gemma 3 style targets keep one dict per attention type (``{"full_attention": {...}, "sliding_attention":
    {...}}``); a draft has full attention only, so full attention's parameters are the ones it must match (what
    the draft config is built from, targets/hf.py)."""
    params = config.get("rope_parameters") or {}
    if not (isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values())):
        return (params if isinstance(params, dict) else {}), None
    kind = "full_attention" if "full_attention" in params else next(iter(params))
    chosen = params[kind]
    note = (f"target rope_parameters has one set per layer type ({', '.join(params)}); the draft uses {kind}'s "
            f"(rope_theta {chosen.get('rope_theta')}, rope_type {chosen.get('rope_type', 'default')})")
    return chosen, note


def _rope(config: dict) -> tuple[Optional[float], Optional[dict]]:
    """(rope_theta, rope_scaling) from a config in either the transformers 4 or 5 style."""
    params, _ = rope_parameters(config)
    theta = config.get("rope_theta")
    theta = theta if theta is not None else params.get("rope_theta")
    scaling = config.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return (float(theta) if theta is not None else None), (scaling or None)


def _ids(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, list) else [value])]


def target_facts(target: Optional[str], draft: Draft) -> Optional[TargetFacts]:
    """Read the target from ``--target`` (a dir or ``smollm2``), else from the checkpoint's meta.json."""
    if target:
        from draftsmith.models import resolve_target

        path = Path(resolve_target(target))
        cfg = json.loads((path / "config.json").read_text())
        cfg = cfg.get("text_config", cfg)
        specials = {k: _ids(cfg.get(f"{k}_token_id")) for k in ("pad", "eos", "bos")}
        gen = path / "generation_config.json"
        if gen.is_file():
            g = json.loads(gen.read_text())
            for k in specials:
                specials[k] = sorted(set(specials[k]) | set(_ids(g.get(f"{k}_token_id"))))
        theta, scaling = _rope(cfg)
        return TargetFacts(cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"], theta, scaling,
                           specials, str(path), rope_parameters(cfg)[1])
    root = draft.checkpoint_root()
    if root is not None and (root / "meta.json").is_file():
        info = json.loads((root / "meta.json").read_text()).get("target_info")
        if info:
            return TargetFacts(info["num_layers"], info["hidden_size"], info["vocab_size"], info.get("rope_theta"),
                               info.get("rope_scaling"), {}, str(root / "meta.json"))
    return None


def _shape(shapes: dict, name: str) -> Optional[tuple]:
    return shapes.get(name, shapes.get("model." + name))


def check_engine(draft: Draft, engine: str) -> list[str]:
    from .sglang import sglang_config
    from .vllm import vllm_config

    try:  # the config serve hands the engine (fixups applied), not the source's
        (sglang_config if engine == "sglang" else vllm_config)(servable_config(draft)[0])
    except ServeError as e:
        return [f"engine {engine}: {e}"]
    return []


def _fam(family: str) -> Family:
    return get_family(family)


def check_keys(cfg: dict, family: str) -> list[str]:
    out = []
    for key in _fam(family).required_keys:
        if cfg.get(key) is None:
            out.append(f"config.json: '{key}' is missing; re-export the draft (draftsmith writes it) or add it by hand")
    if _fam(family).doctor_checks:
        out += _fam(family).doctor_checks(cfg)
    return out


def check_default_aux(draft: Draft, shapes: dict, tgt: Optional[TargetFacts]) -> tuple[list[str], list[str]]:
    """An EAGLE-family config without ``eagle_aux_hidden_state_layer_ids`` (NeMo AutoModel writes none)
    -> (problems, notes). vLLM and SGLang then read their default (2, L//2, L-3) of the target;
    AutoModel's default HF-hook ids [1, L/2-1, L-4] (output of decoder layer j) are engine ids j+1 =
    [2, L/2, L-3], the same layers. A problem only when the checkpoint's meta.json says it was
    trained on other ids."""
    from draftsmith.targets.contract import engine_default_aux_layer_ids

    cfg = draft.config
    if not draft.described.reads_default_layer_ids or (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") \
            or cfg.get("eagle_aux_hidden_state_layer_ids"):
        return [], []
    key = "config.json: eagle_config.eagle_aux_hidden_state_layer_ids is absent"
    if tgt is None:
        return [], [f"{key}: vLLM and SGLang use their default (2, L//2, L-3) of the target, NeMo AutoModel's "
                    "default too; pass --target to see the ids"]
    L = tgt.num_layers
    engine_ids = engine_default_aux_layer_ids(L)
    automodel = sorted({1, L // 2 - 1, L - 4})  # AutoModel's HF-hook ids; engine id = hook id + 1
    same = [i + 1 for i in automodel] == engine_ids
    root = draft.checkpoint_root()
    trained = None
    if root is not None and (root / "meta.json").is_file():
        trained = json.loads((root / "meta.json").read_text()).get("aux_layer_ids")
    fc, ht = _shape(shapes, "fc.weight"), cfg.get("target_hidden_size") or cfg.get("hidden_size")
    n_aux = int(fc[1]) // int(ht) if fc is not None and ht else len(engine_ids)
    if n_aux != len(engine_ids):  # tiny targets: (2, L//2, L-3) deduplicated has fewer than 3 ids
        return [f"{key} and vLLM would read {engine_ids} (its default for a {L}-layer target, deduplicated), "
                f"{len(engine_ids)} states where the draft's fc reads {n_aux}; write the ids the draft was trained "
                "on into eagle_config.eagle_aux_hidden_state_layer_ids"], []
    if trained is not None and [int(i) for i in trained] != engine_ids:
        return [f"{key} and vLLM would read {engine_ids} (its default for a {L}-layer target), but "
                f"{root / 'meta.json'} says the draft was trained on {trained}; write eagle_config."
                f"eagle_aux_hidden_state_layer_ids: {trained} into config.json or re-export the checkpoint"], []
    return [], [f"{key}: vLLM and SGLang will use {engine_ids} (their default (2, L//2, L-3) for this {L}-layer "
                f"target), which {'equals' if same else 'differs from'} NeMo AutoModel's default (HF-hook ids "
                f"{automodel} = engine ids {[i + 1 for i in automodel]})"]


def check_weights(cfg: dict, family: str, shapes: dict) -> list[str]:
    if not _fam(family).owns_head:  # block drafts: no fc/lm_head of their own to check against config.json
        return []
    out = []
    h, ht = cfg.get("hidden_size"), cfg.get("target_hidden_size") or cfg.get("hidden_size")
    n_aux = len((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or []) or 3
    for name, want in (("fc.weight", (h, n_aux * ht)), ("lm_head.weight", (cfg.get("draft_vocab_size"), h))):
        got = _shape(shapes, name)
        if got is None:
            out.append(f"weights: '{name}' is missing; the checkpoint is not an EAGLE-3 draft or was saved incompletely")
        elif None not in want and tuple(got) != want:
            out.append(f"weights: '{name}' has shape {list(got)} but config.json implies {list(want)} "
                       f"(hidden {h}, {n_aux} aux x target_hidden {ht}, draft_vocab {cfg.get('draft_vocab_size')}); "
                       "fix config.json to match the weights")
    if _shape(shapes, "layers.0.self_attn.q_proj.weight") is None and _shape(shapes, "midlayer.self_attn.q_proj.weight") is None:
        out.append("weights: no 'layers.0.self_attn.q_proj.weight' (or midlayer.*); the draft layer is missing")
    return out


def check_vocab_map(draft: Draft, cfg: dict, shapes: dict, tgt: Optional[TargetFacts]) -> list[str]:
    vocab, vd = cfg.get("vocab_size"), cfg.get("draft_vocab_size")
    out = []
    if tgt is not None and vocab is not None and int(vocab) != tgt.vocab_size:
        out.append(f"config.json: vocab_size {vocab} != target vocab {tgt.vocab_size} ({tgt.source}); the draft was "
                   "trained for another tokenizer: retrain for this target")
    if vd is None or vocab is None or int(vd) >= int(vocab) or draft.described.borrows_lm_head:
        return out
    if _shape(shapes, "d2t") is None:
        return out + [f"weights: draft_vocab_size {vd} < vocab_size {vocab} but there is no 'd2t'; engines would "
                      "read draft ids as target ids: re-export with the vocab map"]
    from .sglang import draft_ids

    targets = draft_ids(draft)
    v = tgt.vocab_size if tgt is not None else int(vocab)
    if targets.numel() != int(vd):
        out.append(f"weights: d2t has {targets.numel()} entries but draft_vocab_size is {vd}; fix config.json")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= v):
        out.append(f"weights: d2t maps draft ids to target ids {int(targets.min())}..{int(targets.max())}, outside "
                   f"0..{v - 1}; d2t must hold target_id - draft_id offsets for this target")
    if targets.unique().numel() != targets.numel():
        out.append("weights: d2t maps two draft ids to the same target id; rebuild the vocab map (sorted unique ids)")
    t2d_shape = _shape(shapes, "t2d")
    if t2d_shape is not None:
        t2d = None
        for f in draft.weight_files:
            if f.suffix == ".safetensors":
                for t in read_tensors(f, ("t2d", "model.t2d")).values():
                    t2d = t.bool()
        if t2d is not None:
            inside = targets[(targets >= 0) & (targets < t2d.numel())]
            named = t2d.new_zeros(t2d.shape)
            named[inside] = True  # the set of target ids d2t names
            if inside.numel() != targets.numel() or not bool((named == t2d).all()):
                out.append(f"weights: t2d marks {int(t2d.sum())} ids but d2t names {targets.numel()} targets "
                           "(not the same set); rebuild both from one draft vocab")
            if tgt is not None and t2d.numel() != tgt.vocab_size:
                out.append(f"weights: t2d has {t2d.numel()} entries but the target vocab is {tgt.vocab_size}")
    return out


def check_layers(cfg: dict, family: str, tgt: Optional[TargetFacts]) -> list[str]:
    if tgt is None:
        return []
    L, fam = tgt.num_layers, _fam(family)
    # on disk: engine ids 0..L shifted by the family's offset (DFlash files index layer outputs: 0..L-1)
    key, lo, hi = fam.layer_ids_key, 0, L + fam.layer_id_offset
    ids = lookup(cfg, key) or []
    out = []
    bad = [i for i in ids if not lo <= int(i) <= hi]
    if bad:
        out.append(f"config.json: {key} {ids} has {bad} outside {lo}..{hi} for a {L}-layer target; "
                   "the draft was trained for a deeper target or with another id convention")
    if len(set(ids)) != len(ids):
        out.append(f"config.json: {key} {ids} repeats a layer; use distinct ids")
    return out


def check_mask(cfg: dict, family: str, tgt: Optional[TargetFacts]) -> list[str]:
    if not _fam(family).needs_mask_token:
        return []
    from draftsmith.drafts.family import mask_token

    m = mask_token(cfg)
    if m is None:
        return ["config.json: no mask token (mask_token_id / dflash_config.mask_token_id); set the reserved id the "
                "draft was trained with"]
    v = tgt.vocab_size if tgt is not None else cfg.get("vocab_size")
    out = []
    if v is not None and not 0 <= m < int(v):
        out.append(f"config.json: mask token {m} is outside the embedding (0..{int(v) - 1}); pick a reserved id "
                   "inside the target vocab")
    for name, ids in ((tgt.special_ids or {}) if tgt is not None else {}).items():
        if m in ids:
            out.append(f"config.json: mask token {m} is the target's {name} token; use a reserved, otherwise unused "
                       "id (e.g. an unused added token) and retrain")
    return out


def check_sizes(cfg: dict, family: str, shapes: dict, tgt: Optional[TargetFacts]) -> list[str]:
    if tgt is None:
        return []
    out = []
    th = cfg.get("target_hidden_size") or cfg.get("hidden_size")
    if th is not None and int(th) != tgt.hidden_size:
        out.append(f"config.json: target_hidden_size {th} != target hidden_size {tgt.hidden_size}; the draft belongs "
                   "to another target")
    shares_embed = _fam(family).borrows_lm_head or _shape(shapes, "embed_tokens.weight") is None
    if shares_embed and cfg.get("hidden_size") not in (None, tgt.hidden_size):
        out.append(f"config.json: hidden_size {cfg['hidden_size']} != target {tgt.hidden_size}, but the draft has no "
                   "embed_tokens and would share the target's; save embed_tokens or match the hidden size")
    theta, scaling = _rope(cfg)
    if tgt.rope_theta is not None and theta is not None and abs(theta - tgt.rope_theta) > 1e-6 * tgt.rope_theta:
        out.append(f"config.json: rope_theta {theta:g} != target rope_theta {tgt.rope_theta:g}; positions would "
                   "rotate differently than in training: set the target's value (and retrain if trained so)")
    t_type = (tgt.rope_scaling or {}).get("rope_type", (tgt.rope_scaling or {}).get("type"))
    d_type = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if t_type != d_type:
        out.append(f"config.json: rope scaling {d_type or 'none'} != target's {t_type or 'none'}; copy the target's "
                   "rope_scaling into the draft config")
    return out


def check_k(cfg: dict, family: str) -> list[str]:
    """K from config.json within 1..MAX_K, as the family's ``serve_k`` reads it (P-EAGLE num_depths,
    required; DFlash block_size, K = block_size - 1, when set)."""
    rule = _fam(family).serve_k
    if rule is None:
        return []
    value = next((lookup(cfg, k) for k in rule.keys if lookup(cfg, k) is not None), None)
    if value is None and not rule.required:
        return []
    if value is None or not 1 <= int(value) + rule.offset <= MAX_K:
        name = rule.keys[0].split(".")[-1]
        return [f"config.json: {name} {value} must be in {1 - rule.offset}..{MAX_K - rule.offset} ({rule.why})"]
    return []


def check_serving(draft: Draft, target: Optional[str], k: Optional[int],
                  max_model_len: Optional[int]) -> tuple[list[str], list[str]]:
    """K and context against what the draft was trained for (serve/limits.py) -> (problems, notes): K past
    the family's bound is a problem (serve refuses it), K past the trained depth and a context longer than
    the training data.max_length are warnings; the trained max_length is always noted where recorded."""
    from draftsmith.layout import training_max_length

    from .limits import check_k_bound, context_warnings, k_warnings

    problems, notes = [], []
    try:
        check_k_bound(draft.config, k, flag="-k")
    except ServeError as e:
        problems.append(str(e))
    notes += k_warnings(draft.config, k)
    trained = training_max_length(draft.dir)
    if trained is not None:
        notes.append(f"trained on rows of at most {trained} tokens (data.max_length): serve with --max-model-len "
                     f"{trained} or less for the acceptance it was trained for")
    if target is not None or max_model_len is not None:
        notes += context_warnings(draft, target or "", max_model_len)
    return problems, notes


def diagnose(draft: Draft, *, target: Optional[str] = None, engine: str = "vllm", k: Optional[int] = None,
             max_model_len: Optional[int] = None, transformers_backend: bool = False) -> tuple[list[str], list[str]]:
    """Return (problems, notes) for ``draft``; no problems means it should serve on ``engine``.
    ``k`` / ``max_model_len``: the K and context it will be served with (checked against its training);
    ``transformers_backend``: it will be served through vLLM's Transformers backend (serve vllm's flag).
    A target the engine cannot run at all (its architecture) is a ServeError: one line, exit 2."""
    if draft.is_hub:
        raise ServeError(f"doctor: '{draft.source}' is a hub id; download it and pass the local directory")
    arch_problems, arch_notes = [], []
    if target:
        from draftsmith.models import resolve_target

        from .preflight import doctor_architecture

        arch_problems, arch_notes = doctor_architecture(draft, resolve_target(target), engine, transformers_backend)
    tgt = target_facts(target, draft)
    notes = [f"draft {draft.dir} ({draft.family}, {draft.layout})",
             f"target facts from {tgt.source}" if tgt else "no target facts (pass --target): range checks skipped",
             *arch_notes, *([tgt.rope_note] if tgt is not None and tgt.rope_note else [])]
    cfg, family = draft.config, draft.family
    shapes = weight_shapes(draft)
    problems = arch_problems + check_engine(draft, engine) + check_keys(cfg, family) + check_weights(cfg, family, shapes)
    problems += check_vocab_map(draft, cfg, shapes, tgt) + check_layers(cfg, family, tgt)
    problems += check_mask(cfg, family, tgt) + check_sizes(cfg, family, shapes, tgt) + check_k(cfg, family)
    # the weights of one EAGLE family under the other's config (what export and serve refuse)
    problems += [f"weights: {p}" for p in family_weight_problems(draft)]
    aux_problems, aux_notes = check_default_aux(draft, shapes, tgt)
    problems += aux_problems
    # what serve and export change in their copy (the source stays as it is): fixups, not problems
    notes += aux_notes + [f"fixup: {f}" for f in servable_config(draft)[1]]
    target_dir = None
    if target:
        from draftsmith.models import resolve_target

        target_dir = resolve_target(target)
    serve_problems, serve_notes = check_serving(draft, target_dir, k, max_model_len)
    return problems + serve_problems, notes + serve_notes


__all__ = ["diagnose", "target_facts", "TargetFacts", "rope_parameters"]
