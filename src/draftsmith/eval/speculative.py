"""Speculative decoding with exact verification, independent of how drafts propose or targets run.

One round (batch 1): the target has processed ``tokens[:-1]`` (its KV cache) and ``tokens[-1]`` is
the last committed token. A :class:`Proposer` drafts K target-vocab ids d_1..d_K (plus, when
sampling, its distributions q_1..q_K over the target vocab). The target runs ONE forward over
``[tokens[-1], d_1..d_K]`` and gets p_0..p_K (p_i predicts the token after d_i, p_0 the one after
tokens[-1]). Then:

- greedy: accept the longest prefix with d_i == argmax p_{i-1}, then the bonus token argmax p_a;
- sampling: accept d_i with probability min(1, p_{i-1}(d_i) / q_i(d_i)); at the first rejection
  sample from norm(max(0, p_{i-1} - q_i)) and stop; if all K pass, sample the bonus from p_K.
  This leaves the committed tokens distributed exactly as the target's (Leviathan et al. 2023).

The target cache is cropped to the accepted prefix, the aux states of the accepted positions are
appended to the state, and the proposer is told how many of its tokens survived. Chain drafts
(EAGLE-3) propose step by step; parallel (P-EAGLE) and block (DFlash) drafts propose K tokens in one
forward; all of them plug in here unchanged because only ``propose`` differs.

Like vLLM, every round proposes the full K even when fewer tokens remain before ``max_new_tokens``
and counts its acceptance in full; tokens past the budget (or after an EOS) are dropped afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Protocol, Sequence

import torch

# the proposer protocol lives with the drafts that implement it (drafts never import eval/)
from draftsmith.drafts.proposer import DecodeState, Proposal, Proposer

__all__ = [
    "DecodeState", "Generation", "Proposal", "Proposer", "TargetRunner",
    "generate_plain", "generate_speculative", "pick_token", "verify_greedy", "verify_sampling",
]


class TargetRunner(Protocol):
    """The target with a KV cache (batch 1)."""

    def reset(self) -> None: ...

    def forward(self, ids: Sequence[int], *, aux: bool, last_only: bool = False):
        """Append ``ids`` after the cached ones; return (logits (T, V) fp32 — (1, V) with
        ``last_only`` —, aux (T, n_aux, H) or None)."""

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached positions."""


@dataclass
class Generation:
    """One generated continuation and its acceptance record (one entry per verification round)."""

    tokens: list[int]  # generated ids, truncated at max_new_tokens / after the first EOS
    accepted: list[int] = field(default_factory=list)  # accepted drafts per round, each in 0..K
    wall_s: float = 0.0


def pick_token(logits: torch.Tensor, temperature: float, generator: Optional[torch.Generator]) -> int:
    """argmax of (V,) logits when temperature == 0, else a sample from softmax(logits / temperature)."""
    if temperature <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=generator))


def verify_greedy(draft_tokens: torch.Tensor, logits: torch.Tensor) -> tuple[int, list[int]]:
    """draft (K,), target logits (K+1, V) -> (a, committed tokens d_1..d_a + bonus argmax p_a)."""
    top = logits.argmax(-1).tolist()  # (K+1,)
    drafted = draft_tokens.tolist()
    a = 0
    while a < len(drafted) and drafted[a] == top[a]:
        a += 1
    return a, drafted[:a] + [top[a]]


