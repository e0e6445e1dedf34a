"""The EAGLE families' metrics (EAGLE-3's K chained steps, P-EAGLE's K parallel depths): per drafted
position, summed (K,) counts -> accuracy, acceptance and simulated tau; the scalars and the one line the
trainer logs. Each family's ``summarize`` names its own sums and calls :func:`position_summary`.
"""

from __future__ import annotations

import torch

from .layers import conditional_rates

__all__ = ["PROGRESS", "simulated_tau", "position_summary", "scalars", "describe"]

PROGRESS = {"acc": "acc0", "tau": "simulated_tau"}  # progress-bar label -> scalars() key


def simulated_tau(prefix_correct: torch.Tensor, step_count: torch.Tensor) -> float:
    """1 + sum_k prefix_correct_k / max(step_count_k, 1), from (K,) sums aggregated over batches."""
    rate = prefix_correct.double() / step_count.double().clamp(min=1)
    return 1.0 + float(rate.sum())


def position_summary(correct: torch.Tensor, prefix: torch.Tensor, count: torch.Tensor) -> dict:
    """(K,) summed counts per drafted position -> a summary shared by the families that draft K positions:

    step_accuracy: hits_k / count_k, each position on its own (teacher-forced, unconditional);
    prefix_rate: prefix_k / count_k, positions 0..k all agree (vLLM's per-position acceptance rate);
    conditional_acceptance: prefix_rate_k / prefix_rate_{k-1}, position k given 0..k-1 accepted;
    simulated_tau: 1 + sum_k prefix_rate_k; positions: count_0 (loss-mask positions, draft-vocab misses
    included)."""
    n = count.double()
    return {"step_accuracy": (correct.double() / n.clamp(min=1)).tolist(),
            "prefix_rate": (prefix.double() / n.clamp(min=1)).tolist(),
            "conditional_acceptance": conditional_rates(prefix, count),
            "simulated_tau": simulated_tau(prefix, count), "positions": int(n[0])}


def scalars(summary: dict) -> dict[str, float]:
    """TensorBoard scalars: acc{k} unconditional step accuracy, cond{k} conditional acceptance."""
    return {"simulated_tau": summary["simulated_tau"], **{f"acc{k}": a for k, a in enumerate(summary["step_accuracy"])},
            **{f"cond{k}": c for k, c in enumerate(summary.get("conditional_acceptance", ()))}}


def describe(summary: dict, what: str = "step") -> str:
    """One line: unconditional accuracy per step (``what``: "step", or P-EAGLE's "depth"), the conditional
    acceptance next to it, simulated tau."""
    accs = " ".join(f"{a:.3f}" for a in summary["step_accuracy"])
    cond = " ".join(f"{a:.3f}" for a in summary.get("conditional_acceptance", ()))
    return (f"per-{what} accuracy [{accs}]  conditional [{cond}]  "
            f"{'simulated parallel tau' if what == 'depth' else 'simulated tau'} {summary['simulated_tau']:.3f}")
