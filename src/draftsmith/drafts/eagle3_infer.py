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
Rolling back after verification = :meth:`DraftKVCache.crop` to the target slots, then extending
with the real aux states of the newly accepted positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .eagle3 import Eagle3Config, Eagle3Draft, Eagle3Step, refuse_other_family
from .layers import repeat_kv

__all__ = ["DraftKVCache", "extend", "next_hidden", "layer_ids_from_export", "load_exported"]


@dataclass
class DraftKVCache:
    """Rotated keys and values of every slot so far: each (B, h_kv, S, d), or None when empty."""

    keys: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots (drop drafted chain slots after verification)."""
        if length < 0:
            raise ValueError(f"DraftKVCache.crop: length={length} must be >= 0")
        if self.keys is not None and length < len(self):
            self.keys = self.keys[:, :, :length]
            self.values = self.values[:, :, :length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (B, h_kv, T, d) keys/values; return the full (B, h_kv, S+T, d) tensors."""
        if self.keys is None:
            self.keys, self.values = k, v
        else:
            self.keys = torch.cat([self.keys, k], dim=2)
            self.values = torch.cat([self.values, v], dim=2)
        return self.keys, self.values


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


# ---------------------------------------------------------------------------------- loading an export
def layer_ids_from_export(config: dict) -> list[int]:
    refuse_other_family(config, "an EAGLE-3")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError("eagle_config.eagle_aux_hidden_state_layer_ids is missing; "
                         "add the target layer ids the draft was trained on")
    return [int(i) for i in ids]


def _state_key(name: str) -> str:
    """On-disk name (draftsmith `model.`-prefixed or vLLM-stripped) -> Eagle3Draft state_dict name."""
    if name in ("lm_head.weight", "d2t", "t2d", "mask_hidden") or name.startswith("model."):
        return name
    if name.startswith("midlayer."):
        return "model.layers.0." + name[len("midlayer."):]
    return "model." + name


def load_exported(config: dict, state: dict[str, torch.Tensor], target_embeddings: Optional[torch.Tensor] = None,
                  draft: Optional[Eagle3Draft] = None) -> Eagle3Draft:
    """An fp32 eval draft from an export. ``target_embeddings`` (V, H) fills ``embed_tokens`` for
    drafts saved without it (they share the target's, as vLLM does); ``t2d`` is rebuilt from
    ``d2t`` when an export dropped it. ``draft``: a fresh model to fill (P-EAGLE passes its own)."""
    draft = Eagle3Draft(Eagle3Config.from_export(config)) if draft is None else draft
    state = {_state_key(k): v for k, v in state.items()}
    if draft.cfg.pruned and "d2t" in state and "t2d" not in state:
        t2d = torch.zeros(draft.cfg.vocab_size, dtype=torch.bool)
        t2d[torch.arange(draft.cfg.draft_vocab_size) + state["d2t"].long()] = True
        state["t2d"] = t2d
    if "model.embed_tokens.weight" not in state:
        if target_embeddings is None:
            raise ValueError("the draft has no embed_tokens; pass the target's embeddings to share them")
        state["model.embed_tokens.weight"] = target_embeddings.detach().float().cpu()
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"weights do not fit the config (missing {missing[:4]}, unexpected {unexpected[:4]}); "
                         "re-export the draft")
    return draft.float().eval().requires_grad_(False)
