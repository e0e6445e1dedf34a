"""Target layer ids: the convention every engine, config and wire message uses (pure Python).

Layer ids follow the vLLM convention (our *engine ids*): id ``i`` is the residual stream after ``i``
decoder layers, ``0`` is the embedding output and ``L`` is the last layer's output before the final
norm. A family whose checkpoints count otherwise converts at its own boundary (the block families:
``drafts/block_supervision.py``).
"""

from __future__ import annotations

from typing import Optional, Sequence

from . import TargetError


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Three aux layer ids for a target with ``num_layers`` decoder layers: the default of EAGLE-style
    drafts and of ``serve-target --aux-layer-ids``.

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
    return spread(lo, L - 1, 3)


def engine_default_aux_layer_ids(num_layers: int) -> list[int]:
    """The aux layer ids vLLM and SGLang read when an EAGLE-3 draft's config.json names none:
    ``(2, L//2, L-3)`` of the target, deduplicated and sorted, with no small-target repair (unlike
    :func:`default_aux_layer_ids`, which training uses). NeMo AutoModel's default HF-hook ids
    ``[1, L/2-1, L-4]`` are these engine ids minus one (hook id j = engine id j + 1)."""
    return sorted({2, int(num_layers) // 2, int(num_layers) - 3})


def spread(lo: int, hi: int, n: int) -> list[int]:
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
    ``first=1``: a draft that reads decoder-layer outputs only (a block draft: engine id 0, the
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
