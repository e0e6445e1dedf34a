"""Draft families: model math and inference (no I/O beyond state dicts, no engines), and their registry.

Each family lives in its own folder (``eagle3/``, ``peagle/``, ``dflash/`` with JetSpec and Domino
beside it) and is described by ONE :class:`~draftsmith.drafts.family.Family` (its ``__init__.py``,
torch-free), registered here with one :func:`register` line. config.py, train/, eval/ and serve/
ask that object (``get_family(name)``, or :func:`family_of_config` for an exported config.json)
instead of keeping lists of families; a family added in its own folder (or outside draftsmith,
tests/drafts/toy_family) needs no edit anywhere else. ``train/`` joins a family to the engines: a
family names the supervision kind it learns from by string and brings the kind's code in its folder
(``Family.supervision_module``), which registering the family declares to :mod:`draftsmith.supervision`,
the package below both drafts/ and targets/; drafts/ never imports ``targets/``.

The family contract: a Family's ``api`` module (``eagle3/api.py`` is the reference) declares
``CODE = FamilyCode(...)`` (drafts/family.py) with these entries, which the Family reads
(``get_family("eagle3").Model``); the constructor requires each one, so a family that lacks one fails
when its module is imported:

``layer_rule(draft) -> (rule, count)``
    its default target layer ids: a layer-id rule its supervision module registers (``LAYER_RULES``) and how many ids
    (None: the rule's own count); ``target.aux_layer_ids`` overrides it. ``draft``: its DraftConfig.
``config_from_target(info, draft, *, draft_vocab_size, num_layer_ids, layer_ids=None) -> Config``
    the model config for a target (``info``: TargetInfo's attributes) and the run's ``draft`` section;
    ``layer_ids``: the engine layer ids it will read (DFlash records them in its config).
``config_from_export(config: dict) -> Config``
    the model config from an exported config.json (inverse of ``Model.export_config``).
``Model``
    ``Model(config)`` is an ``nn.Module`` whose ``state_dict()`` is the checkpoint, with
    ``supervised(sup) -> output`` (``output.loss`` carries grad; ``output.sums`` is a dict of
    detached tensors that add up across micro-batches), ``export_config(layer_ids, torch_dtype) -> dict``
    and ``cfg`` (its Config, with ``vocab_size`` and ``target_hidden_size``: the target's vocab and width,
    which the exact evaluator checks against the target it opens).
``Proposer``
    ``Proposer(model)``: its offline proposer (drafts/proposer.py protocol), which the exact evaluator
    (eval/offline.py) and the trainer's real-tau hook drive; ``kind``, ``max_k`` (None = any),
    ``default_k`` (eval without -k), ``trained_k`` (the trainer hook's K), ``k_knob`` (what bounds K).
``attach_target(model, draft, *, embeddings, head, vocab, layer) -> None``
    take what the draft needs from the target before training: ``embeddings`` (V, H); ``head()``
    returns (lm_head (V, H), final_norm (H,)) and is only called when needed; ``vocab`` has
    ``draft_ids`` (Vd,), ``d2t`` (Vd,) and ``t2d`` (V,); ``layer(index)`` returns a target decoder
    layer's weights under Llama's names (targets/runner.py decoder_layer_weights), called only when the
    family starts a layer from the target's (EAGLE: ``draft.init_layer_from_target``).
``load_exported(config, state, target_embeddings, target_lm_head=None) -> Model``
    a model for inference from an export (``state``: on-disk tensor names); ValueError when they do
    not fit. Families that borrow the target's lm_head (``Family.borrows_lm_head``) take it here
    (None: the embeddings). ``layer_ids_from_export(config) -> list[int]``: the engine layer ids it
    was trained on.
``summarize(sums) -> dict``
    metric sums (over any number of micro-batches) -> summary (``step_accuracy``, ``prefix_rate`` and
    ``conditional_acceptance`` lists per drafted position over the loss-mask positions, a target
    outside the draft vocab counted as a miss; ``simulated_tau``, ``positions``, ...; JSON-able).
    ``scalars(summary) -> dict[str, float]``: what tensorboard logs;
    ``PROGRESS: dict[str, str]``: progress-bar label -> scalars key; ``describe(summary) -> str``: one line.

``SUPERVISION`` (the supervision kind) is the Family's own ``supervision`` field.
Optional on the Model: ``set_progress(step, total)``, called by the trainer before every optimizer
step and before each held-out evaluation, ``total`` the step the run is planned to end at (the LR
cosine's end: train.max_steps / epochs, or where train.max_time_s is expected to stop it), so a
time-bound run's schedule spans the run it gets (Domino's loss schedule, EAGLE-3's depth curriculum).
Optional in CODE: ``checkpoint_meta(model) -> dict`` (default None), JSON-able facts the trainer merges
into the checkpoint's meta.json (DFlash: block_size, mask_token_id, target_layer_ids).
"""

