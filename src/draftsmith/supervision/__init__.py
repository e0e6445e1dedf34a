"""Supervision: what a draft family learns from, between the engines (targets/) and the families (drafts/).

This package sits below both. It holds the registry of supervision kinds and layer-id rules, the
layer-id convention (:mod:`.layers`), the target's head as a function (:mod:`.head`) and small tensor
helpers (:mod:`.tensors`); it names no family. Each family brings its own kinds (the EAGLE families
share ``drafts/eagle_supervision.py``, the block families ``drafts/block_supervision.py``; a family
alone brings them from its folder): the family's description names that module
(``Family.supervision_module``) and registering the family declares it here. The module is imported
on first use, so describing families stays torch-free, and every engine (hf, vllm, sglang, cache,
remote: the remote wire carries a kind's fields by name) builds any kind a registered family brings,
without importing drafts/.

A kind is a dataclass whose field names are also the tensor names on the remote wire and in packed
batches, a builder ``(batch, features[, draft_ids][, last_hidden=, head=]) -> dataclass`` and two flags
(does it need the target's logits, does it use the draft-vocab map). A layer-id rule is a function
``(num_layers, count) -> engine layer ids``: a family's default target layers.

Importing this package imports nothing heavy (no torch): ``draftsmith.drafts`` imports it.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, fields
from typing import Any, Callable, Mapping, Optional


class TargetError(ValueError):
    """A target, engine or layer-id setting that does not fit the target: a path with no model, layer
    ids out of range, an engine option it does not take. Fix: correct the ``target.*`` key or flag the
    message names (it gives the valid range)."""


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


# name -> kind; name -> layer-id rule ((num_layers, count) -> engine ids); filled from the families' folders
SUPERVISION: dict[str, SupervisionKind] = {}
LAYER_ID_RULES: dict[str, Callable[[int, Optional[int]], list[int]]] = {}
# modules declared by registered families and not imported yet (each defines KINDS and LAYER_RULES); the lock:
# serve-target's request threads may make the first lookup together, and none may see a half-loaded registry
_DECLARED: list[str] = []
_LOADING = threading.Lock()


def declare_module(module: str) -> None:
    """Declare a family folder's supervision module (dotted name): its ``KINDS`` (SupervisionKinds) and
    ``LAYER_RULES`` ({name: rule}) are registered on the first lookup that needs them. Registering a
    family calls this with ``Family.supervision_module``; declaring the same module twice is one."""
    if module not in _DECLARED:
        _DECLARED.append(module)


def _load_declared() -> None:
    """Import every declared module and register what it brings (once each; a module shared by several
    families, the block families' one, is imported once)."""
    with _LOADING:
        while _DECLARED:
            module = importlib.import_module(_DECLARED[0])
            for kind in getattr(module, "KINDS", ()):
                if SUPERVISION.get(kind.name) is not kind:
                    register_supervision(kind)
            for rule, fn in getattr(module, "LAYER_RULES", {}).items():
                register_layer_rule(rule, fn, replace=LAYER_ID_RULES.get(rule) is fn)
            _DECLARED.pop(0)  # only once registered: a failed import is retried (and raises) on the next lookup


def register_supervision(kind: SupervisionKind, *, replace: bool = False) -> SupervisionKind:
    """Add a supervision kind (a family folder's module does, through :func:`declare_module`; a test may
    directly); every engine then builds it. A second kind of the same name is a TargetError unless
    ``replace``."""
    if not isinstance(kind, SupervisionKind):
        raise TargetError(f"register_supervision({kind!r}): expected a draftsmith.supervision.SupervisionKind")
    if kind.name in SUPERVISION and not replace:
        raise TargetError(f"supervision kind {kind.name!r} is already registered; pick another name or pass replace=True")
    SUPERVISION[kind.name] = kind
    return kind


def unregister_supervision(name: str) -> None:
    """Remove supervision kind ``name`` (a test that registered its own undoes it)."""
    SUPERVISION.pop(name, None)


def register_layer_rule(name: str, rule: Callable[[int, Optional[int]], list[int]], *, replace: bool = False) -> None:
    """Add a default layer-id rule ``(num_layers, count) -> engine ids`` under ``name`` (a family's
    ``layer_rule`` names it)."""
    if name in LAYER_ID_RULES and not replace:
        raise TargetError(f"layer-id rule {name!r} is already registered; pick another name or pass replace=True")
    LAYER_ID_RULES[name] = rule


def supervision_kinds() -> list[str]:
    """Every kind the registered families bring (declared modules loaded), sorted."""
    _load_declared()
    return sorted(SUPERVISION)


def supervision_kind(name: str) -> SupervisionKind:
    """The :class:`SupervisionKind` called ``name``; an unknown name is a one-line :class:`TargetError`."""
    if isinstance(name, str) and name not in SUPERVISION:
        _load_declared()
    kind = SUPERVISION.get(name) if isinstance(name, str) else None
    if kind is None:
        raise TargetError(f"supervision kind {str(name)[:32]!r} is unknown; expected one of {sorted(SUPERVISION)}")
    return kind


def default_layer_ids(rule: str, num_layers: int, count: Optional[int] = None) -> list[int]:
    """Default layer ids of ``rule`` (a registered layer-id rule) for a ``num_layers``-layer target."""
    if rule not in LAYER_ID_RULES:
        _load_declared()
    if rule not in LAYER_ID_RULES:
        raise TargetError(f"layer-id rule {rule!r} is unknown; expected one of {sorted(LAYER_ID_RULES)}")
    return LAYER_ID_RULES[rule](int(num_layers), count)


def supervise(kind: str, batch: Any, features: Any, draft_ids: Any, *, last_hidden: Any = None,
              head: Any = None) -> Any:
    """Supervision of ``kind`` for ``batch`` from its ``features`` (``draft_ids`` ignored by vocab-free kinds).

    ``last_hidden`` (B, S, H) with ``head`` (:class:`.head.TargetHead`): the target's logits as the
    layer-L state and the head that projects it (what engines return for kinds that need logits; see
    ``targets.supervision_for``).
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


def supervision_tensors(sup: Any) -> dict[str, Any]:
    """A supervision dataclass -> {field name: tensor} in field order (what goes on the wire)."""
    return {f.name: getattr(sup, f.name) for f in fields(sup)}


def supervision_from_tensors(kind: str, tensors: Mapping[str, Any]) -> Any:
    """The inverse of :func:`supervision_tensors`; the names must be exactly the kind's fields."""
    k = supervision_kind(kind)
    if set(tensors) != set(k.tensor_names):
        raise TargetError(f"{kind} supervision: got tensors {sorted(tensors)}, expected {list(k.tensor_names)}; "
                          f"client and server versions disagree")
    return k.cls(**{n: tensors[n] for n in k.tensor_names})


def supervision_to(sup: Any, device: Any) -> Any:
    """A copy of ``sup`` with every tensor on ``device`` (``sup`` itself when all already are)."""
    import torch

    t = supervision_tensors(sup)
    if all(v.device == torch.device(device) for v in t.values()):
        return sup
    return type(sup)(**{n: v.to(device) for n, v in t.items()})
