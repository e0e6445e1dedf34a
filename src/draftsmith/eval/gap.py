"""Is served acceptance below offline acceptance by more than the sample's noise? (``draftsmith check``)

Both sides decode the same prompts, so the comparison is paired by prompt. Each prompt ``j`` gives,
per side, ``drafts_j`` (draft rounds) and ``acc_j[i]`` (rounds whose first i+1 drafted tokens were
accepted). Acceptance at position i is the ratio estimate ``p_i = sum_j acc_j[i] / sum_j drafts_j``
(vLLM's per-position acceptance rate), tau = 1 + sum_i p_i.

The bound on ``gap_i = p_i(served) - p_i(offline)`` is the WIDER (hull) of two intervals:

- Newcombe's hybrid score interval for a difference of two proportions (Newcombe 1998, method 10:
  Wilson score limits of each side combined), which treats every draft round as an independent
  Bernoulli trial: right when rounds are many and independent, and it stays honest when there are
  only one or two prompts (where a bootstrap over prompts has nothing to resample);
- a paired cluster bootstrap over prompts (``B`` resamples of the prompt list with replacement, the
  same resample for both sides, percentile limits): rounds of one answer are correlated (a draft
  that fails on one topic fails on all its rounds), which the binomial interval ignores.

One-sided at family-wise level ``alpha`` over the K positions (Bonferroni: each position at
``alpha / K``). Position i is a *shortfall* when the upper limit of ``gap_i`` is below ``-margin``:
served accepts less than offline by more than ``margin`` (absolute, default 0.01: greedy fp32 runs
are token-identical, so anything real is larger; a rare near-tie flip is not a finding) with
confidence ``1 - alpha``. The tau gap gets the bootstrap interval (reported, not tested: a tau
shortfall shows up as a position shortfall).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional, Sequence

__all__ = ["PromptCounts", "wilson", "newcombe_diff", "bootstrap_gap", "compare_sides", "rates"]


@dataclass
class PromptCounts:
    """One prompt's counters on one side: draft rounds and accepted-at-position counts (K entries)."""

    drafts: int
    per_position: list[int]


def wilson(k: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n at normal quantile ``z`` ((0, 1) when n == 0)."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_diff(k1: float, n1: float, k2: float, n2: float, z: float) -> tuple[float, float]:
    """Newcombe's hybrid score interval for p1 - p2 (p1 = k1/n1, p2 = k2/n2) at quantile ``z``:
    ``[d - sqrt((p1-l1)^2 + (u2-p2)^2), d + sqrt((u1-p1)^2 + (p2-l2)^2)]`` with (l, u) each side's
    Wilson limits."""
    p1, p2 = (k1 / n1 if n1 else 0.0), (k2 / n2 if n2 else 0.0)
    l1, u1 = wilson(k1, n1, z)
    l2, u2 = wilson(k2, n2, z)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def rates(counts: Sequence[PromptCounts], k: int) -> tuple[list[Optional[float]], Optional[float]]:
    """(per-position acceptance p_i, tau) pooled over prompts (None when nothing was drafted)."""
    n = sum(c.drafts for c in counts)
    if not n:
        return [None] * k, None
    per = [sum(c.per_position[i] if i < len(c.per_position) else 0 for c in counts) / n for i in range(k)]
    return per, 1.0 + sum(per)


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def bootstrap_gap(served: Sequence[PromptCounts], offline: Sequence[PromptCounts], k: int, *, level: float,
                  resamples: int = 2000, seed: int = 0) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    """Paired cluster bootstrap over prompts: percentile interval at two-sided ``level`` of
    served - offline acceptance per position, and of the tau difference. Resamples where a side drew
    no rounds are skipped (they have no rate)."""
    if len(served) != len(offline):
        raise ValueError(f"paired bootstrap needs one count per prompt on both sides ({len(served)} vs {len(offline)})")
    rng = random.Random(seed)
    m = len(served)
    gaps: list[list[float]] = [[] for _ in range(k)]
    taus: list[float] = []
    for _ in range(resamples):
        pick = [rng.randrange(m) for _ in range(m)]
        ps, ts = rates([served[j] for j in pick], k)
        po, to = rates([offline[j] for j in pick], k)
        if ts is None or to is None:
            continue
        for i in range(k):
            gaps[i].append(ps[i] - po[i])
        taus.append(ts - to)
    if not taus:
        return [(-1.0, 1.0)] * k, (-float(k), float(k))
    a = (1 - level) / 2
    return ([(_quantile(g, a), _quantile(g, 1 - a)) for g in gaps],
            (_quantile(taus, a), _quantile(taus, 1 - a)))


def compare_sides(served: Sequence[PromptCounts], offline: Sequence[PromptCounts], k: int, *, alpha: float = 0.05,
                  margin: float = 0.01, resamples: int = 2000, seed: int = 0) -> dict:
    """The served-vs-offline verdict (see the module docstring) ->
    ``{"positions": [{"position", "served", "offline", "gap", "lower", "upper", "shortfall"}], "tau":
    {"served", "offline", "gap", "lower", "upper"}, "shortfall": bool, "method": str}``."""
    if k < 1:
        raise ValueError(f"k={k}: need at least one drafted position")
    per_test = alpha / k  # Bonferroni over the K positions, one-sided each
    level = 1 - 2 * per_test  # a two-sided interval at this level has one-sided upper limit 1 - per_test
    z = NormalDist().inv_cdf(1 - per_test)
    ps, ts = rates(served, k)
    po, to = rates(offline, k)
    ns, no = sum(c.drafts for c in served), sum(c.drafts for c in offline)
    boot, boot_tau = bootstrap_gap(served, offline, k, level=level, resamples=resamples, seed=seed)
    rows = []
    for i in range(k):
        ks = sum(c.per_position[i] if i < len(c.per_position) else 0 for c in served)
        ko = sum(c.per_position[i] if i < len(c.per_position) else 0 for c in offline)
        nl, nu = newcombe_diff(ks, ns, ko, no, z)
        lo, hi = min(nl, boot[i][0]), max(nu, boot[i][1])
        gap = None if ps[i] is None or po[i] is None else ps[i] - po[i]
        rows.append({"position": i + 1, "served": ps[i], "offline": po[i], "gap": gap, "lower": lo, "upper": hi,
                     "shortfall": bool(ns and no and hi < -margin)})
    tau = {"served": ts, "offline": to, "gap": None if ts is None or to is None else ts - to,
           "lower": boot_tau[0], "upper": boot_tau[1]}
    method = (f"per position: hull of Newcombe's hybrid score interval and a paired cluster bootstrap over "
              f"{len(served)} prompts ({resamples} resamples), one-sided {1 - alpha:.0%} family-wise "
              f"(Bonferroni over K={k}); shortfall = upper limit of served - offline < -{margin}")
    return {"positions": rows, "tau": tau, "shortfall": any(r["shortfall"] for r in rows), "method": method,
            "alpha": alpha, "margin": margin, "drafts": {"served": ns, "offline": no}}