from __future__ import annotations

import importlib.util

from draftsmith.supervision import declare_module

from .family import DraftConfig, Family, FamilyCode, KRule, ServeFlag, WeightRule  # noqa: F401 (the description's parts)

# name -> Family, in registration order (the first is draft.type's default)
FAMILIES: dict[str, Family] = {}
KNOWN_FAMILIES = FAMILIES.keys()  # a live view: every registered family trains, evaluates and (where an
                                  # engine has it) serves


class DraftError(ValueError):
    """A draft family or draft config.json this build cannot handle: an unknown ``draft.type``, a family
    registered twice, a config.json of one family given to another's loader. Fix: use a family the message
    lists, or load the draft with the family it names."""


def register(family: Family, *, replace: bool = False) -> Family:
    """Register ``family`` (one line per family, below; a family outside draftsmith registers the same
    way). A second family of the same name is a DraftError unless ``replace``."""
    if not isinstance(family, Family):
        raise DraftError(f"register({family!r}): expected a draftsmith.drafts.family.Family")
    if family.name in FAMILIES and not replace:
        raise DraftError(f"draft family {family.name!r} is already registered ({FAMILIES[family.name]!r}); "
                         "pick another name or pass replace=True")
    if family.supervision_module:  # found now (no import: it loads torch), so a typo fails here, not mid-run
        try:
            found = importlib.util.find_spec(family.supervision_module) is not None
        except ImportError:
            found = False
        if not found:
            raise DraftError(f"draft family {family.name!r}: supervision_module {family.supervision_module!r} is not "
                             "an importable module; name the module that defines its KINDS and LAYER_RULES")
    FAMILIES[family.name] = family
    if family.supervision_module:  # its kinds and layer rules reach the engines (imported on first use)
        declare_module(family.supervision_module)
    return family


def unregister(name: str) -> None:
    """Remove family ``name`` (tests that register a family of their own undo it)."""
    FAMILIES.pop(name, None)


def default_family() -> str:
    """The family ``draft.type`` defaults to: the first one registered."""
    return next(iter(FAMILIES))


def family_of_config(config: dict) -> str:
    """Classify an exported draft config.json by asking every family whether it recognises it
    (EAGLE-3 also takes what no family claims: third-party ``LlamaEagle3DraftModel`` configs)."""
    claimed = [f.name for f in FAMILIES.values() if not f.fallback and f.recognises(config)]
    if len(claimed) > 1:
        raise DraftError(f"config.json is recognised by several draft families ({', '.join(claimed)}); "
                         "their `recognises` rules overlap: make them exclusive")
    if claimed:
        return claimed[0]
    return next(f.name for f in FAMILIES.values() if f.fallback)


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
    if FAMILIES[family_of_config(config)].layout != "eagle":
        return None
    layers, want = held_layers(names), config.get("num_hidden_layers")
    if not layers or want is None or layers != set(range(len(layers))) or int(want) <= len(layers):
        return None
    return int(want), len(layers)


def vllm_methods() -> list[str]:
    """Every vLLM speculative method a registered family is served with (own methods, then aliases)."""
    return list(dict.fromkeys(m for f in FAMILIES.values() for m in f.vllm_methods))


def serve_flags() -> list[ServeFlag]:
    """Every ``serve vllm`` / ``export`` flag a registered family declares, once each, in registration order."""
    return list({f.flag: f for fam in FAMILIES.values() for f in fam.serve_flags}.values())


def get_family(name: str) -> Family:
    """The description of family ``name`` (its code behind it: ``get_family(n).Model``); an unknown
    name is a one-line DraftError."""
    if name in FAMILIES:
        return FAMILIES[name]
    raise DraftError(f"draft family {name!r} is unknown; expected one of {', '.join(FAMILIES)}")


# The families of this draftsmith, one line each (their descriptions are torch-free; code loads on first use).
from . import dflash, dspark, eagle3, peagle  # noqa: E402

register(eagle3.FAMILY)
register(peagle.FAMILY)
register(dflash.FAMILY)
register(dflash.JETSPEC)
register(dflash.DOMINO)
register(dspark.FAMILY)
