"""Block drafts' shared machinery (DFlash, JetSpec, Domino, DSpark): anchors, block inputs,
visibility, loss weights and acceptance metrics, the Qwen3-style block layers, and
:class:`BlockDraft`, the parallel backbone every block family composes with its own loss and head.

Model math only (no I/O, no engines). Module names equal the on-disk names of vLLM's block drafts
(``qwen3_dflash.py``, ``qwen3_dspark.py``: ``fc``, ``hidden_norm``, ``layers.*``, ``norm``; no
``model.`` prefix) so ``state_dict()`` is the checkpoint. There is no embed_tokens and no lm_head:
the draft borrows the target's, frozen, as plain (unregistered) attributes, as vLLM shares them.

Backbone (n = len(target_layer_ids), H = target hidden):
    ctx   = hidden_norm(fc(cat_i aux_i))                  (B, S, n*H) -> (B, S, H), same for every layer
    x     = embed([token at anchor, MASK, ..., MASK])     (B, N*bs, H): one block per anchor
    layer: q from input_layernorm(x); K, V = [k/v_proj(ctx) | k/v_proj(input_layernorm(x))]
           (one projection for both), per-head q_norm/k_norm, RoPE at [0..S-1 | anchor + offset];
           r = x + o_proj(attn); x = r + mlp(post_attention_layernorm(r))
    h     = norm(x)                                       (B, N, bs, H): the family's head reads it
Visibility (docs/guides/families.md): a query of block b (anchor a_b) sees context keys j < a_b (strictly
before the anchor: the target has no state for the anchor token yet when it drafts) and the keys
of its own block, all of them (bidirectional) or j' <= i (``causal``: JetSpec); never another block.
Block slot k predicts the token at a_b + k + o: o = ``label_offset`` is 0 for DFlash (the mask sits AT
the predicted position, slot 0 predicts nothing) and 1 for DSpark and Domino's shift_label (every slot
predicts the token after its position, the anchor the first drafted one).
Packed rows (``data.packing``, ``doc_ids`` (B, S) on the supervision): each document's anchors are
drawn as its own unpacked row would draw them (block_documents.py), a block's context keys are
[its document's first slot, a_b), RoPE positions count from the document's first slot (context and
block alike), and labels stop at the document's end: a packed row has its conversations' loss.
``activation_checkpointing`` (train.activation_checkpointing) recomputes each layer in backward.
Inference (``propose``) keeps the projected context K/V per layer across rounds, as vLLM's
``precompute_and_store_context_kv`` writes them into the draft KV cache (block_infer.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsmith.supervision.head import HeadForm, rebuild_logits

from .block_documents import document_rows, place_anchors
from .chunked import MAX_ELEMENTS
from .layers import LossParts, RMSNorm, RotaryEmbedding, RowGenerators, SwiGLU, apply_rotary, conditional_rates, document_positions

__all__ = ["BlockDraft", "BlockOutput", "BlockAttention", "BlockLayer", "NoValidAnchors", "sample_anchors",
           "document_anchors", "block_inputs", "visibility", "decay_weights", "block_metrics", "empty_sums",
           "summarize", "scalars", "describe", "PROGRESS", "teacher_positions"]

PROGRESS = {"acc": "acc1", "tau": "accept_len"}

class NoValidAnchors(ValueError):
    """No row of a block-family batch has an assistant token with a whole block after it, so there is
    nothing to learn from it; the trainer catches it and takes a zero loss for that micro-batch. Fix: none
    for one batch; when it is every batch, longer answers, a larger ``data.max_length`` or a smaller
    ``draft.block_size``."""



# ---------------------------------------------------------------------------------- blocks and mask
def sample_anchors(loss_mask: torch.Tensor, block_size: int, num_anchors: int,
                   generator: Optional[torch.Generator] | RowGenerators = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchors per row -> (anchor (B, N) int64 sorted, keep (B, N) bool).

    valid[b, a] = loss_mask[b, a] == 1 and a <= S - block_size; N = min(num_anchors, max valid count
    of a row). Each row takes a uniform random subset (the N smallest of one uniform key per
    position, keys drawn for the whole (B, S) at once, or row by row from one generator per row),
    sorted; rows with fewer valid anchors are
    padded with keep=False blocks at anchor 0. NoValidAnchors when no row has any.
    """
    b, s = loss_mask.shape
    valid = loss_mask.bool() & (torch.arange(s, device=loss_mask.device) <= s - block_size)
    n = min(num_anchors, int(valid.sum(1).max()) if b else 0)
    if n == 0:
        raise NoValidAnchors(f"no assistant token with {block_size - 1} tokens after it in a batch of length {s}")
    if isinstance(generator, (list, tuple)):  # per row: a row's anchors do not depend on its batch
        keys = torch.stack([torch.rand(s, generator=g) for g in generator]).to(loss_mask.device)
    else:
        keys = torch.rand(b, s, generator=generator).to(loss_mask.device)
    keys = keys.masked_fill(~valid, 2.0)  # invalid positions sort last
    picked = keys.argsort(1)[:, :n]  # (B, N) random valid positions first
    keep = valid.gather(1, picked)
    anchor = torch.where(keep, picked, torch.full_like(picked, s))  # padding sorts after real anchors
    anchor, order = anchor.sort(1)
    keep = keep.gather(1, order)
    return anchor.masked_fill(~keep, 0), keep


