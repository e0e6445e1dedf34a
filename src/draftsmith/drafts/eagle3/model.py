"""EAGLE-3 / EAGLE-3.1 draft: one fused decoder layer over (token embedding, fused target state).

Model math only. Module names equal the on-disk names of docs/reference/layouts.md (vLLM's
LlamaForCausalLMEagle3 after stripping the `model.` prefix), so `state_dict()` is the checkpoint.

Inference step (what vLLM computes, and what each training-time-test step reproduces):
    a       = input_norm(cat_i aux_i) if norm_before_fc else cat_i aux_i      (B, T, n*Ht)
    h       = fc(cat_i fc_norm_i(a_i))                        (B, T, n*Ht) -> (B, T, H)
    x       = cat(input_layernorm(embed(ids)), hidden_norm(h)) (B, T, 2H)
    r       = res + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))   RoPE on q, k;
              res = hidden_norm(h) if norm_before_residual else h
    h_pre   = r + mlp(post_attention_layernorm(r))
    logits  = lm_head(norm(h_pre))                              over the draft vocab
    h_next  = norm(h_pre) if norm_output else h_pre            fed to the next draft step
"""


from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..chunked import attention_rows
from ..layers import (LossParts, RMSNorm, RotaryEmbedding, RowGenerators, SwiGLU, apply_rotary, conditional_rates,
                      document_positions)
from .config import Eagle3Config
from .ttt import (LOGIT_BLOCK_ELEMENTS, SCORE_BLOCK_ELEMENTS, attention_mask, frozen_head, logits_fn, same_document,
                  soft_ce_block, soft_ce_rows, step_kv, step_rows, ttt_attention, ttt_step_rows)

__all__ = ["Eagle3Draft", "Eagle3Output", "Eagle3Step", "Eagle3Model", "simulated_tau", "shift_left",
           "add_eagle_modules", "attach_target", "summarize", "scalars", "describe", "PROGRESS"]

PROGRESS = {"acc": "acc0", "tau": "simulated_tau"}  # progress-bar label -> scalars() key
FREEZE_EMBEDDINGS = True  # draft.freeze_embeddings when the run config leaves it null


def simulated_tau(prefix_correct: torch.Tensor, step_count: torch.Tensor) -> float:
    """1 + sum_k prefix_correct_k / max(step_count_k, 1), from (K,) sums aggregated over batches."""
    rate = prefix_correct.double() / step_count.double().clamp(min=1)
    return 1.0 + float(rate.sum())


@dataclass
class Eagle3Output:
    """Training-time-test result. `loss` carries grad; the rest are detached (K,) batch sums."""

    loss: torch.Tensor
    step_losses: torch.Tensor  # (K,) per-step soft CE, each normalised by its supervised positions
    step_correct: torch.Tensor  # (K,) int64: argmax agrees with the target's full-vocab argmax
    prefix_correct: torch.Tensor  # (K,) int64: steps 0..k all agree at the same start position
    # (K,) int64: loss-mask positions with a step-k target, INCLUDING those whose target lies outside
    # the draft vocab (a certain miss, as vLLM counts it); the loss skips those (no logit for them)
    step_count: torch.Tensor
    parts: Optional[LossParts] = None  # loss = parts.loss(): step k's CE sum / its count, weighted

    @property
    def sums(self) -> dict[str, torch.Tensor]:
        """The (K,) counts that add up across micro-batches (see :func:`summarize`)."""
        return {"step_correct": self.step_correct, "prefix_correct": self.prefix_correct, "step_count": self.step_count}

    @property
    def step_accuracy(self) -> torch.Tensor:
        """(K,) per-step top-1 agreement rate."""
        return self.step_correct.double() / self.step_count.double().clamp(min=1)

    @property
    def simulated_tau(self) -> float:
        """Expected tokens per target forward if the chain stops at the first miss (bonus included)."""
        return simulated_tau(self.prefix_correct, self.step_count)


class Eagle3Step(NamedTuple):
    """One TTT step: `hidden` = h_pre (B, T, H) before the final norm; `logits` (B, T, Vd) fp32
    (None when `iter_steps(..., logits=False)`); `normed` = norm(h_pre) (B, T, H)."""

    hidden: torch.Tensor
    logits: torch.Tensor | None
    normed: torch.Tensor | None = None


def shift_left(x: torch.Tensor, k: int) -> torch.Tensor:
    """Shift along dim 1 by k with a zero tail: out[:, t] = x[:, t + k] (0 when t + k >= T)."""
    if k == 0:
        return x
    out = torch.zeros_like(x)
    if k < x.shape[1]:
        out[:, : x.shape[1] - k] = x[:, k:]
    return out