def verify_sampling(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: Optional[torch.Generator]
) -> tuple[int, list[int]]:
    """Rejection sampling. draft (K,), q (K, V) draft probs, p (K+1, V) target probs at the same
    temperature -> (a, committed tokens). u ~ U[0, 1) accepts d_i when u * q_i(d_i) < p_{i-1}(d_i)."""
    drafted = draft_tokens.tolist()
    for i, d in enumerate(drafted):
        # drawn where the generator lives (a CUDA generator cannot fill a CPU tensor); eval keeps it on p's device
        u = float(torch.rand((), generator=generator, device=generator.device if generator is not None else p.device))
        if u * float(q[i, d]) < float(p[i, d]):
            continue
        residual = (p[i] - q[i]).clamp(min=0)  # (V,) the mass the draft under-proposed
        total = float(residual.sum())
        # total == 0 only when p == q on the support, where rejection has probability 0; guard rounding.
        dist = residual / total if total > 0 else p[i]
        return i, drafted[:i] + [int(torch.multinomial(dist, 1, generator=generator))]
    return len(drafted), drafted + [int(torch.multinomial(p[-1], 1, generator=generator))]


def _finished(tokens: list[int], start: int, max_new_tokens: int, eos: set[int]) -> bool:
    return len(tokens) - start >= max_new_tokens or any(t in eos for t in tokens[start:])


def _truncate(generated: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    out = generated[:max_new_tokens]
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


@torch.no_grad()
def generate_plain(
    target: TargetRunner,
    prompt: Sequence[int],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_ids: Sequence[int] = (),
    generator: Optional[torch.Generator] = None,
) -> Generation:
    """Plain autoregressive decoding of the target: one token per forward (the baseline)."""
    import time

    t0 = time.perf_counter()
    eos = set(eos_ids)
    target.reset()
    logits, _ = target.forward(list(prompt), aux=False, last_only=True)
    tokens = [pick_token(logits[-1], temperature, generator)]
    while not _finished(tokens, 0, max_new_tokens, eos):
        logits, _ = target.forward(tokens[-1:], aux=False)
        tokens.append(pick_token(logits[-1], temperature, generator))
    return Generation(_truncate(tokens, max_new_tokens, eos), wall_s=time.perf_counter() - t0)


@torch.no_grad()
def generate_speculative(
    target: TargetRunner,
    proposer: Proposer,
    prompt: Sequence[int],
    *,
    k: int,
    max_new_tokens: int,
    temperature: float = 0.0,
    eos_ids: Sequence[int] = (),
    generator: Optional[torch.Generator] = None,
) -> Generation:
    """Speculative decoding of ``prompt`` with ``k`` drafted tokens per target forward."""
    import time

    if k < 1:
        raise ValueError(f"k={k}: the number of speculative tokens must be >= 1")
    t0 = time.perf_counter()
    eos = set(eos_ids)
    target.reset()
    proposer.reset()
    logits, aux = target.forward(list(prompt), aux=True, last_only=True)  # aux (n, n_aux, H)
    first = pick_token(logits[-1], temperature, generator)
    state = DecodeState(list(prompt) + [first], aux, len(prompt), k, temperature, generator)
    accepted: list[int] = []
    while not _finished(state.tokens, state.prompt_len, max_new_tokens, eos):
        prop = proposer.propose(state)
        if prop.tokens.numel() != k:
            raise ValueError(f"{type(proposer).__name__}.propose returned {prop.tokens.numel()} tokens, expected k={k}")
        committed_len = len(state.tokens)  # target cache holds committed_len - 1 positions
        logits, aux = target.forward([state.tokens[-1]] + prop.tokens.tolist(), aux=True)  # (K+1, V)
        if temperature <= 0:
            a, new = verify_greedy(prop.tokens, logits)
        else:
            if prop.q is None:
                raise ValueError(f"{type(proposer).__name__}.propose gave no q; sampling needs the draft probabilities")
            p = torch.softmax(logits / temperature, -1)  # (K+1, V)
            a, new = verify_sampling(prop.tokens, prop.q, p, generator)
        target.crop(committed_len + a)  # keep tokens[-1] and the accepted drafts, drop the rest
        state.aux = torch.cat([state.aux, aux[: a + 1]], 0)
        state.tokens.extend(new)
        accepted.append(a)
        proposer.commit(state, a)
    generated = _truncate(state.tokens[state.prompt_len:], max_new_tokens, eos)
    return Generation(generated, accepted, time.perf_counter() - t0)