def document_anchors(loss_mask: torch.Tensor, doc_ids: torch.Tensor, block_size: int, num_anchors: int,
                     generator: Optional[torch.Generator] | RowGenerators = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`sample_anchors` of packed rows (loss_mask, doc_ids (B, S)) -> (anchor, keep, start, end),
    each (B, N'): anchors in packed slots, and the first slot of each one's document and the slot after
    its last (block_documents.py). Document d draws as unpacked row d of its micro-batch: from
    ``generator[d]`` (one per conversation), or row d of one (D, W) draw."""
    docs = int(doc_ids.max()) + 1 if doc_ids.numel() else 0
    if isinstance(generator, (list, tuple)):  # one per conversation, even one with no slot here
        docs = max(docs, len(generator))
    local, spans = document_rows(loss_mask, doc_ids, docs)  # (D, W): each document as its own row
    anchor, keep = sample_anchors(local, block_size, num_anchors, generator)  # (D, N) document-local
    return place_anchors(anchor, keep, spans, *doc_ids.shape)


def block_inputs(input_ids: torch.Tensor, loss_mask: torch.Tensor, anchor: torch.Tensor, keep: torch.Tensor,
                 block_size: int, mask_token_id: int, label_offset: int = 0, end: Optional[torch.Tensor] = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Blocks over anchors -> noise ids, positions, label ids, label mask, each (B, N, bs).

    noise[b, j] = [token[a_j], MASK, ...] (all MASK for padding blocks); position = a_j + k;
    label = token[a_j + k + o], supervised where keep, k >= 1 - o, a_j + k + o < S and
    loss_mask[a_j + k + o]. o = ``label_offset``: 0 for DFlash (the anchor slot predicts nothing),
    1 for Domino's shift_label (every slot predicts the token after its position). ``end`` (B, N):
    packed rows' slot after each anchor's document, which then stands for S (the next document's
    tokens are no labels of this one, as the unpacked row's padding is none).
    """
    s = input_ids.shape[1]
    offs = torch.arange(block_size, device=input_ids.device)
    pos = anchor[..., None] + offs  # (B, N, bs)
    lpos = pos + label_offset
    idx = lpos.clamp(max=s - 1).flatten(1)
    labels = input_ids.gather(1, idx).view_as(pos)
    stop = s if end is None else end[..., None]  # () or (B, N, 1)
    label_mask = (keep[..., None] & (offs >= 1 - label_offset) & (lpos < stop)
                  & loss_mask.bool().gather(1, idx).view_as(pos))
    noise = torch.full_like(pos, mask_token_id)
    noise[..., 0] = torch.where(keep, input_ids.gather(1, anchor), mask_token_id)
    return noise, pos, labels, label_mask


def visibility(anchor: torch.Tensor, context_len: int, block_size: int, causal: bool,
               start: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, N) anchors -> (B, N*bs, S + N*bs) bool, [b, q, kv] = kv visible to q.

    Query (block j, offset i) sees context kv < a_j and, in its own block, every offset (bidirectional)
    or offsets <= i (causal). ``start`` (B, N): packed rows' first slot of each anchor's document; the
    context is then start_j <= kv < a_j, never another document's. Padding blocks (anchor 0) keep
    their in-block keys, so no row is empty.
    Dense on purpose: each query's context ends at its own block's anchor (per row, data-dependent),
    which SDPA's only index rule (is_causal, one top-left triangle) cannot say, and one SDPA call over
    all blocks needs one mask; it is bool (1 byte an entry) and shared by every layer.
    """
    b, n = anchor.shape
    dev = anchor.device
    q_anchor = anchor.repeat_interleave(block_size, 1)  # (B, Q)
    kv = torch.arange(context_len, device=dev)[None, None, :]
    ctx = kv < q_anchor[..., None]  # (B, Q, S)
    if start is not None:  # a packed row: only the query's own document
        ctx = ctx & (kv >= start.repeat_interleave(block_size, 1)[..., None])
    blk = torch.arange(n * block_size, device=dev)
    same = (blk[:, None] // block_size) == (blk[None, :] // block_size)  # (Q, Q)
    if causal:
        same = same & (blk[None, :] <= blk[:, None])
    return torch.cat([ctx, same[None].expand(b, -1, -1)], dim=2)


def decay_weights(block_size: int, gamma: Optional[float], first: int = 1) -> torch.Tensor:
    """(bs,) loss weight per block position: 0 before ``first`` (the first supervised position),
    exp(-(k - first)/gamma) from it on (1 if gamma is None)."""
    k = torch.arange(block_size, dtype=torch.float32)
    w = torch.ones(block_size) if gamma is None else torch.exp(-(k - first) / gamma)
    w[:first] = 0.0
    return w


def block_metrics(correct: torch.Tensor, mask: torch.Tensor, first: int = 1) -> dict[str, torch.Tensor]:
    """Per-block acceptance from (B, N, bs) correct/mask -> summable counts; positions before ``first``
    are never supervised (the anchor slot, for DFlash).

    pos_correct / pos_count (bs-first,): per drafted position; pos_prefix: drafted positions up to k
    all correct where supervised; accept_len_sum: sum over blocks with a supervised position of 1 + the
    run of correct positions before the first supervised miss (unsupervised positions neither break
    nor extend it); valid_blocks: those blocks.
    """
    c, m = correct[..., first:], mask[..., first:]
    miss = m & ~c
    before_miss = miss.long().cumsum(-1) == 0
    run = (c & m & before_miss).sum(-1)  # (B, N)
    has = m.any(-1)
    prefix = (c & m & before_miss) | (~m & before_miss)  # positions 1..k hit or skipped
    prefix = prefix.long().cumprod(-1).bool() & m
    return {"pos_correct": (c & m).sum((0, 1)), "pos_count": m.sum((0, 1)), "pos_prefix": prefix.sum((0, 1)),
            "accept_len_sum": (1 + run)[has].sum().reshape(1), "valid_blocks": has.sum().reshape(1)}


# ---------------------------------------------------------------------------------- model
class BlockAttention(nn.Module):
    """Qwen3 attention with q/k norms whose keys/values are [context | block] (one projection)."""

    def __init__(self, cfg: Any):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T, H) -> k, v (B, h_kv, T, d): k_norm then RoPE on k."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return apply_rotary(k, cos, sin), v

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ctx_k: torch.Tensor,
                ctx_v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
        """x (B, Q, H) block states, ctx_k/v (B, h_kv, S, d), mask (B or 1, 1, Q, S + Q) bool (True =
        visible; None = every key) -> (B, Q, H)."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k, v = self.kv(x, cos, sin)
        k, v = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)  # (B, h_kv, S + Q, d)
        # A bool mask goes to SDPA as is: one (B, 1, Q, S + Q) byte tensor shared by every layer (an
        # additive float copy per layer would be saved for backward by each); the same output bitwise.
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask,
                                             enable_gqa=self.num_heads != self.num_kv_heads)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class BlockLayer(nn.Module):
    def __init__(self, cfg: Any):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask):
        r = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return r + self.mlp(self.post_attention_layernorm(r))


