"""The block families' offline proposer (DFlash, JetSpec, Domino, DSpark): what the exact evaluator and
the trainer's real-tau hook drive, as vLLM 0.32's ``dflash`` and ``dspark`` methods run a block draft."""

from __future__ import annotations

from typing import Any, Optional

import torch

from .proposer import DecodeState, Proposal, choose

__all__ = ["BlockProposer", "load_block_export"]


class BlockProposer:
    """Block proposer for any :class:`~draftsmith.drafts.block.BlockDraft`, as vLLM 0.32's ``dflash``
    method runs a draft (``qwen3_dflash.py``, ``v1/spec_decode/dflash.py``; ``dspark`` alike):

    - context: the target's states at every committed position t < n go through fc + hidden_norm and
      each layer's k/v projections ONCE (``precompute_and_store_context_kv``) and stay cached; they are
      appended as positions are committed and never recomputed (committed positions never change);
    - block: [newest committed token, MASK x K] at positions n..n+K, one draft forward in which the
      block sees the whole cached context and itself (bidirectional, or causal for JetSpec); rows
      1..K give d_1..d_K through the target's lm_head (label offset 1, Domino and DSpark: K slots
      [anchor, MASK x K-1], rows 0..K-1, then the family's walk over its sequential head).
    1 <= K <= the tokens one block drafts (block_size - 1; with a label offset of 1: block_size).
    """

    kind = "block"

    def __init__(self, draft: Any):
        self.draft = draft
        self.target_ids = torch.arange(draft.cfg.vocab_size)  # the full target vocab
        self.reset()

    @property
    def max_k(self) -> int:
        return self.draft.max_k

    default_k = trained_k = max_k  # vLLM serves it with num_speculative_tokens = block_size - 1

    @property
    def k_knob(self) -> str:
        """What bounds K, for -k errors."""
        return f"block_size={self.draft.cfg.block_size}"

    def reset(self) -> None:
        self.kvs = None  # per layer (k, v), each (1, h_kv, filled, d)
        self.filled = 0

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        from . import DraftError

        d, k = self.draft, state.k
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k={k}: this block draft drafts {self.max_k} tokens per forward; use 1 <= k <= {self.max_k}")
        if state.temperature > 0 and getattr(d, "greedy_only", None):
            raise DraftError(f"{d.greedy_only}; pass --temperature 0")
        n = state.aux.shape[0]  # committed positions with target states; tokens[n] is the anchor
        dev = d.fc.weight.device
        if n > self.filled:
            pos = torch.arange(self.filled, n, device=dev)[None]
            new = d.context_kv(d.context(state.aux[self.filled : n].to(dev)[None]), pos)
            self.kvs = new if self.kvs is None else [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2))
                                                     for (k0, v0), (k1, v1) in zip(self.kvs, new)]
            self.filled = n
        logits = d.propose(self.kvs, int(state.tokens[n]), n, k)  # (K, V)
        tokens, q = choose(logits, self.target_ids.to(logits.device), d.cfg.vocab_size, state)
        return Proposal(tokens, q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        pass  # only committed context is cached; the block is recomputed every round


def load_block_export(model: Any, state: dict, target_embeddings: Optional[torch.Tensor] = None,
                      target_lm_head: Optional[torch.Tensor] = None, hint: str = "") -> Any:
    """A block draft ``model`` with an export's tensors (on-disk names) loaded for fp32 inference, borrowing
    the target's embeddings and lm_head (``target_lm_head`` None: the embeddings, a tied target); a
    ValueError names what does not fit (``hint`` ends it: what the weights should be)."""
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    if missing or unexpected:
        raise ValueError(f"weights do not fit a {type(model).__name__}: missing {missing[:4]}, unexpected "
                         f"{unexpected[:4]}; {hint}")
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in own.items() if state[k].shape != v.shape]
    if bad:
        raise ValueError(f"weight shapes do not fit config.json: {'; '.join(bad[:3])}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    if target_embeddings is not None:
        head = target_lm_head if target_lm_head is not None else target_embeddings
        model.attach_target(target_embeddings.float(), head.float())
    return model.eval()
