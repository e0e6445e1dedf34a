"""The proposer protocol the exact evaluator drives (eval/speculative.py's verify loop, eval/offline.py,
the trainer's real-tau hook), and the draft-token choice every family's proposer shares.

Each family's ``Proposer`` (its api module; e.g. drafts/eagle3/infer.py ``Eagle3Proposer``) runs its
draft as a serving engine would: ``kind`` "chain" | "parallel" | "block"; ``max_k`` (None = any K),
``default_k`` (eval without -k), ``trained_k`` (the trainer hook's K) and ``k_knob`` (the config
field that bounds K, named in -k errors). Model math only: no I/O, no engines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol

import torch

__all__ = ["DecodeState", "Proposal", "Proposer", "choose"]


@dataclass
class Proposal:
    """K drafted tokens: ``tokens`` (K,) int64 target ids; ``q`` (K, V) draft probabilities over the
    target vocab (zero outside the draft vocab), required when sampling, None for greedy."""

    tokens: torch.Tensor
    q: Optional[torch.Tensor] = None


@dataclass
class DecodeState:
    """What a proposer may read. ``aux[t]`` (n_aux, H) is the target's aux states at position t for
    every position the target has processed, i.e. ``len(aux) == len(tokens) - 1``."""

    tokens: list[int]
    aux: torch.Tensor  # (len(tokens) - 1, n_aux, H)
    prompt_len: int
    k: int
    temperature: float = 0.0
    generator: Optional[torch.Generator] = None


class Proposer(Protocol):
    """A draft behind the verification loop. ``kind``: "chain" | "parallel" | "block"."""

    kind: str

    def reset(self) -> None:
        """Forget everything (a new prompt starts)."""

    def propose(self, state: DecodeState) -> Proposal:
        """Draft ``state.k`` tokens continuing ``state.tokens``."""

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        """The target accepted ``num_accepted`` of the last proposal; ``state`` already holds the result."""


def choose(logits: torch.Tensor, target_ids: torch.Tensor, vocab_size: int, state: DecodeState):
    """(R, Vd) draft logits -> (R,) target ids, q (R, V) over the target vocab or None when greedy.

    Greedy: argmax. Sampling: each row from softmax(logits / T) on its own, q zero outside the draft
    vocab; vLLM's ``draft_sample_method="probabilistic"`` does the same (llm_base_proposer.py
    ``compute_probs_and_sample_next_token``: temperature only, no top-k/top-p, probs over the target
    vocab because ``compute_logits`` puts -inf outside the draft vocab). vLLM's default
    ``draft_sample_method="greedy"`` instead drafts the argmax and treats q as one-hot.
    """
    if state.temperature <= 0:
        return target_ids[logits.argmax(-1)].cpu(), None
    q_draft = torch.softmax(logits.float() / state.temperature, -1)  # (R, Vd)
    j = torch.multinomial(q_draft, 1, generator=state.generator)[:, 0]  # (R,)
    q = torch.zeros(logits.shape[0], vocab_size, dtype=torch.float32, device=q_draft.device)
    q[:, target_ids] = q_draft
    return target_ids[j].cpu(), q