@dataclass
class BlockOutput:
    """Training/eval result: ``loss`` carries grad, ``sums`` are detached counts (see block_metrics)."""

    loss: torch.Tensor
    sums: dict
    parts: Optional[LossParts] = None  # loss = parts.loss() (the family's parts)


class BlockDraft(nn.Module):
    """The parallel block backbone (modules above, the target's embeddings and lm_head borrowed): anchors,
    blocks, the context K/V and the forward, with no loss and no head of its own. A block family's draft
    composes it with its loss (``block_loss``), its head (``head_logits``) and its export."""

    label_offset = 0  # block slot k predicts token anchor + k + label_offset (module docstring)
    draft_type = "block"  # the family its export names (each family's class: its own)

    def __init__(self, cfg: Any):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_aux * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        self.rotary = RotaryEmbedding(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling, cfg.max_position_embeddings)
        self.register_buffer("loss_weights", decay_weights(cfg.block_size, cfg.loss_decay_gamma, 1 - self.label_offset),
                             persistent=False)
        # Memory knobs, not math (the loss and gradients are the same either way, up to rounding):
        self.max_logit_elements = MAX_ELEMENTS  # (rows, V) logits per loss chunk (drafts/chunked.py)
        self.activation_checkpointing = False  # recompute each layer in backward (train.activation_checkpointing)
        # The target's, frozen and not registered: never in state_dict (not on disk), never optimized.
        self.__dict__["embed_tokens"] = None
        self.__dict__["lm_head"] = None
        # The target's final norm weight (H,), for the families that distil the target's distribution (JetSpec,
        # DSpark: ``dflash_kd`` supervision): frozen, moved with the draft, never saved (persistent=False keeps
        # checkpoints and exports as they were). Set by attach_teacher.
        self.register_buffer("teacher_norm", None, persistent=False)
        self.teacher_eps = cfg.rms_norm_eps

    def attach_target(self, embeddings: torch.Tensor, lm_head: torch.Tensor) -> None:
        """Borrow the target's (V, H) input embedding and (V, H) lm_head (no copies, no grad)."""
        self.__dict__["embed_tokens"] = embeddings.detach()
        self.__dict__["lm_head"] = lm_head.detach()

    def attach_teacher(self, norm_weight: torch.Tensor, eps: float) -> None:
        """The target's final norm weight (H,) and eps, which with the borrowed lm_head make its logits."""
        self.teacher_norm = norm_weight.detach().clone()
        self.teacher_eps = float(eps)

    def teacher_logits(self, h_last: torch.Tensor) -> torch.Tensor:
        """(..., H) target states at layer id L (before its final norm) -> (..., V) logits in h_last's
        dtype, the engines' own ops (supervision.head.rebuild_logits: fp32 matches their logits bitwise),
        through the target's logit transforms (cfg.target_logit_multiplier, target_logit_softcap): the
        distribution the target serves. A (1 + w) norm came folded into the weight. Outside autocast: the
        engine computed them in its own dtype."""
        if self.teacher_norm is None or self.lm_head is None:
            raise RuntimeError(f"{type(self).__name__} has no target head; call attach_target(...) and "
                               "attach_teacher(final_norm_weight, eps) first")
        form = HeadForm(0.0, self.cfg.target_logit_multiplier, self.cfg.target_logit_softcap)
        with torch.autocast(h_last.device.type, enabled=False):
            return rebuild_logits(h_last, self.teacher_norm, self.lm_head, self.teacher_eps, form)

    def _apply(self, fn, recurse: bool = True):
        # .to(device) moves the borrowed tensors with the draft (dtype casts leave them alone)
        super()._apply(fn, recurse)
        for name in ("embed_tokens", "lm_head"):
            t = self.__dict__.get(name)
            if t is not None:
                dev = fn(torch.empty(0, device=t.device)).device
                self.__dict__[name] = t.to(dev)
        return self

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.embed_tokens is None:
            raise RuntimeError("block draft has no target embeddings; call attach_target(embeddings, lm_head) first")
        return F.embedding(ids, self.embed_tokens).to(self.fc.weight.dtype)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) normed states -> (..., V) with the target's lm_head."""
        return F.linear(h, self.lm_head.to(h.dtype))

    @property
    def vocab_rows(self) -> int:
        """V: the borrowed lm_head's rows (what one row of logits holds)."""
        return int(self.lm_head.shape[0]) if self.lm_head is not None else self.cfg.vocab_size

    def context(self, aux_hidden: torch.Tensor) -> torch.Tensor:
        """(B, S, n, H) target states -> ctx (B, S, H) = hidden_norm(fc(concat))."""
        return self.hidden_norm(self.fc(aux_hidden.flatten(2).to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """ctx (B, S, H) at positions (B, S) -> per layer (k, v), each (B, h_kv, S, d)."""
        cos, sin = self.rotary(positions)
        return [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]

    def run_blocks(self, noise_ids: torch.Tensor, positions: torch.Tensor, kvs: list,
                   mask: Optional[torch.Tensor]) -> torch.Tensor:
        """Blocks (B, Q) ids at (B, Q) positions over per-layer context K/V -> norm(h) (B, Q, H)."""
        x = self.embed(noise_ids)
        cos, sin = self.rotary(positions)
        for layer, (k, v) in zip(self.layers, kvs):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def run_blocks_checkpointed(self, noise_ids: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor,
                                ctx_pos: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """:meth:`run_blocks` with each layer, its context K/V projection included, under checkpoint:
        backward keeps each layer's (B, Q, H) input and recomputes the rest, so the per-layer
        (B, h_kv, S, d) context K/V of a long context are not all held at once."""
        x = self.embed(noise_ids)
        cos, sin = self.rotary(positions)
        ccos, csin = self.rotary(ctx_pos)

        def step(layer: BlockLayer, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
            k, v = layer.self_attn.kv(ctx, ccos, csin)  # (B, S, H) -> (B, h_kv, S, d) x2
            return layer(x, cos, sin, k, v, mask)

        for layer in self.layers:
            x = checkpoint(step, layer, x, ctx, use_reentrant=False)
        return self.norm(x)

    def blocks(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
               generator: Optional[torch.Generator] | RowGenerators = None, doc_ids: Optional[torch.Tensor] = None):
        """Sample anchors and run every block -> (h (B, N, bs, H), labels, label_mask, anchor).

        ``doc_ids`` (B, S): packed rows (module docstring); anchor is then in packed slots."""
        cfg = self.cfg
        b, s = input_ids.shape
        bs = cfg.block_size
        o = self.label_offset
        if doc_ids is None:
            anchor, keep = sample_anchors(loss_mask, bs + o, cfg.num_anchors, generator)
            start = end = None
            ctx_pos = torch.arange(s, device=input_ids.device).expand(b, s)
        else:  # start, end (B, N): each anchor's document [start, end)
            anchor, keep, start, end = document_anchors(loss_mask, doc_ids, bs + o, cfg.num_anchors, generator)
            ctx_pos = document_positions(doc_ids)  # (B, S): what each conversation's own row rotates at
        noise, pos, labels, lmask = block_inputs(input_ids, loss_mask, anchor, keep, bs, cfg.mask_token_id, o, end)
        if start is not None:
            pos = pos - start[..., None]  # (B, N, bs): anchor + offset within the document
        ctx = self.context(aux_hidden)  # (B, S, n*H) -> (B, S, H)
        mask = visibility(anchor, s, bs, cfg.causal, start)[:, None]  # (B, 1, Q, S + Q) bool
        if self.activation_checkpointing and torch.is_grad_enabled():
            h = self.run_blocks_checkpointed(noise.flatten(1), pos.flatten(1), ctx, ctx_pos, mask)
        else:
            h = self.run_blocks(noise.flatten(1), pos.flatten(1), self.context_kv(ctx, ctx_pos), mask)
        return h.view(b, -1, bs, h.shape[-1]), labels, lmask, anchor

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> BlockOutput:
        """The family's loss over the blocks' states h (B, N, bs, H), labels / label mask (B, N, bs) and
        anchors (B, N)."""
        raise NotImplementedError(f"{type(self).__name__} has no block_loss: a block family defines its own")

    def forward(self, sup: Any, generator: Optional[torch.Generator] | RowGenerators = None) -> BlockOutput:
        """Loss and metric sums over one micro-batch of ``dflash`` supervision (right padding), or of its
        packed rows (its ``doc_ids``, data.packing: the same loss and gradients)."""
        try:
            h, labels, lmask, anchor = self.blocks(sup.aux_hidden, sup.input_ids, sup.loss_mask, generator,
                                                   getattr(sup, "doc_ids", None))
        except NoValidAnchors:  # nothing to learn from: a zero loss that still reaches every parameter
            zero = sum(p.sum() for p in self.parameters() if p.requires_grad) * 0.0
            return BlockOutput(zero, self.empty_sums(zero.device), LossParts.of([zero], [0.0], [1.0]))
        return self.block_loss(h, labels, lmask, anchor, sup)

    def supervised(self, sup: Any, generators: RowGenerators = None) -> BlockOutput:
        """Row i's anchors from ``generators[i]``. Without them: torch's global RNG in training (saved
        in checkpoints, so resume is bitwise), a fixed generator in eval mode (held-out metrics compare
        across evaluations)."""
        gen = generators if generators is not None or self.training else torch.Generator().manual_seed(0)
        return self(sup, gen)

    def empty_sums(self, device: Any = None) -> dict:
        """The metric sums of a micro-batch with nothing to learn from: zeros with every key ``block_loss``
        returns (a family with more sums adds its own)."""
        return empty_sums(self.max_k, device)

    # ------------------------------------------------------------------ inference
    @property
    def max_k(self) -> int:
        """Tokens one block drafts: bs - 1 (the anchor slot predicts nothing), bs with a label offset."""
        return self.cfg.block_size - 1 + self.label_offset

    @torch.no_grad()
    def propose(self, kvs: list, anchor_token: int, position: int, k: int) -> torch.Tensor:
        """One block after a context whose per-layer K/V ``kvs`` cover positions 0..position-1 ->
        logits (k, V) for positions position+1..position+k. The block is [anchor, MASK...] at
        positions position.. with k + 1 - label_offset slots (vLLM runs K + 1 slots for K tokens)."""
        dev = self.fc.weight.device
        n = k + 1 - self.label_offset
        ids = torch.full((1, n), self.cfg.mask_token_id, dtype=torch.long, device=dev)
        ids[0, 0] = anchor_token
        pos = torch.arange(position, position + n, device=dev)[None]
        s = kvs[0][0].shape[2]
        # The block sees all s context keys; in the block, every key (no mask at all) or, causal,
        # keys up to itself: kv j visible to query i iff j <= s + i, an (n, s + n) index rule.
        mask = None
        if self.cfg.causal:
            mask = torch.arange(s + n, device=dev)[None, :] <= s + torch.arange(n, device=dev)[:, None]
        return self.head_logits(self.run_blocks(ids, pos, kvs, mask)[0, 1 - self.label_offset:], anchor_token)

    def head_logits(self, h: torch.Tensor, anchor_token: int) -> torch.Tensor:
        """Drafted rows (k, H) -> logits (k, V): the target's lm_head (Domino and DSpark walk their heads here)."""
        return self.logits(h).float()

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json (the family config's ``to_export``), naming this draft's family; ``aux_layer_ids``
        are the engine ids it read (on disk: decoder-layer outputs, minus one)."""
        return self.cfg.to_export(aux_layer_ids, torch_dtype, self.draft_type)


def empty_sums(positions: int, device: Any = None) -> dict:
    z = torch.zeros(positions, dtype=torch.long, device=device)
    return {"pos_correct": z, "pos_count": z.clone(), "pos_prefix": z.clone(),
            "accept_len_sum": torch.zeros(1, dtype=torch.long, device=device),
            "valid_blocks": torch.zeros(1, dtype=torch.long, device=device)}



def teacher_positions(anchor: torch.Tensor, block_size: int, label_offset: int = 0) -> torch.Tensor:
    """(B, N) anchors -> (B, N, bs) sequence row of each block slot's target distribution: slot k predicts
    token anchor + k + o, which the target's logits at row anchor + k + o - 1 give (on the ground-truth
    prefix). Rows before 0 (DFlash's anchor slot, never supervised) are clamped to 0."""
    k = torch.arange(block_size, device=anchor.device)
    return (anchor[..., None] + k + label_offset - 1).clamp(min=0)


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """Per-position accuracy, accept length (mean tokens per block, anchor included) and counts.

    Every denominator is the supervised (loss-mask) label positions of the sampled blocks; the draft
    predicts the full vocab, so no target is out of its reach. step_accuracy is each position on its
    own, prefix_rate positions 1..k all agree, conditional_acceptance prefix_rate_k / prefix_rate_{k-1}.
    """
    n = sums["pos_count"].double()
    blocks = float(sums["valid_blocks"].sum())
    return {"step_accuracy": (sums["pos_correct"].double() / n.clamp(min=1)).tolist(),
            "prefix_rate": (sums["pos_prefix"].double() / n.clamp(min=1)).tolist(),
            "conditional_acceptance": conditional_rates(sums["pos_prefix"], sums["pos_count"]),
            "accept_len": float(sums["accept_len_sum"].sum()) / max(blocks, 1.0),
            "simulated_tau": float(sums["accept_len_sum"].sum()) / max(blocks, 1.0),
            "positions": int(n.sum()), "blocks": int(blocks)}


def scalars(summary: dict) -> dict[str, float]:
    return {"accept_len": summary["accept_len"], "simulated_tau": summary["simulated_tau"],
            **{f"acc{k + 1}": a for k, a in enumerate(summary["step_accuracy"])},
            **{f"cond{k + 1}": c for k, c in enumerate(summary.get("conditional_acceptance", ()))}}


def describe(summary: dict) -> str:
    more = " ..." if len(summary["step_accuracy"]) > 8 else ""
    accs = " ".join(f"{a:.3f}" for a in summary["step_accuracy"][:8])
    cond = " ".join(f"{a:.3f}" for a in summary.get("conditional_acceptance", ())[:8])
    return f"per-position accuracy [{accs}{more}]  conditional [{cond}{more}]  accept length {summary['accept_len']:.3f}"

