"""The held-out split: the draft evaluated on it (:func:`evaluate`), and the run judged by it: keeping the
best draft and stopping when held-out acceptance stops improving (:class:`Best`: train.keep_best,
train.early_stop_patience).

More passes over the same data stop paying and then cost: peers report EAGLE-3 acceptance falling
after ~4-5 epochs on Qwen3-4B. The score is the held-out split's ``simulated_tau`` (every family's
summary has it): 1 + the sum over drafted positions of the rate at which positions 0..k all agree
with the target, over *every* loss position, so a target token outside the draft vocab counts as
the miss it is when served (a metric over the in-vocab positions only would flatter a small vocab).

With ``keep_best`` each evaluation (train.eval_every steps, and the final one) that beats the best
score so far saves a checkpoint and points ``checkpoints/BEST`` at it; ``LATEST`` stays the last
checkpoint (what a resume continues from). A run directory given to eval, export or serve resolves
to BEST when it exists (layout.py), so more epochs can never make the draft a user picks up worse.
With ``early_stop_patience`` P > 0 the loop stops after P evaluations in a row without a better
score; the final evaluation and save follow as for any stop. Both states go into every checkpoint's
meta.json, so a resumed run keeps the same best and the same count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch

SCORE = "simulated_tau"  # the held-out metric compared (drafts/__init__.py: every family's summary has it)


def add_sums(total: Optional[dict], sums: dict) -> dict:
    """Element-wise sum of two metric-sum dicts (``total`` None = start from ``sums``)."""
    return dict(sums) if total is None else {k: total[k] + v for k, v in sums.items()}


@torch.no_grad()
def evaluate(trainer: Any) -> dict:
    """``trainer``'s held-out loss (mean over global micro-batches) and the family's summary of its metric sums
    over the whole split (EAGLE-3: per-step accuracy, simulated tau, positions), all ranks together."""
    if not trainer.eval_set:
        return {}
    # A step-dependent loss (Domino) gives the held-out loss at this step, the same whether or not the run was
    # resumed; EAGLE-3's depth curriculum evaluates the full unroll whatever the step.
    if hasattr(trainer.draft, "set_progress"):
        trainer.draft.set_progress(trainer.step, trainer.schedule.end)
    trainer.model.eval()
    t = trainer.cfg.train
    sums, loss_sum, n = None, 0.0, 0
    batches = trainer.par.global_batches(list(range(len(trainer.eval_set))))[: t.eval_max_batches]
    shares = [trainer.par.share(rows) for rows in batches]
    if not shares:  # train.eval_max_batches: 0
        return {}
    micro = [[trainer.eval_set[i] for i in rows] for rows, _ in shares]
    for (examples, supervised), (rows, weight) in zip(zip(micro, trainer.supervise(micro)), shares):
        # held-out draws (DFlash anchors) keyed by the conversation: the same at every evaluation,
        # whatever the batch or the number of ranks
        out, _, _ = trainer.forward(examples, supervised, trainer.row_generators(rows, epoch=-1))
        sums = add_sums(sums, {k: v.float() * weight for k, v in out.sums.items()})
        loss_sum += trainer.par.loss(out, weight)[1]
        n += 1
    sums, _ = trainer.par.reduce(sums, 0)
    metrics = {"loss": loss_sum / max(n, 1), **trainer.family.summarize(sums)}
    if trainer.held_out_coverage is not None:  # the whole split's, next to metrics that count its misses
        metrics["draft_vocab_coverage"] = trainer.held_out_coverage
    if trainer.writer is not None:
        trainer.writer.add_scalar("eval/loss", metrics["loss"], trainer.step)
        for name, value in trainer.family.scalars(metrics).items():
            trainer.writer.add_scalar(f"eval/{name}", value, trainer.step)
    return metrics


@dataclass
class Best:
    """The best held-out score so far, where it was saved, and the evaluations since it."""

    keep: bool = False  # train.keep_best
    patience: int = 0  # train.early_stop_patience (0: never stop early)
    score: Optional[float] = None
    step: Optional[int] = None
    checkpoint: Optional[str] = None  # the BEST checkpoint's path (in the run that saved it), when keep_best saved one
    since: int = 0  # evaluations since the best one

    @classmethod
    def start(cls, train: Any, meta: Optional[dict] = None) -> "Best":
        """From ``train`` (TrainConfig) and, on resume, the checkpoint's meta.json (its ``best``)."""
        saved = (meta or {}).get("best") or {}
        return cls(keep=bool(train.keep_best), patience=int(train.early_stop_patience), score=saved.get("score"),
                   step=saved.get("step"), checkpoint=saved.get("checkpoint"), since=int(saved.get("since", 0)))

    @property
    def active(self) -> bool:
        """Whether any evaluation is compared at all (neither knob set: the trainer does as before)."""
        return self.keep or self.patience > 0

    def update(self, metrics: dict, step: int) -> bool:
        """Count one evaluation at optimizer step ``step``; True when it is the new best (strictly higher
        score: a tie keeps the earlier, cheaper draft). Metrics without the score (no held-out split)
        change nothing."""
        score = metrics.get(SCORE)
        if score is None or not self.active:
            return False
        if self.score is None or float(score) > self.score:
            self.score, self.step, self.since = float(score), int(step), 0
            return True
        self.since += 1
        return False

    @property
    def exhausted(self) -> bool:
        """True when early stopping's patience has run out."""
        return self.patience > 0 and self.since >= self.patience

    def meta(self) -> dict:
        """What meta.json keeps (``best``), so a resume restores it."""
        return {"score": self.score, "step": self.step, "checkpoint": self.checkpoint, "since": self.since}

    def line(self) -> str:
        """One line for the end of a run: the best score, its step, and why the run stopped when it did."""
        if self.score is None:
            return "best: no held-out evaluation scored (data.eval_size 0?)"
        where = f" ({self.checkpoint}, checkpoints/BEST)" if self.checkpoint else ""
        stopped = (f"; stopped early: {self.since} evaluations without a better one (train.early_stop_patience "
                   f"{self.patience})" if self.exhausted else "")
        return f"best: held-out {SCORE} {self.score:.4f} at step {self.step}{where}{stopped}"

