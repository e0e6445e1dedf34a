"""The EAGLE layout's modules and head, shared by EAGLE-3 and P-EAGLE: the fused decoder layer 0 over
(token embedding, fused target state), fc over the target's aux states, the final norm, the lm_head over
the draft vocab and its d2t/t2d map.

Model math only. Module names equal the on-disk names of docs/reference/layouts.md (vLLM's
LlamaForCausalLMEagle3 after stripping the `model.` prefix), so a draft built by :func:`add_eagle_modules`
has its checkpoint as ``state_dict()``; P-EAGLE adds layers 1..L-1 and ``mask_hidden`` under the same prefix.

Layer 0 (what vLLM computes per slot; EAGLE-3's TTT steps and P-EAGLE's elements both run it):
    a       = input_norm(cat_i aux_i) if norm_before_fc else cat_i aux_i      (B, T, n*Ht)
    h       = fc(cat_i fc_norm_i(a_i))                        (B, T, n*Ht) -> (B, T, H)
    x       = cat(input_layernorm(embed(ids)), hidden_norm(h)) (B, T, 2H)
    r       = res + o_proj(attn(q_proj(x), k_proj(x), v_proj(x)))   RoPE on q, k;
              res = hidden_norm(h) if norm_before_residual else h
    h_pre   = r + mlp(post_attention_layernorm(r))
    logits  = lm_head(norm(h_pre))                              over the draft vocab

The head functions below take the draft as ``self`` and are installed as methods of both families' draft
classes (composition: neither family's model inherits the other's).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from .eagle_config import EagleConfig
from .layers import RMSNorm, RotaryEmbedding, SwiGLU, apply_rotary

__all__ = ["Eagle3Attention", "Eagle3DecoderLayer", "Eagle3Model", "add_eagle_modules", "set_vocab_map",
           "draft_to_target", "load_target_embeddings", "init_from_target", "init_layer_from_target", "combine", "compute_logits",
           "attach_target"]


class Eagle3Attention(nn.Module):
    """Q/K/V/O projections; q/k/v read the fused 2H input (`input_size`, default 2H; P-EAGLE's
    layers 1..L-1 read H). With ``qk_norm`` (the Qwen3 shape) each head's q and k pass an RMSNorm over
    head_dim before RoPE (``q_norm``, ``k_norm``: vLLM's Qwen3Attention). The attention pattern lives in
    the draft."""

    def __init__(self, cfg: EagleConfig, input_size: int | None = None):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        inp = 2 * h if input_size is None else input_size
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(inp, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(inp, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(inp, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        if cfg.qk_norm:  # weights start at 1: the layer begins as the Llama-shaped one times a per-head RMS scale
            self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x (B, T, 2H or input_size) -> q (B, h, T, d), k and v (B, h_kv, T, d); q, k rotated by cos/sin (B, T, d)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        if hasattr(self, "q_norm"):  # (B, T, h, d): each head's vector normalised over d, then rotated
            q, k = self.q_norm(q), self.k_norm(k)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(q.transpose(1, 2), cos, sin), apply_rotary(k.transpose(1, 2), cos, sin), v


class Eagle3DecoderLayer(nn.Module):
    """The single fused draft layer (`model.layers.0.*`)."""

    def __init__(self, cfg: EagleConfig):
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

    def __init__(self, cfg: EagleConfig):
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
# Functions over any draft built by add_eagle_modules, each installed as a method of both families'
# draft classes (P-EAGLE's layer 0, fc, norm, lm_head and vocab map are these, under the same on-disk
# names). ``self`` is that draft.


def add_eagle_modules(self: nn.Module, cfg: EagleConfig) -> None:
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


@torch.no_grad()
def init_layer_from_target(self, weights: dict[str, torch.Tensor]) -> list[str]:
    """Start layer 0 as one of the target's decoder layers (``weights``: targets/runner.py
    decoder_layer_weights, Llama names). The draft has the target's heads, head_dim and (by default) MLP
    width, so every tensor but q/k/v fits as it is. q/k/v read the fused x = [input_layernorm(e),
    hidden_norm(h)] (2H): both H-wide column halves take the target's (out, H) projection, so at step 0

        q = W_q (input_layernorm(e) + hidden_norm(h))

    i.e. the layer reads the sum of the two normed streams the way the target layer reads its residual
    stream; both input norms take the target's input_layernorm. With init_from_target's fc, h starts as
    the deepest aux state, which the target layer of that id reads in the target. Returns the names
    copied (an MoE layer has no dense mlp.*; q/k norms only when both have them)."""
    layer, h = self.model.layers[0], self.cfg.hidden_size
    attn = layer.self_attn
    pairs = {"self_attn.o_proj.weight": attn.o_proj.weight,
             "post_attention_layernorm.weight": layer.post_attention_layernorm.weight,
             "mlp.gate_proj.weight": layer.mlp.gate_proj.weight, "mlp.up_proj.weight": layer.mlp.up_proj.weight,
             "mlp.down_proj.weight": layer.mlp.down_proj.weight}
    if hasattr(attn, "q_norm"):
        pairs.update({"self_attn.q_norm.weight": attn.q_norm.weight, "self_attn.k_norm.weight": attn.k_norm.weight})
    fused = {"self_attn.q_proj.weight": attn.q_proj.weight, "self_attn.k_proj.weight": attn.k_proj.weight,
             "self_attn.v_proj.weight": attn.v_proj.weight}
    for name, dst in [*fused.items(), *pairs.items()]:
        src = weights.get(name)
        if src is None:
            continue
        want = (dst.shape[0], h) if name in fused else tuple(dst.shape)
        if tuple(src.shape) != want:
            raise ValueError(f"draft.init_layer_from_target: the target layer's {name} is {tuple(src.shape)} but the "
                             f"draft's needs {want}; leave draft.intermediate_size at 0 (the target's width) or set "
                             f"draft.init_layer_from_target: null")
    copied = []
    for name, dst in [*fused.items(), *pairs.items()]:
        if name in weights:
            src = weights[name].to(dst.dtype)
            dst.copy_(torch.cat([src, src], dim=1) if name in fused else src)
            copied.append(name)
    norm = weights["input_layernorm.weight"].to(layer.input_layernorm.weight.dtype)
    layer.input_layernorm.weight.copy_(norm)
    layer.hidden_norm.weight.copy_(norm)
    return copied + ["input_layernorm.weight"]


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


# ---------------------------------------------------------------------------------- training contract
def attach_target(model: nn.Module, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any, freeze_default: bool,
                  layer: Callable[[int], dict] | None = None) -> None:
    """The family contract's attach_target for a draft built by :func:`add_eagle_modules`: copy the target's
    embeddings (frozen per ``draft.freeze_embeddings``, the family's ``freeze_default`` when it is null),
    install the vocab map, with ``draft.init_from_target`` start from the target's lm_head rows and
    final norm, and with ``draft.init_layer_from_target`` start layer 0 from that target layer
    (``layer(index)``: its weights, :func:`init_layer_from_target`)."""
    freeze = freeze_default if draft.freeze_embeddings is None else draft.freeze_embeddings
    model.load_target_embeddings(embeddings, freeze=freeze)
    if model.cfg.pruned:
        model.set_vocab_map(vocab.d2t, vocab.t2d)
    if draft.init_from_target:
        lm_head, final_norm = head()
        model.init_from_target(lm_head, vocab.draft_ids, final_norm)
    if draft.init_layer_from_target is not None:
        if layer is None:
            raise ValueError("draft.init_layer_from_target is set but no target layer weights were given to attach_target")
        model.init_layer_from_target(layer(draft.init_layer_from_target))
    # frozen: the target's own read-out rows stay (speculators does so), and the backward skips the
    # lm_head weight-grad GEMM, the largest of a CPU step; EagleDraftConfig requires init_from_target for it
    model.lm_head.weight.requires_grad_(not draft.freeze_lm_head)
