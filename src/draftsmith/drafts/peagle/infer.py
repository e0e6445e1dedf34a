"""P-EAGLE inference: K drafted tokens in ONE draft forward, as vLLM 0.32 serves a parallel draft.

A mixin of :class:`draftsmith.drafts.peagle.model.PEagleDraft` (which supplies ``combine``, ``run_layers``,
``compute_logits``, ``draft_to_target``, ``mask_hidden`` and ``cfg``): model math only, no I/O.

What vLLM 0.32 runs (read from its source; this is what `propose` reproduces):
- vllm/config/speculative.py: `parallel_drafting` is a speculative-config field (config.json's own
  `parallel_drafting` is not read); method stays `eagle3` (speculators `peagle` maps to it).
- vllm/v1/spec_decode/llm_base_proposer.py `_init_parallel_drafting_params`: the mask token is
  `dflash_config.mask_token_id`, else `mask_token_id`, else `dspark_noise_token_id`, `pard_token`,
  `ptd_token_id`. `load_model` computes the mask slots' hidden once as
  `combine_hidden_states(mask_hidden)` (fc_norm + fc, like real aux states).
- Same file, `set_inputs_first_pass` + vllm/v1/spec_decode/utils.py
  `copy_and_expand_eagle_inputs_kernel` (shift_input_ids=True for eagle3): for a request whose new
  target tokens sit at positions p..p+n, draft slot j = (target hidden at p+j, token at p+j+1) at
  position p+j; slot n holds (hidden at p+n, the target's newly sampled "bonus" token); slots
  n+1..n+K-1 hold (mask hidden, mask token) at positions p+n+1..p+n+K-1. Hidden states are not shifted.
  The K sampled rows are slots n..n+K-1 (`token_indices_to_sample`), argmax of `compute_logits`
  (lm_head(norm(.)), draft ids mapped through d2t); `propose` returns after this one forward.
- The draft attends causally through its own KV cache. Cache positions below p were written by
  earlier rounds' real (depth-0) slots; mask slots written in an earlier round sit at positions >= p
  and are overwritten this round. So a mask slot at depth d sees the depth-0 entries (aux_t, token_{t+1})
  of the whole prefix t <= anchor plus mask slots 1..d: exactly the visibility rule of peagle/model.py.
- vllm/model_executor/models/llama_eagle3.py: `LlamaModel` builds `num_hidden_layers` layers; layer 0
  reads cat(input_layernorm(embed), hidden_norm(h)) (2H, residual = h), layers >= 1 are plain Llama
  layers on H (input_layernorm/post_attention_layernorm fused with the residual add). Weights:
  `mask_hidden` (top level, reshaped to (1, n*Ht)), every other non-lm_head name gets `model.` prepended,
  so our `model.layers.{i}.*` keys load once export strips our `model.` prefix. Layers >= 1 also own
  an unused `hidden_norm` that stays at its init; we do not export one.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..layers import DraftKVCache
from ..proposer import DecodeState, Proposal, choose

__all__ = ["PEagleInference", "PEagleProposal", "PEagleProposer"]


class PEagleProposal(NamedTuple):
    """K drafted tokens per row: `token_ids` (B, K) target-vocab ids, `logits` (B, K, Vd) fp32."""

    token_ids: torch.Tensor
    logits: torch.Tensor


class PEagleInference:
    """`propose` (a full recompute, the reference) and `propose_cached` (depth-0 slots kept in
    per-layer KV caches across rounds, as vLLM's draft KV cache keeps them)."""

    def propose(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor,
                num_tokens: int | None = None) -> PEagleProposal:
        """Draft K tokens after a context in one forward, as vLLM's parallel-drafting eagle3 proposer does.

        aux_hidden (B, T, n, Ht): target aux states at positions 0..T-1; input_ids (B, T): token_{t+1},
        so input_ids[:, -1] is the target's newest (bonus) token. The flat sequence is T real slots
        (fc(aux_t), token_{t+1}) at positions 0..T-1 then K-1 (fc(mask_hidden), mask_token_id) slots at
        T..T+K-2, under a plain causal mask (what vLLM's KV cache gives); rows T-1..T+K-2 are sampled.
        A full recompute, no cache. Wrap in torch.no_grad() for inference.
        """
        k = self.cfg.num_depths if num_tokens is None else num_tokens
        if k < 1:
            raise ValueError(f"num_tokens={k} must be >= 1")
        b, t = input_ids.shape
        h = self.combine(aux_hidden)  # (B, T, H)
        hidden = torch.cat([h, self.combine(self.mask_hidden).to(h.dtype).expand(b, k - 1, -1)], 1)  # (B, S, H)
        ids = torch.cat([input_ids, input_ids.new_full((b, k - 1), self.cfg.mask_token_id)], 1)  # (B, S)
        s = t + k - 1
        positions = torch.arange(s, device=input_ids.device).expand(b, s)
        causal = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()[None, None]  # (1, 1, S, S) bool
        logits = self.compute_logits(self.run_layers(hidden, ids, positions, causal)[:, t - 1:])  # (B, K, Vd)
        return PEagleProposal(self.draft_to_target(logits.argmax(-1)), logits)

    def new_cache(self) -> list[DraftKVCache]:
        """Empty per-layer KV caches for :meth:`propose_cached`."""
        return [DraftKVCache() for _ in self.model.layers]

    def propose_cached(self, caches: list[DraftKVCache], aux_hidden: torch.Tensor, input_ids: torch.Tensor,
                       num_tokens: int) -> PEagleProposal:
        """:meth:`propose` over a prefix whose first S depth-0 slots are already in ``caches`` (vLLM's
        draft KV cache): equal to ``propose`` on the whole prefix up to float rounding.

        caches: from :meth:`new_cache`, every layer holding the depth-0 slots of positions 0..S-1;
        aux_hidden (B, T, n, Ht) and input_ids (B, T), T >= 1: the next depth-0 slots (positions
        S..S+T-1, the last one carrying the bonus token). They are appended for good (depth-0 slots
        are committed context, never drafts); the K-1 mask slots after them are dropped again.
        """
        k, b, t = num_tokens, input_ids.shape[0], input_ids.shape[1]
        past = len(caches[0])
        if k < 1 or t < 1 or any(len(c) != past for c in caches):
            raise ValueError(f"propose_cached: num_tokens={k} and new slots={t} must be >= 1, and every layer's "
                             f"cache must hold the same slots (got {[len(c) for c in caches]})")
        h = self.combine(aux_hidden)  # (B, T, H)
        hidden = torch.cat([h, self.combine(self.mask_hidden).to(h.dtype).expand(b, k - 1, -1)], 1)  # (B, N, H)
        ids = torch.cat([input_ids, input_ids.new_full((b, k - 1), self.cfg.mask_token_id)], 1)  # (B, N)
        n = t + k - 1
        positions = torch.arange(past, past + n, device=input_ids.device).expand(b, n)
        # new slot i (position past + i) sees cached and new keys j <= past + i: (1, 1, N, S + N)
        visible = torch.arange(past + n, device=input_ids.device)[None] <= positions[0, :, None]
        normed = self.run_layers(hidden, ids, positions, visible[None, None], caches)  # bool, True = visible
        for c in caches:
            c.crop(past + t)  # keep the depth-0 slots, drop this round's mask slots
        logits = self.compute_logits(normed[:, t - 1:])  # (B, K, Vd)
        return PEagleProposal(self.draft_to_target(logits.argmax(-1)), logits)


class PEagleProposer:
    """Parallel proposer for a P-EAGLE draft: one draft forward per round drafts the first K depths,
    as vLLM 0.32's parallel-drafting eagle3 proposer does (:meth:`PEagleInference.propose`).

    Target slot t = (aux_t, token_{t+1}) for every processed position, the last one carrying the
    newest committed token, then K-1 (mask_hidden, mask_token_id) slots; rows n-1..n+K-2 give d_1..d_K.
    A mask slot at depth d sees only earlier slots, so K < num_depths drafts exactly the first K
    depths. The depth-0 slots are committed context and stay in per-layer KV caches across rounds
    (``cache=True``; vLLM keeps them the same way); only the new ones and the K-1 mask slots run each
    round. ``cache=False`` recomputes the whole prefix every round (the reference).
    Sampling: the K depths' distributions are independent (no depth sees another's token).
    """

    kind = "parallel"

    def __init__(self, draft, cache: bool = True):
        self.draft, self.use_cache = draft, cache
        self.target_ids = draft.draft_to_target(torch.arange(draft.cfg.draft_vocab_size,
                                                             device=draft.lm_head.weight.device))  # (Vd,)
        self.reset()

    @property
    def max_k(self) -> int:
        """The depths it was trained for; deeper mask slots were never supervised."""
        return self.draft.cfg.num_depths

    default_k = trained_k = max_k  # vLLM serves it with num_speculative_tokens = num_depths

    @property
    def k_knob(self) -> str:
        """What bounds K, for -k errors."""
        return f"num_depths={self.max_k}"

    def reset(self) -> None:
        self.caches = self.draft.new_cache()
        self.filled = 0  # depth-0 slots in the caches

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        d, k = self.draft, state.k
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k={k}: this P-EAGLE draft drafts num_depths={self.max_k} tokens per forward; "
                             f"use 1 <= k <= {self.max_k}")
        n = state.aux.shape[0]  # processed positions; tokens[n] is the newest committed token
        dev = d.lm_head.weight.device
        start = self.filled if self.use_cache else 0
        aux = state.aux[start:n].to(dev)[None]  # (1, T, n_aux, Ht)
        ids = torch.tensor([state.tokens[start + 1 : n + 1]], device=dev)  # (1, T): token_{t+1}
        if self.use_cache:
            out = d.propose_cached(self.caches, aux, ids, k)
            self.filled = n
        else:
            out = d.propose(aux, ids, k)
        tokens, q = choose(out.logits[0], self.target_ids, d.cfg.vocab_size, state)  # (K,), (K, V) | None
        return Proposal(tokens, q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        pass  # only committed depth-0 slots are cached; the mask slots were dropped in propose
