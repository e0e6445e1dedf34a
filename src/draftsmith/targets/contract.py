"""Supervision math shared by every engine (pure torch, no I/O).

Whatever engine ran the target (hf, vllm, sglang, remote, cache), its
:class:`~draftsmith.targets.Features` become draft training targets here, so the shift semantics and
layer-id defaults exist exactly once.

Supervision kinds (:data:`SUPERVISION`): each draft family names the kind it learns from. A kind is a
dataclass whose field names are also the tensor names on the remote wire, a builder
``(batch, features[, draft_ids]) -> dataclass`` and two flags (does it need logits, does it use the
draft-vocab map):

    eagle3     shifted, draft-vocab target probs (EAGLE-3, P-EAGLE)
    dflash     unshifted aux states, ids and loss mask (DFlash family; offsets such as Domino's
               shift_label are applied by the draft, never here)
    dflash_kd  dflash plus the target's state at id L (B, S, H), unshifted (JetSpec KD: its teacher)

Layer ids follow the vLLM convention (our *engine ids*): id ``i`` is the residual stream after ``i``
decoder layers, ``0`` is the embedding output and ``L`` is the last layer's output before the final
norm. DFlash checkpoints (``dflash_config.target_layer_ids``) use the HF-hook convention instead: id
``j`` is the output of decoder layer ``j`` (0-based), i.e. HF ``hidden_states[j + 1]``, i.e. engine id
``j + 1``. vLLM reads those files the same way (``i + 1 for i in dflash_config.target_layer_ids``).
So DFlash hook ids ``0..L-1`` are engine ids ``1..L``; the embeddings (engine id 0) have no DFlash id.
:func:`dflash_layer_ids` returns engine ids; :func:`dflash_ids_to_engine` and
:func:`engine_ids_to_dflash` convert at the checkpoint boundary. Qwen3-8B (L = 36), 5 ids: hook ids
``[1, 9, 17, 25, 33]`` = engine ids ``[2, 10, 18, 26, 34]``.

EAGLE-3 shift (one position): draft slot ``t`` reads ``(aux_t, embed(token_{t+1}))`` and learns the
target's distribution for ``token_{t+2}``, which is the target's logits at position ``t+1``. So aux
hidden states stay unshifted while ``input_ids``, ``loss_mask`` and logits shift left by one, with a
zero tail for the last slot (it has no next token).

DFlash has no shift at all: it uses same-position alignment (block position ``k`` after an anchor
predicts the token at ``anchor + k``) and its block mask handles anchors, so everything stays at the
position it came from. Logits row ``t`` is the target's distribution for token ``t+1``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import torch
from torch import Tensor

if TYPE_CHECKING:
    from draftsmith.targets import Batch, Features


class TargetError(ValueError):
    """A target, engine or layer-id setting that does not fit the target: a path with no model, layer
    ids out of range, an engine option it does not take. Fix: correct the ``target.*`` key or flag the
    message names (it gives the valid range)."""


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """EAGLE-3 aux layer ids for a target with ``num_layers`` decoder layers.

    vLLM's default ``(2, L//2, L-3)``, deduplicated and sorted (L = 30 -> ``[2, 15, 27]``). Targets
    with fewer than 6 layers make that collapse or leave ``0..L-1``, so there we spread 3 distinct ids
    evenly over ``1..L-1`` (over ``0..L-1`` when L < 4). L < 3 cannot give 3 distinct ids below L.
    """
    L = int(num_layers)
    if L < 3:
        raise TargetError(
            f"target.aux_layer_ids: a target with {L} layer(s) has no default EAGLE-3 aux layers; "
            f"set target.aux_layer_ids explicitly (3 ids in 0..{max(L, 0)})"
        )
    ids = sorted({2, L // 2, L - 3})
    if len(ids) == 3 and all(0 <= i < L for i in ids):
        return ids
    lo = 1 if L >= 4 else 0
    return _spread(lo, L - 1, 3)


def engine_default_aux_layer_ids(num_layers: int) -> list[int]:
    """The aux layer ids vLLM and SGLang read when an EAGLE-3 draft's config.json names none:
    ``(2, L//2, L-3)`` of the target, deduplicated and sorted, with no small-target repair (unlike
    :func:`default_aux_layer_ids`, which training uses). NeMo AutoModel's default HF-hook ids
    ``[1, L/2-1, L-4]`` are these engine ids minus one (hook id j = engine id j + 1)."""
    return sorted({2, int(num_layers) // 2, int(num_layers) - 3})


def _spread(lo: int, hi: int, n: int) -> list[int]:
    """``n`` distinct ints evenly spaced over ``lo..hi`` inclusive, endpoints included when n > 1."""
    if hi - lo + 1 < n:
        raise TargetError(f"cannot place {n} distinct layer ids in {lo}..{hi}")
    if n == 1:
        return [(lo + hi) // 2]
    # lo + round_half_up(k * (hi - lo) / (n - 1)) in integer math; distinct since the step is >= 1.
    span, den = hi - lo, n - 1
    return [lo + (2 * k * span + den) // (2 * den) for k in range(n)]


def validate_layer_ids(ids: Sequence[int], num_layers: int, *, key: str = "target.aux_layer_ids",
                       first: int = 0) -> list[int]:
    """Check layer ids against ``first..num_layers`` (vLLM convention); return them as a list of ints.

    Order is kept (features come back in request order); duplicates and non-integers are rejected.
    ``first=1``: a DFlash-family draft, which reads decoder-layer outputs only (engine id 0, the
    embeddings, has no ``dflash_config.target_layer_ids`` equivalent).
    """
    L = int(num_layers)
    span = f"{first}..{L}"
    why = (f"(0 = embeddings, {L} = last layer before the final norm)" if first == 0 else
           f"for a DFlash-family draft (decoder-layer outputs: 1 = first layer, {L} = last; 0, the embeddings, "
           "has no dflash_config.target_layer_ids equivalent)")
    out: list[int] = []
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TargetError(f"{key}: {v!r} is not an integer; use layer ids in {span}")
        if not first <= v <= L:
            raise TargetError(f"{key}: layer id {v} is out of range; valid ids are {span} {why}")
        if v in out:
            raise TargetError(f"{key}: layer id {v} is repeated in {list(ids)}; list each id once")
        out.append(v)
    if not out:
        raise TargetError(f"{key}: no layer ids given; list at least one id in {span}")
    return out


# Why every run's aux ids are sorted: vLLM 0.32 stores them as ``tuple(sorted(set(ids)))``
# (``EagleModelMixin._set_aux_hidden_state_layers``, model_executor/models/interfaces.py; the DFlash path,
# ``dflash_config.target_layer_ids`` + 1, goes through the same call) and SGLang appends a state while
# its layer loop passes a listed layer (``if i in self.layers_to_capture``, models/llama.py): both
# concatenate the aux states in ascending layer order whatever order the config lists. A draft trained
# on another order would get fc's input blocks permuted at serve time, silently.
ENGINE_ORDER_WHY = "vLLM and SGLang read aux states in ascending layer order"


def ascending_layer_ids(ids: Sequence[int], *, key: str = "target.aux_layer_ids") -> tuple[list[int], Optional[str]]:
    """``ids`` (already validated: distinct ints) in ascending order, and the one-line note to print
    when that reordered them (None when they already were)."""
    given = [int(i) for i in ids]
    out = sorted(given)
    return out, (None if out == given else f"{key} {given} sorted to {out}: {ENGINE_ORDER_WHY}")


def dflash_layer_ids(num_layers: int, n: int) -> list[int]:
    """DFlash's default ``n`` context layers of an ``L``-layer target, as ENGINE ids (``1..L``).

    The reference rule (``build_target_layer_ids(L, n)`` of DFlash / SpecForge / speculators) picks
    HF-hook ids (output of decoder layer ``j``): ``[L // 2]`` when n == 1, else
    ``round(1 + i * (L - 4) / (n - 1))`` for i = 0..n-1 with Python's round (half to even), evenly
    spaced over hook ids ``1..L-3``. Hook id ``j`` is engine id ``j + 1``, so this returns those plus
    one: L = 36, n = 5 -> hook ``[1, 9, 17, 25, 33]`` -> ``[2, 10, 18, 26, 34]``. Write them back to
    a checkpoint with :func:`engine_ids_to_dflash`.
    """
    L = int(num_layers)
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TargetError(f"DFlash target layers: the count {n!r} must be an integer >= 1 "
                          f"(one id per context layer the draft reads)")
    if n == 1:
        if L < 1:
            raise TargetError(f"target.aux_layer_ids: a {L}-layer target has no decoder layer for DFlash to read")
        hook = [L // 2]
    else:
        start, end = 1, L - 3
        if end - start + 1 < n:  # a step below 1 would repeat ids
            raise TargetError(
                f"target.aux_layer_ids: a {L}-layer target has only {max(end, 0)} DFlash default layers "
                f"(decoder outputs 1..{end}) for {n} ids; set target.aux_layer_ids explicitly "
                f"({n} distinct engine ids in 1..{L})"
            )
        span = end - start
        hook = [int(round(start + (i * span) / (n - 1))) for i in range(n)]
    return dflash_ids_to_engine(hook)


def dflash_ids_to_engine(ids: Sequence[int]) -> list[int]:
    """DFlash ``dflash_config.target_layer_ids`` (output of decoder layer ``j``) -> engine ids ``j + 1``."""
    out = []
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise TargetError(f"dflash_config.target_layer_ids: {v!r} is not a decoder-layer index; "
                              f"use integers >= 0 (output of decoder layer j, 0-based)")
        out.append(v + 1)
    return out


def engine_ids_to_dflash(ids: Sequence[int], num_layers: int) -> list[int]:
    """Engine ids ``1..L`` -> DFlash ``dflash_config.target_layer_ids`` ``i - 1`` (for checkpoints).

    Engine id 0 is the embedding output, which no decoder layer produces, so it is refused.
    """
    L = int(num_layers)
    ids = validate_layer_ids(ids, L)
    if 0 in ids:
        raise TargetError(
            f"target.aux_layer_ids: layer id 0 (the embeddings) in {ids} has no DFlash target_layer_ids "
            f"equivalent; DFlash reads decoder-layer outputs, ids 1..{L}: replace 0 with an id in 1..{L}"
        )
    return [i - 1 for i in ids]


# Default target layer ids by rule name (a draft family names its rule, see drafts/__init__.py):
# (num_layers, count) -> ids. EAGLE-3's rule always gives 3 ids, so it ignores the count.
LAYER_ID_RULES: dict[str, Callable[[int, Optional[int]], list[int]]] = {
    "eagle3": lambda L, n: default_aux_layer_ids(L),
    "dflash": lambda L, n: dflash_layer_ids(L, n if n is not None else 1),
}


def default_layer_ids(rule: str, num_layers: int, count: Optional[int] = None) -> list[int]:
    """Default layer ids of ``rule`` (a key of :data:`LAYER_ID_RULES`) for a ``num_layers``-layer target."""
    if rule not in LAYER_ID_RULES:
        raise TargetError(f"layer-id rule {rule!r} is unknown; expected one of {sorted(LAYER_ID_RULES)}")
    return LAYER_ID_RULES[rule](int(num_layers), count)


def shift_left(x: Tensor, n: int = 1, dim: int = 1) -> Tensor:
    """``y[..., t, ...] = x[..., t + n, ...]`` along ``dim``; the last ``n`` slots are zero (False).

    Works for any dtype (bool tails are False). Returns a new tensor; ``x`` is untouched.
    """
    if n < 0:
        raise ValueError(f"shift_left: n={n} must be >= 0")
    out = torch.zeros_like(x)
    size = x.shape[dim]
    if n < size:
        out.narrow(dim, 0, size - n).copy_(x.narrow(dim, n, size - n))
    return out


from draftsmith.targets.head import (LOGITS_CHUNK_ELEMENTS, TargetHead, chunk_rows,  # noqa: E402,F401
                                    draft_vocab_targets, rebuild_logits)


@dataclass
class Eagle3Supervision:
    """EAGLE-3 training inputs and targets for one batch (slot t predicts token_{t+2}).

    aux_hidden:    (B, T, n, H) target states at the aux layers, UNSHIFTED (state after token t)
    input_ids:     (B, T) int64, token_{t+1} (zero tail)
    loss_mask:     (B, T) loss mask of token_{t+1} (zero tail)
    target_probs:  (B, T, Vd) float32 (bfloat16 for a bf16 target: head.probs_dtype), target distribution
                   for token_{t+2} over the draft vocab
    position_mask: (B, T) bool, loss_mask and the target's full-vocab argmax lies in the draft vocab
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor
    target_probs: Tensor
    position_mask: Tensor


def eagle3_supervision(batch: "Batch", features: "Features", draft_ids: Optional[Tensor], *,
                       last_hidden: Optional[Tensor] = None, head: Optional[TargetHead] = None,
                       max_elements: int = LOGITS_CHUNK_ELEMENTS) -> Eagle3Supervision:
    """Turn a batch and its features into EAGLE-3 supervision.

    ``draft_ids`` (Vd,) int64 lists the target-vocab id of each draft-vocab entry (``t = d + d2t[d]``);
    ``None`` means the draft predicts the full vocab. The target's logits come either from
    ``last_hidden`` (B, S, H), the pre-norm state at layer id L, through ``head`` in chunks of positions
    (:func:`draft_vocab_targets`: no (B, S, V) tensor is ever built), or from ``features.logits``
    (B, S, V) when an engine returned them whole. Either way:
        target_probs = softmax(logits_shifted[..., draft_ids].float())          # renormalised over Vd
        position_mask = loss_mask_shifted & t2d[argmax_V logits_shifted]
    """
    if last_hidden is not None:
        if head is None:
            raise TargetError("eagle3 supervision: last_hidden given without the target head; pass head=TargetHead")
        probs, in_draft = draft_vocab_targets(last_hidden, head, draft_ids, max_elements=max_elements)
        device = last_hidden.device
    elif features.logits is not None:
        logits = features.logits  # (B, S, V), any float dtype
        flat = TargetHead(lambda x: x, int(logits.shape[-1]))  # rows are already logits
        probs, in_draft = draft_vocab_targets(logits, flat, draft_ids, max_elements=logits.numel())
        device = logits.device
    else:
        raise TargetError("eagle3 supervision needs the target's logits: features.logits is None and no layer-L "
                          "state was given; call features(..., logits=True) or targets.supervision_for")
    # Shifting the (B, S, Vd) probs and the small masks rather than the logits: they commute.
    loss_mask = shift_left(batch.loss_mask.to(device))
    return Eagle3Supervision(
        aux_hidden=features.aux_hidden,
        input_ids=shift_left(batch.input_ids.to(device)),
        loss_mask=loss_mask,
        target_probs=shift_left(probs),
        position_mask=loss_mask.bool() & shift_left(in_draft),
    )


@dataclass
class DFlashSupervision:
    """DFlash training inputs for one batch, all UNSHIFTED (block position k predicts token anchor+k).

    aux_hidden: (B, S, n, H) target states at the requested engine ids, UNSHIFTED (state after token t)
    input_ids:  (B, S) int64, token t, UNSHIFTED
    loss_mask:  (B, S) loss mask of token t (1 on assistant tokens), UNSHIFTED, the batch's dtype
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor


@dataclass
class DFlashKDSupervision:
    """JetSpec (DFlash with knowledge distillation) training inputs for one batch, all UNSHIFTED.

    aux_hidden:  (B, S, n, H) as in :class:`DFlashSupervision`
    input_ids:   (B, S) int64, token t
    loss_mask:   (B, S) loss mask of token t
    last_hidden: (B, S, H) the target's pre-norm state at id L, engine dtype: lm_head(final_norm(row t))
                 is its distribution for token t+1 (the teacher of block position k: row anchor+k-1)
    """

    aux_hidden: Tensor
    input_ids: Tensor
    loss_mask: Tensor
    last_hidden: Tensor


def _same_positions(kind: str, batch: "Batch", name: str, t: Tensor) -> None:
    """Refuse features whose (B, S) does not match the batch's (an engine bug, not a setting)."""
    if tuple(t.shape[:2]) != tuple(batch.input_ids.shape):
        raise TargetError(f"{kind} supervision: {name} has shape {tuple(t.shape)}, the batch is "
                          f"{tuple(batch.input_ids.shape)}; the engine returned features for another batch")


def dflash_supervision(batch: "Batch", features: "Features") -> DFlashSupervision:
    """DFlash supervision: aux states, ids and loss mask exactly as they are, with NO shift.

    DFlash uses same-position alignment (block position k predicts the token at anchor + k; the
    draft's block mask handles anchors), so nothing moves. SpecForge once applied an EAGLE-style
    shift here, which was a bug (SpecForge PR #472). ``features.logits`` is ignored. The tensors are
    the batch's and the features' own (moved to the aux states' device; no copy when already there).
    """
    aux = features.aux_hidden  # (B, S, n, H)
    _same_positions("dflash", batch, "features.aux_hidden", aux)
    return DFlashSupervision(
        aux_hidden=aux,
        input_ids=batch.input_ids.to(device=aux.device, dtype=torch.int64),  # (B, S)
        loss_mask=batch.loss_mask.to(aux.device),  # (B, S)
    )


def dflash_kd_supervision(batch: "Batch", features: "Features", last_hidden: Optional[Tensor] = None,
                          head: Optional[TargetHead] = None) -> DFlashKDSupervision:
    """JetSpec KD supervision: :func:`dflash_supervision` plus the target's state at id L, all UNSHIFTED.

    ``last_hidden`` (B, S, H): the pre-norm state at id L (:func:`draftsmith.targets.supervision_for`),
    engine dtype; ``features.logits`` and ``head`` are unused: the draft holds the target's final norm
    and lm_head and builds the logits of just the rows its blocks need. loss_mask is 0 on pads.
    """
    if last_hidden is None:
        raise TargetError("dflash_kd supervision needs last_hidden, the target's (B, S, H) state at layer id L, not "
                          "features.logits; build it with targets.supervision_for (its engine needs its head weights)")
    base, dev = dflash_supervision(batch, features), last_hidden.device
    _same_positions("dflash_kd", batch, "last_hidden", last_hidden)
    return DFlashKDSupervision(aux_hidden=base.aux_hidden, input_ids=base.input_ids.to(dev),
                               loss_mask=base.loss_mask.to(dev), last_hidden=last_hidden)


# ---------------------------------------------------------------------------------- supervision kinds
@dataclass(frozen=True)
class SupervisionKind:
    """One kind of supervision: its dataclass (field names = wire tensor names) and its builder.

    ``build(batch, features[, draft_ids][, last_hidden=, head=])``: draft_ids (Vd,) int64 or None (full
    vocab) is passed only when ``vocab`` is True. ``logits``: the kind needs the target's logits; the
    engine then returns the pre-norm state at layer id L and the builder gets it with the target head
    when ``last`` is True (it projects rows in chunks), else the logits built whole from them.
    """

    name: str
    cls: type
    build: Callable[..., Any]
    logits: bool
    vocab: bool
    last: bool = False

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.cls))


