"""The learning-rate schedule over a run's optimizer steps, and where a time-bound run will stop.

:class:`Cosine` is the LambdaLR factor the trainer builds its scheduler with; :func:`reachable_step`
is the step a ``train.max_time_s`` run is expected to reach, which the trainer re-aims the cosine at
(``Trainer.fit_schedule``) so a time-bound run still anneals instead of stopping at a high LR.
"""

from __future__ import annotations

import math


class Cosine:
    """LR factor: linear warmup to 1, then cosine down to ``min_ratio`` at step ``end``.

    The end can move while training (:meth:`refit`, used to fit a time budget): the cosine's
    progress p is re-anchored at the current step, p(s) = p_a + (1 - p_a)(s - s_a)/(end - s_a), so
    the LR stays continuous and never rises. LambdaLR saves and restores these attributes with
    the scheduler state, so a resume continues the same curve.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float):
        self.warmup, self.min_ratio = warmup, min_ratio
        self.end, self.anchor_step, self.anchor_p = total, warmup, 0.0

    def progress(self, step: int) -> float:
        span = max(1, self.end - self.anchor_step)
        return min(1.0, max(0.0, self.anchor_p + (1.0 - self.anchor_p) * (step - self.anchor_step) / span))

    def __call__(self, step: int) -> float:
        if self.warmup > 0 and step < self.warmup:
            return (step + 1) / self.warmup
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * self.progress(step)))

    def refit(self, step: int, end: int) -> None:
        """From ``step`` on, reach ``min_ratio`` at ``end`` (> step); the factor at ``step`` is unchanged."""
        anchor = max(step, self.warmup)
        self.anchor_p, self.anchor_step, self.end = self.progress(anchor), anchor, max(end, anchor + 1)


def reachable_step(step: int, total_steps: int, max_time_s: float, elapsed: float, done: int) -> int:
    """The step a time-bound run is expected to stop at: ``done`` steps took ``elapsed`` s in this
    process, so the budget left buys (max_time_s - elapsed) * done / elapsed more (never past total)."""
    if done <= 0 or elapsed <= 0:
        return total_steps
    return min(total_steps, step + max(0, int((max_time_s - elapsed) * done / elapsed)))
