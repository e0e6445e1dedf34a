"""KV-cached incremental inference for the EAGLE-3 draft: what a serving engine runs per draft step.

Model math only (no I/O, no engines). The draft's cache is one sequence of slots; slot ``s`` at
position ``p_s`` holds the rotated key and the value of ``x_s = cat(input_layernorm(embed(tok_s)),
hidden_norm(h_s))``, and every query attends causally to all slots up to and including its own:

- target slots: ``h_s = fc(aux_s)`` (the target's aux states at position s) and ``tok_s = token_{s+1}``;
- chain slots, appended after the last target slot ``n-1``: chain step j sits at position ``n-1+j``,
  reads the previous step's output state (``h_pre``, or ``norm(h_pre)`` with ``norm_output``) and
  the token the previous step drafted.

This is exactly what training-time test simulates (TTT step k at slot t sees step-0 keys at
positions <= t plus its own chain's diagonal keys, rotated at t + k), so the chain step j from slot
t reproduces TTT step j at slot t when fed the same tokens (tests/drafts/test_eagle3_infer.py).
Rolling back after verification = :meth:`DraftKVCache.crop` (drafts/layers.py) to the target slots,
then extending with the real aux states of the newly accepted positions: :class:`Eagle3Proposer`, the
chain proposer the exact evaluator (eval/offline.py) and the trainer's real-tau hook drive.
"""

from __future__ import annotations

import math

import torch

from ..layers import DraftKVCache, repeat_kv
from ..proposer import DecodeState, Proposal, choose
from .model import Eagle3Draft, Eagle3Step

__all__ = ["extend", "next_hidden", "Eagle3Proposer"]


def extend(
    draft: Eagle3Draft,
    cache: DraftKVCache,
    hidden: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
) -> Eagle3Step:
    """Append T slots to ``cache`` and run the draft layer on them.

    hidden (B, T, H): the slot's draft state (``draft.combine(aux)`` for target slots, the previous
    step's :func:`next_hidden` for chain slots); token_ids (B, T) target-vocab ids; positions (B, T)
    int64 RoPE positions. Query i attends to the S cached slots and new slots 0..i (causal).
    Returns ``Eagle3Step(hidden=h_pre (B, T, H), logits=(B, T, Vd) fp32, normed=norm(h_pre))``.
    """
    cfg, layer = draft.cfg, draft.model.layers[0]
    b, t = token_ids.shape
    hidden = hidden.to(draft.model.fc.weight.dtype)
    cos, sin = draft.rotary(positions)
    x = layer.fuse(draft.model.embed_tokens(token_ids), hidden)  # (B, T, 2H)
    q, k, v = layer.self_attn.project(x, cos, sin)  # (B, h, T, d), (B, h_kv, T, d) x2
    past = len(cache)
    keys, values = cache.append(k, v)
    n_rep = cfg.num_attention_heads // cfg.num_key_value_heads
    keys, values = repeat_kv(keys, n_rep), repeat_kv(values, n_rep)  # (B, h, S+T, d)
    # scores (B, h, T, S+T): new slot i sees key j iff j <= S + i
    scores = (q @ keys.transpose(-1, -2)).float() / math.sqrt(cfg.head_dim)
    visible = torch.arange(past + t, device=q.device)[None, :] <= (past + torch.arange(t, device=q.device))[:, None]
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1).to(values.dtype)
    h_pre = layer.finish(probs @ values, residual=layer.residual(hidden))  # (B, h, T, d) -> (B, T, H)
    normed = draft.model.norm(h_pre)
    return Eagle3Step(hidden=h_pre, logits=draft.compute_logits(normed), normed=normed)


def next_hidden(draft: Eagle3Draft, step: Eagle3Step) -> torch.Tensor:
    """The state the next chain step reads: ``norm(h_pre)`` with ``norm_output`` (EAGLE-3.1), else ``h_pre``."""
    if not draft.cfg.norm_output:
        return step.hidden
    return step.normed if step.normed is not None else draft.model.norm(step.hidden)


class Eagle3Proposer:
    """Chain proposer for an EAGLE-3 draft, as vLLM 0.32's EAGLE proposer runs it: keeps its own cache
    of target slots, drafts a chain of K tokens on top of it, and after verification drops the chain
    slots and refills the newly accepted positions with the target's real aux states."""

    kind = "chain"

    def __init__(self, draft: Eagle3Draft):
        self.draft = draft
        vd = draft.cfg.draft_vocab_size
        self.target_ids = draft.draft_to_target(torch.arange(vd, device=draft.lm_head.weight.device))  # (Vd,)
        self.reset()

    def reset(self) -> None:
        self.cache = DraftKVCache()
        self.filled = 0  # target slots in the cache: slot t = (aux_t, token_{t+1})

    @property
    def default_k(self) -> int:
        """K when ``draftsmith eval`` gets no -k: 3, vLLM's usual num_speculative_tokens for EAGLE-3."""
        return 3

    @property
    def trained_k(self) -> int:
        """K of the trainer's real-tau hook: the TTT steps the chain was trained for."""
        return self.draft.cfg.ttt_steps

    max_k = None  # a chain can be unrolled to any K
    k_knob = None

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        d = self.draft
        self.cache.crop(self.filled)  # drop last round's chain slots
        n = state.aux.shape[0]
        dev = d.lm_head.weight.device
        # Target slots filled..n-1 read (aux_t, token_{t+1}); tokens[n] is the newest committed token.
        aux = state.aux[self.filled : n].to(dev)[None]  # (1, T, n_aux, Ht)
        ids = torch.tensor([state.tokens[self.filled + 1 : n + 1]], device=dev)  # (1, T)
        pos = torch.arange(self.filled, n, device=dev)[None]
        step = extend(d, self.cache, d.combine(aux), ids, pos)
        self.filled = n
        tokens, qs = [], []
        for j in range(state.k):
            picked, q = choose(step.logits[0, -1:], self.target_ids, d.cfg.vocab_size, state)  # (1,), (1, V)
            tok = int(picked[0])
            tokens.append(tok)
            qs.append(None if q is None else q[0])
            if j + 1 < state.k:  # chain step j+1 at position n-1+j+1 reads the state that drafted tok
                h = next_hidden(d, step)[:, -1:]
                step = extend(d, self.cache, h, torch.tensor([[tok]], device=dev), torch.tensor([[n + j]], device=dev))
        q = torch.stack(qs) if state.temperature > 0 else None
        return Proposal(torch.tensor(tokens), q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        self.cache.crop(self.filled)  # chain slots were computed from drafted states: refill lazily