SUPERVISION: dict[str, SupervisionKind] = {
    "eagle3": SupervisionKind("eagle3", Eagle3Supervision, eagle3_supervision, logits=True, vocab=True, last=True),
    "dflash": SupervisionKind("dflash", DFlashSupervision, dflash_supervision, logits=False, vocab=False),
    "dflash_kd": SupervisionKind("dflash_kd", DFlashKDSupervision, dflash_kd_supervision, logits=True, vocab=False,
                                 last=True),
}


def register_supervision(kind: SupervisionKind, *, replace: bool = False) -> SupervisionKind:
    """Add a supervision kind for a family that brings its own (tests/drafts/toy_family: its folder
    registers it); every engine then builds it (hf, vllm, sglang, cache, remote: the remote wire carries
    its fields by name). A second kind of the same name is a TargetError unless ``replace``."""
    if not isinstance(kind, SupervisionKind):
        raise TargetError(f"register_supervision({kind!r}): expected a draftsmith.targets.contract.SupervisionKind")
    if kind.name in SUPERVISION and not replace:
        raise TargetError(f"supervision kind {kind.name!r} is already registered; pick another name or pass replace=True")
    SUPERVISION[kind.name] = kind
    return kind


def unregister_supervision(name: str) -> None:
    """Remove supervision kind ``name`` (a test that registered its own undoes it)."""
    SUPERVISION.pop(name, None)