class Eagle3Attention(nn.Module):
    """Q/K/V/O projections; q/k/v read the fused 2H input (`input_size`, default 2H; P-EAGLE's
    layers 1..L-1 read H). The attention pattern lives in the draft."""

    def __init__(self, cfg: Eagle3Config, input_size: int | None = None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        inp = 2 * h if input_size is None else input_size
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(inp, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(inp, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(inp, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, 2H or input_size) -> q (B, h, T, d), k and v (B, h_kv, T, d); q, k rotated by cos/sin (B, T, d)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v


class Eagle3DecoderLayer(nn.Module):
    """The single fused draft layer (`model.layers.0.*`)."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)
        self.norm_before_residual = cfg.norm_before_residual

    def residual(self, hidden: torch.Tensor) -> torch.Tensor:
        """The residual stream the layer adds to: the draft state h (B, T, H), or hidden_norm(h) with
        ``norm_before_residual`` (vLLM's ``_norm_before_residual``)."""
        return self.hidden_norm(hidden) if self.norm_before_residual else hidden

    def fuse(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """(B, T, H) token embeddings + (B, T, H) draft state -> (B, T, 2H) attention input."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn (B, h, T, d) from softmax(QK^T)V, residual (B, T, H) -> h_pre (B, T, H)."""
        b, _, t, _ = attn.shape
        r = residual + self.self_attn.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        return r + self.mlp(self.post_attention_layernorm(r))


class Eagle3Model(nn.Module):
    """Everything under the `model.` prefix."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.fc = nn.Linear(cfg.num_aux * cfg.target_hidden_size, cfg.hidden_size, bias=False)
        if cfg.norm_before_fc:  # one RMSNorm over all n*Ht concatenated aux features (vLLM: `input_norm`)
            self.input_norm = RMSNorm(cfg.num_aux * cfg.target_hidden_size, cfg.rms_norm_eps)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, cfg.rms_norm_eps) for _ in range(cfg.num_aux))
        self.layers = nn.ModuleList([Eagle3DecoderLayer(cfg)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


# ---------------------------------------------------------------------------------- the EAGLE head
# Shared by EAGLE-3 and P-EAGLE (P-EAGLE's layer 0, fc, norm, lm_head and vocab map are these, under the
# same on-disk names): functions over any draft built by add_eagle_modules, each installed as a method
# of both draft classes. ``self`` is that draft.


def add_eagle_modules(self: nn.Module, cfg: Eagle3Config) -> None:
    """Build the EAGLE-3 modules on ``self`` in checkpoint order: ``model`` (embed_tokens, fc, norms,
    layer 0, norm), ``lm_head`` over the draft vocab, the rotary table, and d2t/t2d when pruned."""
    self.cfg = cfg
    self.model = Eagle3Model(cfg)
    self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
    self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
    if cfg.pruned:
        # Default map until set_vocab_map: draft id i -> target id i.
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[: cfg.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)


def set_vocab_map(self: nn.Module, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Install the draft-vocab map: d2t (Vd,) int64 offsets (target = draft + d2t[draft]), t2d (V,) bool."""
    vd, v = self.cfg.draft_vocab_size, self.cfg.vocab_size
    if tuple(d2t.shape) != (vd,) or tuple(t2d.shape) != (v,):
        raise ValueError(
            f"vocab map shapes d2t={tuple(d2t.shape)}, t2d={tuple(t2d.shape)} do not match the draft; "
            f"expected d2t ({vd},) and t2d ({v},) (rebuild the map for this draft_vocab_size/vocab_size)"
        )
    if not self.cfg.pruned:
        if d2t.any():
            raise ValueError("d2t must be all zeros for an unpruned draft (draft_vocab_size == vocab_size)")
        return
    targets = torch.arange(vd, device=d2t.device) + d2t.long()
    if targets.min() < 0 or targets.max() >= v:
        raise ValueError(f"d2t maps draft ids to target ids {int(targets.min())}..{int(targets.max())}, "
                         f"outside 0..{v - 1}; d2t must hold target_id - draft_id offsets")
    if int(t2d.sum()) != vd or not bool(t2d.to(d2t.device)[targets].all()):
        raise ValueError(f"t2d marks {int(t2d.sum())} ids but must mark exactly the {vd} targets of d2t")
    self.d2t.copy_(d2t.long())
    self.t2d.copy_(t2d.bool())


def draft_to_target(self, ids: torch.Tensor) -> torch.Tensor:
    """Draft-vocab ids (any shape) -> target-vocab ids: `ids + d2t[ids]` (identity when unpruned)."""
    return ids + self.d2t[ids] if self.cfg.pruned else ids


@torch.no_grad()
def load_target_embeddings(self, embed: torch.Tensor, freeze: bool = True) -> None:
    """Copy the target's input embedding (V, H); frozen (requires_grad False) by default."""
    w = self.model.embed_tokens.weight
    if embed.shape != w.shape:
        raise ValueError(f"target embeddings {tuple(embed.shape)} do not match embed_tokens {tuple(w.shape)}; "
                         "the draft hidden_size and vocab_size must equal the target's")
    w.copy_(embed)
    w.requires_grad_(not freeze)


@torch.no_grad()
def init_from_target(self, lm_head_weight: torch.Tensor, draft_ids: torch.Tensor,
                     final_norm_weight: torch.Tensor | None = None) -> None:
    """Start the draft in the target's output space.

    - lm_head = target lm_head rows (V, H)[draft_ids (Vd,)] (call `set_vocab_map` first when pruned);
    - norm = the target's final norm (H,), so norm + lm_head is exactly the target's head;
    - fc passes the deepest aux state through (identity on the last Ht block) when H == Ht, so
      step 0 starts from the target's own late residual stream instead of a random projection.
    """
    vd, h = self.lm_head.weight.shape
    if lm_head_weight.shape != (self.cfg.vocab_size, h):
        raise ValueError(f"target lm_head {tuple(lm_head_weight.shape)} must be ({self.cfg.vocab_size}, {h})")
    ids = draft_ids.long().to(lm_head_weight.device)
    expected = self.draft_to_target(torch.arange(vd, device=self.lm_head.weight.device)).to(ids.device)
    if ids.shape != (vd,) or not torch.equal(ids, expected):
        raise ValueError(f"draft_ids (shape {tuple(ids.shape)}) disagree with the draft's d2t map; "
                         "call set_vocab_map(d2t, t2d) built from the same draft vocab first")
    with torch.no_grad():
        self.lm_head.weight.copy_(lm_head_weight[ids])
        if final_norm_weight is not None:
            self.model.norm.weight.copy_(final_norm_weight)
        if self.cfg.hidden_size == self.cfg.target_hidden_size:
            ht = self.cfg.target_hidden_size
            fc = self.model.fc.weight  # (H, n*Ht)
            fc.zero_()
            fc[:, -ht:].copy_(torch.eye(ht, dtype=fc.dtype))


def combine(self, aux_hidden: torch.Tensor) -> torch.Tensor:
    """aux_hidden (B, T, n, Ht) (or already concatenated (B, T, n*Ht)) -> (B, T, H) via fc_norm_i, fc."""
    if aux_hidden.dim() == 3:
        aux_hidden = aux_hidden.unflatten(-1, (self.cfg.num_aux, self.cfg.target_hidden_size))
    if aux_hidden.shape[-2:] != (self.cfg.num_aux, self.cfg.target_hidden_size):
        raise ValueError(f"aux_hidden {tuple(aux_hidden.shape)} must end in (num_aux={self.cfg.num_aux}, "
                         f"target_hidden_size={self.cfg.target_hidden_size})")
    dev = aux_hidden.device.type
    if (self.cfg.norm_before_fc or self.cfg.fc_norm or not torch.is_autocast_enabled(dev)
            or aux_hidden.dtype != torch.get_autocast_dtype(dev)):
        aux_hidden = aux_hidden.to(self.model.fc.weight.dtype)  # features may arrive in the target's dtype
    # else fc reads them under autocast in the dtype they have: casting up to fp32 and autocast casting
    # back is exact, and would hold (B, T, n*Ht) in fp32 through the forward and a second low copy to backward
    if self.cfg.norm_before_fc:  # first, as vLLM: (B, T, n, Ht) -> RMSNorm over n*Ht -> (B, T, n, Ht)
        aux_hidden = self.model.input_norm(aux_hidden.flatten(-2)).unflatten(-1, aux_hidden.shape[-2:])
    if self.cfg.fc_norm:  # EAGLE-3.1: each target layer's state normalised separately
        aux_hidden = torch.stack([n(aux_hidden[..., i, :]) for i, n in enumerate(self.model.fc_norm)], -2)
    return self.model.fc(aux_hidden.flatten(-2))  # (B, T, n*Ht) -> (B, T, H)


def compute_logits(self, normed: torch.Tensor) -> torch.Tensor:
    """norm(h_pre) (B, T, H) -> (B, T, Vd) logits, returned in fp32.

    Under bf16 autocast the matmul itself runs in bf16 (the lm_head dominates the draft's cost
    on CPU); the upcast keeps log-softmax, soft CE and argmax in fp32.
    """
    return self.lm_head(normed).float()


class Eagle3Draft(nn.Module):
    """EAGLE-3 / 3.1 draft with the training-time-test (TTT) unroll, loss and acceptance metrics."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        add_eagle_modules(self, cfg)
        self.max_score_elements = SCORE_BLOCK_ELEMENTS  # attention scores per block (see attention_rows)
        self.max_logit_elements = LOGIT_BLOCK_ELEMENTS  # draft-vocab logits per block of loss rows
        # train.activation_checkpointing: each TTT step recomputed in backward (keeps its inputs, outputs, K/V)
        self.activation_checkpointing = False

    # the EAGLE head (above), shared with P-EAGLE
    set_vocab_map = set_vocab_map
    draft_to_target = draft_to_target
    load_target_embeddings = load_target_embeddings
    init_from_target = init_from_target
    combine = combine
    compute_logits = compute_logits
    logits_fn = logits_fn
    frozen_head = frozen_head
    # a long row's TTT step in blocks of positions under activation checkpointing (ttt.py)
    ttt_step_rows, step_kv, step_rows = ttt_step_rows, step_kv, step_rows

    def iter_steps(
        self,
        aux_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        steps: int | None = None,
        rope_step_offset: bool = True,
        logits: bool = True,
        doc_ids: Optional[torch.Tensor] = None,
    ) -> Iterator[Eagle3Step]:
        """Yield the TTT unroll step by step (`steps` defaults to cfg.ttt_steps).

        Step k reads ids shifted left by k and the previous step's state unshifted; Q and K are rotated
        at position t + k (the draft's k-th token sits k places ahead). `rope_step_offset=False` rotates
        at t for every step (only for tests showing the offset matters). The K/V cache is shared:
        query (k, t) attends over step-0 keys at positions <= t plus the diagonal keys (j, t), j = 1..k,
        in one softmax, which is what inference sees after k drafted tokens. `logits=False` skips the
        lm_head so a caller can apply it to the supervised rows only. `doc_ids` (B, T) int: a packed row's
        documents (one contiguous run each, -1 on padding, see ttt.py): positions restart at each
        document's first slot and step-0 keys are attended within the query's document only.
        """
        cfg = self.cfg
        b, t = input_ids.shape
        if doc_ids is None:
            positions = torch.arange(t, device=input_ids.device).expand(b, t)
        else:  # (B, T) position within the document: what the conversation's own row would rotate at
            positions = document_positions(doc_ids)
        h = self.combine(aux_hidden)  # (B, T, H)
        keys: tuple[torch.Tensor, ...] = ()  # per step (B, h_kv, T, d), before repeat_kv
        values: tuple[torch.Tensor, ...] = ()
        for k in range(cfg.ttt_steps if steps is None else steps):
            cos, sin = self.rotary(positions + k if rope_step_offset else positions)
            args = (h, shift_left(input_ids, k), cos, sin, keys, values, doc_ids)
            rows = attention_rows(b * cfg.num_attention_heads, t, self.max_score_elements)
            ckpt = self.activation_checkpointing and torch.is_grad_enabled()
            if ckpt and rows < t:  # a long row: blocks of positions, each recomputed on its own in backward
                h_pre, normed, key, value = self.ttt_step_rows(*args, rows=rows)
            elif ckpt:  # keeps the step's inputs and outputs only
                h_pre, normed, key, value = checkpoint(self.ttt_step, *args, use_reentrant=False)
            else:
                h_pre, normed, key, value = self.ttt_step(*args)
            keys, values = (*keys, key), (*values, value)
            yield Eagle3Step(h_pre, self.compute_logits(normed) if logits else None, normed)
            h = normed if cfg.norm_output else h_pre  # fed back unshifted

    def ttt_step(self, h: torch.Tensor, ids: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 keys: tuple[torch.Tensor, ...], values: tuple[torch.Tensor, ...], doc: Optional[torch.Tensor] = None):
        """One TTT step: state h (B, T, H) and ids (B, T) (already shifted by k) with the k earlier steps'
        keys/values (B, h_kv, T, d) -> (h_pre, norm(h_pre), this step's key, value). ``doc`` (B, T): a
        packed row's documents; attention stays within each."""
        cfg, layer = self.cfg, self.model.layers[0]
        b, t = ids.shape
        n_rep, scale = cfg.num_attention_heads // cfg.num_key_value_heads, 1.0 / math.sqrt(cfg.head_dim)
        x = layer.fuse(self.model.embed_tokens(ids), h)  # (B, T, 2H)
        q, key, value = layer.self_attn.project(x, cos, sin)
        kv = ((*keys, key), (*values, value))
        rows = attention_rows(b * q.shape[1], t, self.max_score_elements)
        if rows >= t:  # the whole (B, h, T, T) score tensor fits the budget: one block, no recompute
            if doc is None:
                causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()  # (T, T) key <= query
            else:  # (B, 1, T, T): key <= query in the query's document (no larger than the scores' budget)
                causal = attention_mask(0, t, ids.device, doc)
            out = ttt_attention(q, *kv, scale, causal, 0, n_rep)
        else:  # query blocks, each recomputed in backward: autograd keeps no (B, h, T, T) tensor
            out = torch.cat([checkpoint(ttt_attention, q[:, :, a : a + rows], *kv, scale, None, a, n_rep, doc,
                                        use_reentrant=False) for a in range(0, t, rows)], dim=2)
        h_pre = layer.finish(out, residual=layer.residual(h))
        return h_pre, self.model.norm(h_pre), key, value

    def forward(
        self,
        aux_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        target_probs: torch.Tensor,
        position_mask: torch.Tensor,
        loss_mask: Optional[torch.Tensor] = None,
        doc_ids: Optional[torch.Tensor] = None,
    ) -> Eagle3Output:
        """Training-time test over already-shifted EAGLE-3 supervision (right padding only).

        aux_hidden (B, T, n, Ht): slot t holds the target's aux states at t; input_ids (B, T): token_{t+1};
        target_probs (B, T, Vd): draft-vocab distribution of token_{t+2}; position_mask (B, T): loss
        positions whose target argmax lies in the draft vocab; loss_mask (B, T): all loss positions
        (None: position_mask, for callers without a pruned vocab).
        loss_k = sum_t m_k[t] * CE(p_k[t], logits_k[t]) / max(sum_t m_k[t], 1) with ids/probs/mask
        shifted left by k; loss = sum_k 0.8^k loss_k / sum_k 0.8^k (base = cfg.step_weight).
        Metrics count over shift_left(loss_mask, k): a hit needs m_k (the draft cannot name a target
        outside its vocab), so accuracy and simulated tau are hits / all loss positions, as in vLLM.
        doc_ids (B, T): packed rows (see :meth:`iter_steps`); step k then also needs slot t + k in slot t's
        document, so a packed row gives the loss, metrics and gradients of its conversations one per row.
        """
        ce_sums, correct, prefix_hits, counts, loss_counts = [], [], [], [], []
        prefix = None
        head = None  # the one-block CE's logits, built at its first use
        loss_mask = position_mask if loss_mask is None else loss_mask
        for k, step in enumerate(self.iter_steps(aux_hidden, input_ids, logits=False, doc_ids=doc_ids)):
            mask_k = shift_left(position_mask, k).bool()  # (B, T) rows the CE is taken on
            scored_k = shift_left(loss_mask, k).bool() | mask_k  # (B, T) rows the metrics count
            if doc_ids is not None:  # slot t + k in the next document: the unpacked row's zero tail
                same = same_document(doc_ids, k)
                mask_k, scored_k = mask_k & same, scored_k & same
            # The lm_head, log-softmax and CE run on supervised rows only: (N, H) -> (N, Vd). That
            # is the same sum as masking full (B, T, Vd) logits, at a fraction of the cost.
            # Row (b, t) of step k learns target_probs[b, t + k]: gathered, so no shifted (B, T, Vd) copy.
            bi, ti = mask_k.nonzero(as_tuple=True)
            n, vd = int(bi.numel()), target_probs.shape[-1]
            rows = max(1, self.max_logit_elements // max(vd, 1))
            if n <= rows:  # one block: autograd keeps its lm_head operand, so every step shares one
                head = self.logits_fn() if head is None else head
                ce, top = soft_ce_block(head, step.normed[mask_k], target_probs, bi, ti + k)
            else:  # blocks of rows recomputed in backward: no (N, Vd) logits or probs kept per step
                # Each block gathers its rows of the state the next step keeps anyway (h_pre, or norm(h_pre)
                # with norm_output) and applies the final norm itself: no (N, H) copy kept per step.
                states, norm = (step.normed, None) if self.cfg.norm_output else (step.hidden, self.model.norm)
                parts_k = [checkpoint(soft_ce_rows, self.frozen_head(), states, norm, target_probs, bi[a : a + rows],
                                      ti[a : a + rows], k, use_reentrant=False) for a in range(0, n, rows)]
                ce, top = torch.stack([c for c, _ in parts_k]).sum(), torch.cat([h for _, h in parts_k])
            ce_sums.append(ce)
            loss_counts.append(mask_k.sum())
            with torch.no_grad():
                hit = torch.zeros_like(mask_k)  # False at out-of-draft-vocab loss positions: a miss
                hit[mask_k] = top
                prefix = hit if prefix is None else prefix & hit  # chain from the same start t
                correct.append(hit.sum())
                prefix_hits.append(prefix.sum())
                counts.append(scored_k.sum())
        w = self.cfg.step_weight ** torch.arange(len(ce_sums), dtype=torch.float64)
        parts = LossParts.of(ce_sums, loss_counts, (w / w.sum()).tolist())  # sum_k w_k/sum(w) * ce_k / n_k
        return Eagle3Output(
            loss=parts.loss(),
            step_losses=(parts.num / parts.den.clamp(min=1)).detach(),
            step_correct=torch.stack(correct),
            prefix_correct=torch.stack(prefix_hits),
            step_count=torch.stack(counts),
            parts=parts,
        )

    def supervised(self, sup: Any, generators: RowGenerators = None) -> Eagle3Output:
        """:meth:`forward` on an ``eagle3`` supervision object (read by field name; ``doc_ids`` when its
        rows are packed); EAGLE-3 draws nothing at random, so ``generators`` (one per row) is unused."""
        return self(sup.aux_hidden, sup.input_ids, sup.target_probs, sup.position_mask, sup.loss_mask,
                    getattr(sup, "doc_ids", None))

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json for vLLM's LlamaForCausalLMEagle3 / NeMo AutoModel (weights = `state_dict()`)."""
        return self.cfg.to_export(aux_layer_ids, torch_dtype)


# ---------------------------------------------------------------------------------- training contract
def attach_target(model: Eagle3Draft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any,
                  freeze_default: bool = FREEZE_EMBEDDINGS) -> None:
    """Copy the target's embeddings (frozen per ``draft.freeze_embeddings``, ``freeze_default`` when
    it is null), install the vocab map, and with ``draft.init_from_target`` start from the target's
    lm_head rows and final norm."""
    freeze = freeze_default if draft.freeze_embeddings is None else draft.freeze_embeddings
    model.load_target_embeddings(embeddings, freeze=freeze)
    if model.cfg.pruned:
        model.set_vocab_map(vocab.d2t, vocab.t2d)
    if draft.init_from_target:
        lm_head, final_norm = head()
        model.init_from_target(lm_head, vocab.draft_ids, final_norm)
    # frozen: the target's own read-out rows stay (speculators does so), and the backward skips the
    # lm_head weight-grad GEMM, the largest of a CPU step; config.py requires init_from_target for it
    model.lm_head.weight.requires_grad_(not draft.freeze_lm_head)


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


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """Per-step accuracy, simulated tau and supervised positions from summed :attr:`Eagle3Output.sums`."""
    return position_summary(sums["step_correct"], sums["prefix_correct"], sums["step_count"])


def scalars(summary: dict) -> dict[str, float]:
    """TensorBoard scalars: acc{k} unconditional step accuracy, cond{k} conditional acceptance."""
    return {"simulated_tau": summary["simulated_tau"], **{f"acc{k}": a for k, a in enumerate(summary["step_accuracy"])},
            **{f"cond{k}": c for k, c in enumerate(summary.get("conditional_acceptance", ()))}}


def describe(summary: dict, what: str = "step") -> str:
    """One line: unconditional accuracy per step, the conditional acceptance next to it, simulated tau."""
    accs = " ".join(f"{a:.3f}" for a in summary["step_accuracy"])
    cond = " ".join(f"{a:.3f}" for a in summary.get("conditional_acceptance", ()))
    return (f"per-{what} accuracy [{accs}]  conditional [{cond}]  "
            f"{'simulated parallel tau' if what == 'depth' else 'simulated tau'} {summary['simulated_tau']:.3f}")
