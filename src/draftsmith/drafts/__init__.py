"""Draft families: model math only (no I/O, no engines), and the registry of families.

:data:`FAMILIES` maps a family name (``draft.type``) to the module that implements it; modules are
imported lazily by :func:`get_family`, so importing this package stays torch-free. ``train/`` joins a
family to the engines: a family names the supervision kind it learns from by string (a key of
``targets.contract.SUPERVISION``) and never imports ``targets/``.

A family module exports exactly these names (``eagle3.py`` is the reference):

``SUPERVISION: str``
    the supervision kind it trains on (``"eagle3"``: shifted, draft-vocab target probs).
``layer_rule(draft) -> (rule, count)``
    its default target layer ids: a rule of ``targets.contract.LAYER_ID_RULES`` and how many ids
    (None: the rule's own count); ``target.aux_layer_ids`` overrides it. ``draft`` = config.DraftConfig.
``config_from_target(info, draft, *, draft_vocab_size, num_layer_ids, layer_ids=None) -> Config``
    the model config for a target (``info``: TargetInfo's attributes) and the run's ``draft`` section;
    ``layer_ids``: the engine layer ids it will read (DFlash records them in its config).
``config_from_export(config: dict) -> Config``
    the model config from an exported config.json (inverse of ``Model.export_config``).
``Model``
    ``Model(config)`` is an ``nn.Module`` whose ``state_dict()`` is the checkpoint, with
    ``supervised(sup) -> output`` (``output.loss`` carries grad; ``output.sums`` is a dict of
    detached tensors that add up across micro-batches), ``export_config(layer_ids, torch_dtype) -> dict``
    and ``cfg`` (its Config).
``attach_target(model, draft, *, embeddings, head, vocab) -> None``
    take what the draft needs from the target before training: ``embeddings`` (V, H); ``head()``
    returns (lm_head (V, H), final_norm (H,)) and is only called when needed; ``vocab`` has
    ``draft_ids`` (Vd,), ``d2t`` (Vd,) and ``t2d`` (V,).
``load_exported(config, state, target_embeddings, target_lm_head=None) -> Model``
    a model for inference from an export (``state``: on-disk tensor names); ValueError when they do
    not fit. Drafts that borrow the target's lm_head (DFlash) take it here (None: the embeddings). ``layer_ids_from_export(config) -> list[int]``: the target layer ids it was trained on.
``summarize(sums) -> dict``
    metric sums (over any number of micro-batches) -> summary (``step_accuracy``, ``prefix_rate`` and
    ``conditional_acceptance`` lists per drafted position over the loss-mask positions, a target
    outside the draft vocab counted as a miss; ``simulated_tau``, ``positions``, ...; JSON-able).
    ``scalars(summary) -> dict[str, float]``: what tensorboard logs;
    ``PROGRESS: dict[str, str]``: progress-bar label -> scalars key; ``describe(summary) -> str``: one line.

Optional on the Model: ``set_progress(step, total_steps)``, called by the trainer before every
optimizer step and before each held-out evaluation (Domino's loss schedule reads it).
Optional in the module: ``checkpoint_meta(model) -> dict``, JSON-able facts the trainer merges into
the checkpoint's meta.json (DFlash: block_size, mask_token_id, target_layer_ids).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Families that train here: name -> module (imported on first use).
FAMILIES: dict[str, str] = {
    "eagle3": "draftsmith.drafts.eagle3",
    "peagle": "draftsmith.drafts.peagle",
    "dflash": "draftsmith.drafts.dflash",
    "jetspec": "draftsmith.drafts.jetspec",
    "domino": "draftsmith.drafts.domino",
}

# Every family a checkpoint can hold (serve/resolve.py classifies the same way); those not in
# FAMILIES are known but not trainable or loadable here yet.
KNOWN_FAMILIES = ("eagle3", "peagle", "dflash", "jetspec", "domino")
DFLASH_ARCHS = ("Qwen3DFlashDraftModel", "DFlashDraftModel")


class DraftError(ValueError):
    """A draft family or checkpoint this build cannot handle; the message names it and the fix."""


def family_of_config(config: dict) -> str:
    """Classify an exported draft config.json: DFlash family by architecture or ``dflash_config``
    (JetSpec = ``dflash_config.causal``, Domino = ``projector_type: domino``), P-EAGLE by
    ``parallel_drafting``, otherwise EAGLE-3 (``LlamaEagle3DraftModel`` and its aliases)."""
    archs = config.get("architectures") or []
    dflash = config.get("dflash_config")
    if any(a in DFLASH_ARCHS for a in archs) or isinstance(dflash, dict):
        dflash = dflash or {}
        if str(dflash.get("projector_type", "")).lower() == "domino":
            return "domino"
        return "jetspec" if dflash.get("causal") else "dflash"
    if config.get("parallel_drafting"):
        return "peagle"
    return "eagle3"


def held_layers(names) -> set[int]:
    """Decoder-layer indices an EAGLE-family state holds, from tensor names: ``layers.{i}.*``
    (``model.`` prefix or not) and SGLang's ``midlayer.*`` (= layer 0)."""
    names = {str(n).removeprefix("model.") for n in names}
    layers = {int(n.split(".")[1]) for n in names if n.startswith("layers.") and n.split(".")[1].isdigit()}
    return layers | ({0} if any(n.startswith("midlayer.") for n in names) else set())


def layer_count_fixup(config: dict, names) -> tuple[int, int] | None:
    """(declared, held) when an EAGLE-family config.json declares MORE decoder layers than its
    weights (tensor ``names``) hold, layers 0..held-1; None when they agree or for other families.

    NeMo AutoModel's EAGLE-3 recipe builds the draft config from the target's, so config.json carries
    the TARGET's ``num_hidden_layers`` (e.g. 32) over weights that hold ``layers.0`` only. vLLM 0.32
    (``llama_eagle3.py``) builds ``num_hidden_layers`` layers, loads what the weights hold and leaves
    the rest uninitialised without a word (its EAGLE-3 ``load_weights`` returns no loaded-name set,
    so the loader's missing-weight check never runs). The layers the weights hold are the draft.
    """
    if family_of_config(config) not in ("eagle3", "peagle"):
        return None
    layers, want = held_layers(names), config.get("num_hidden_layers")
    if not layers or want is None or layers != set(range(len(layers))) or int(want) <= len(layers):
        return None
    return int(want), len(layers)


def get_family(name: str) -> ModuleType:
    """The module of family ``name``; a known-but-unsupported or unknown name is a one-line DraftError."""
    if name in FAMILIES:
        return importlib.import_module(FAMILIES[name])
    if name in KNOWN_FAMILIES:
        raise DraftError(f"draft family {name!r} is not supported by this draftsmith yet; "
                         f"supported: {', '.join(FAMILIES)}")
    raise DraftError(f"draft family {name!r} is unknown; expected one of {', '.join(FAMILIES)}")