def supervision_kind(name: str) -> SupervisionKind:
    """The :class:`SupervisionKind` called ``name``; an unknown name is a one-line :class:`TargetError`."""
    kind = SUPERVISION.get(name) if isinstance(name, str) else None
    if kind is None:
        raise TargetError(f"supervision kind {str(name)[:32]!r} is unknown; expected one of {sorted(SUPERVISION)}")
    return kind


def supervise(kind: str, batch: "Batch", features: "Features", draft_ids: Optional[Tensor], *,
              last_hidden: Optional[Tensor] = None, head: Optional[TargetHead] = None) -> Any:
    """Supervision of ``kind`` for ``batch`` from its ``features`` (``draft_ids`` ignored by vocab-free kinds).

    ``last_hidden`` (B, S, H) with ``head``: the target's logits as the layer-L state and the head that
    projects it (what engines return for kinds that need logits; see :func:`supervision_for`).
    """
    k = supervision_kind(kind)
    args = (batch, features, draft_ids) if k.vocab else (batch, features)
    if last_hidden is None:
        return k.build(*args)
    if k.last:
        return k.build(*args, last_hidden=last_hidden, head=head)
    # A kind that reads logits whole: build them once from the state (the old (B, S, V) path).
    full = head.project(last_hidden.reshape(-1, last_hidden.shape[-1])).reshape(*last_hidden.shape[:2], -1)
    return k.build(batch, type(features)(aux_hidden=features.aux_hidden, logits=full), *args[2:])


def supervision_tensors(sup: Any) -> dict[str, Tensor]:
    """A supervision dataclass -> {field name: tensor} in field order (what goes on the wire)."""
    return {f.name: getattr(sup, f.name) for f in fields(sup)}


def supervision_from_tensors(kind: str, tensors: Mapping[str, Tensor]) -> Any:
    """The inverse of :func:`supervision_tensors`; the names must be exactly the kind's fields."""
    k = supervision_kind(kind)
    if set(tensors) != set(k.tensor_names):
        raise TargetError(f"{kind} supervision: got tensors {sorted(tensors)}, expected {list(k.tensor_names)}; "
                          f"client and server versions disagree")
    return k.cls(**{n: tensors[n] for n in k.tensor_names})


def supervision_to(sup: Any, device: Any) -> Any:
    """A copy of ``sup`` with every tensor on ``device`` (``sup`` itself when all already are)."""
    t = supervision_tensors(sup)
    if all(v.device == torch.device(device) for v in t.values()):
        return sup
    return type(sup)(**{n: v.to(device) for n, v in t.items()})
