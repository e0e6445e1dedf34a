"""What a training run shows its user: the setup summary (:func:`setup_lines`) and the train bar.

The train bar under a time budget (``train.max_time_s``):

Under a budget the time left is known exactly (budget - elapsed), so the bar shows that rather than
tqdm's guess, and its total is the step the budget is expected to stop at. Step times vary a lot
with conversation length (4x in the demo), so the total is estimated from the rate of the run so
far, which settles, not from recent steps; and the first step of a process, which pays one-time
costs (allocation, the first prefetch), is left out of that rate once a second step exists.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from tqdm import tqdm

from draftsmith import console

from .precision import bf16_note, muon_note


class BudgetProgress:
    """The bar's total and the seconds left, step by step, for a run that stops at ``max_time_s``
    (elapsed seconds of this process, as the trainer measures them: the max over ranks) or at
    ``total_steps``. ``start_step`` is the step this process started from (non-zero on resume)."""

    def __init__(self, max_time_s: float, total_steps: int, start_step: int = 0):
        self.max_time_s, self.total_steps, self.start_step = max_time_s, total_steps, start_step
        self.first_step_s: Optional[float] = None  # elapsed when this process's first step ended

    def update(self, step: int, elapsed: float, stop: bool) -> tuple[int, float]:
        """After ``step`` ended at ``elapsed`` -> (bar total, seconds left). At ``stop`` the total is
        ``step`` (the bar ends full) and nothing is left; before it, at least one more step."""
        done = step - self.start_step
        if self.first_step_s is None:
            self.first_step_s = elapsed
        if stop:
            return step, 0.0
        if done >= 2:  # run-so-far rate without the first step's warm-up
            per_step = (elapsed - self.first_step_s) / (done - 1)
        else:
            per_step = elapsed / max(done, 1)
        budget_left = max(0.0, self.max_time_s - elapsed)
        # The trainer stops after the first step that ends at or past the budget, hence ceil.
        more = math.ceil(budget_left / per_step) if per_step > 0 else self.total_steps - step
        total = min(self.total_steps, step + max(1, more))
        # The data may run out first: then the run ends after total - step more steps.
        left = min(budget_left, (total - step) * per_step) if total == self.total_steps else budget_left
        return total, left


class TrainBar(tqdm):
    """tqdm with smoothing 0 (its rate and ETA: the whole run's average, not the last few steps);
    under a budget (:meth:`budget`) its ETA is :class:`BudgetProgress`'s seconds left."""

    left_s: Optional[float] = None  # read by format_dict, which tqdm's __init__ already calls

    # as console.PhaseBar's, with the rate: "train: 9%|.| 17/197 step [00:40 elapsed, ETA 06:00, 2.35s/step]"
    BUDGET_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed} elapsed, ETA {budget_left}, {rate_fmt}{postfix}]"

    def __init__(self, total: int, initial: int, *, max_time_s: Optional[float] = None, **kwargs):
        self.plan = BudgetProgress(max_time_s, total, initial) if max_time_s is not None else None
        kwargs.setdefault("file", console.bar_stream())  # the terminal, past an engine log redirect
        if self.plan is not None:
            self.left_s = max_time_s
            kwargs.setdefault("bar_format", self.BUDGET_FORMAT)
        super().__init__(total=total, initial=initial, smoothing=0, **kwargs)

    def step(self, step: int, elapsed: float, stop: bool) -> None:
        """One step ended: re-estimate the total under a budget, then advance (which draws)."""
        if self.plan is not None:
            self.total, self.left_s = self.plan.update(step, elapsed, stop)
        self.update(1)

    @property
    def format_dict(self):
        d = super().format_dict
        d["budget_left"] = self.format_interval(self.left_s) if self.left_s is not None else "?"
        return d


def setup_lines(trainer: Any) -> list[str]:
    """What the trainer's setup found, printed before training by ``train`` and ``demo``: the data
    report (rows kept, bad rows by reason), the split, the draft vocab, the aux layers, the budget,
    the ranks and batch, and a resume's note."""
    t = trainer.cfg.train
    n_convs = len(trainer.train_set) + len(trainer.eval_set) + trainer.dropped
    lines = [trainer.data_report.summary()]
    lines += [f"data: first {kind!r}: {msg}" for kind, msg in list(trainer.data_report.first_errors.items())[:3]]
    if trainer.dropped:
        lines.append(f"data: {trainer.dropped} of {n_convs} conversations dropped (no assistant token within "
                     f"data.max_length={trainer.cfg.data.max_length})")
    if getattr(trainer, "padding", None) is not None:  # unpacked and packed (data.packing, families that pack)
        lines.append(trainer.padding.describe(trainer.cfg.data.packing, trainer.family.packing))
    vocab, held = trainer.vocab, trainer.held_out_coverage
    lines.append(f"setup: {len(trainer.train_set)} train / {len(trainer.eval_set)} held-out conversations, draft vocab "
                 f"{vocab.draft_ids.numel()} of {trainer.info.vocab_size} (coverage {vocab.coverage:.3f} train"
                 + (f", {held:.3f} held-out" if held is not None else "") + "), "
                 f"aux layers {trainer.aux_ids}; {trainer.held_out_from}")
    steps = (f"{trainer.total_steps} steps ({trainer.steps_per_epoch}/epoch x {t.epochs} epochs"
             + (f", capped by train.max_steps={t.max_steps})" if t.max_steps is not None else ")"))
    start = f" from step {trainer.step}" if trainer.step else ""
    if t.max_time_s is not None:
        lines.append(f"budget: up to {t.max_time_s:.0f} s of training (train.max_time_s), at most {steps}{start}")
    else:
        lines.append(f"budget: {steps}{start}")
    lines.append(trainer.par.describe(t.grad_accum, trainer.bf16))
    for note in (bf16_note(trainer.device, trainer.bf16), muon_note(trainer.device, t.optimizer)):
        if note:  # bf16 emulated on this CPU: say so before the slow run
            lines.append(note)
    if trainer.resume_note:
        lines.append(trainer.resume_note)
    return lines
