"""What more data buys: the one-line rule of thumb that ``draftsmith demo`` and ``draftsmith advise`` quote
for a trained draft, from how much of its data the draft saw.

Where the rule comes from (docs/benchmarks.md, "Real tau against distinct conversations"): bench/data_curve.py
trained the 60-minute recipe (examples/smollm2_best.yaml) for the same 500 optimizer steps on 250, 1,000 and
2,000 of its regenerated conversations (8, 2 and 1 passes) and scored each by real tau (== vLLM's): 1,000
beat 250 by 9% at K=3, and 2,000 seen once only tied 1,000 seen twice. The demo's recipe at 100 steps (36,
72, 144 conversations) agreed below that: fewer passes over more conversations won on every set and K. So:
below one pass the draft has not yet seen all it was given (more steps first); up to about two passes new
conversations and more passes are level; past that new conversations pay (:data:`PER_DOUBLING` real tau at
K=3 per doubling over the whole 250-2,000 curve).

A checkpoint knows both numbers (meta.json, written by train/loop.py): ``data_order["train conversations"]``
is N, and ``data_epoch + row_pos / N`` the passes made (the position in the data order it resumes at).
"""

from __future__ import annotations

from typing import Optional

__all__ = ["PER_DOUBLING", "CURVE_SOURCE", "data_seen", "data_rule", "data_rule_of"]

# Real tau at K=3 per doubling of distinct conversations at a fixed step budget (least squares over log2 N,
# bench/data_curve.py --config examples/smollm2_best.yaml --rows 250 1000 2000 --steps 500, SmolLM2-135M
# target, 2026-12-07).
PER_DOUBLING = {"MT-Bench": 0.044, "mixed": 0.028}
LEVEL_PASSES = 2.0  # up to here a second pass trained as well as twice the conversations seen once
CURVE_SOURCE = "bench/data_curve.py, docs: Benchmarks"


def data_seen(meta: dict) -> Optional[tuple[int, float]]:
    """(distinct training conversations N, passes made over them) from a checkpoint's meta.json, or None
    when the meta does not say (a vLLM export, a draft trained elsewhere, an older checkpoint)."""
    order = meta.get("data_order") or {}
    n = order.get("train conversations")
    if not isinstance(n, int) or n <= 0 or "data_epoch" not in meta:
        return None
    return n, float(meta["data_epoch"]) + float(meta.get("row_pos", 0)) / n


def data_rule(conversations: int, passes: float) -> str:
    """One line: what to do next with the data, for a draft that made ``passes`` over ``conversations``."""
    seen = f"{passes:.2f} passes over {conversations} conversations"
    if passes < 1.0:
        return (f"{seen}: it has not seen all its data yet, so more training time pays first "
                f"(more steps, e.g. a longer --minutes or train.max_time_s)")
    if passes < LEVEL_PASSES:
        return (f"{seen}: up to about {LEVEL_PASSES:.0f} passes, more passes and new conversations trained about "
                f"level ({CURVE_SOURCE}): train longer or regenerate more with `draftsmith regenerate`, whichever "
                f"is cheaper for you")
    gains = ", ".join(f"+{v:.3f} on {k}" for k, v in PER_DOUBLING.items())
    return (f"{seen}: at a fixed step budget new conversations beat repeated passes (each doubling of "
            f"distinct conversations added real tau at K=3 {gains}; {CURVE_SOURCE}): regenerate about "
            f"{2 * conversations} conversations with `draftsmith regenerate` before training longer")


def data_rule_of(meta: dict) -> Optional[str]:
    """:func:`data_rule` for a checkpoint's meta.json, or None when it does not record its data."""
    seen = data_seen(meta)
    return None if seen is None else data_rule(*seen)
