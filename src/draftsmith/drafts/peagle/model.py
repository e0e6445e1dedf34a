"""P-EAGLE (parallel drafting): an EAGLE-3 draft that proposes K tokens in ONE forward.

Model math only (no I/O, no engines). The draft is the EAGLE-3 draft (fc, the fused 2H layer 0,
norm, lm_head over the draft vocab, d2t/t2d) plus plain Llama layers 1..L-1 on H and a learned
`mask_hidden` (1, 1, n*Ht) that stands in for the target's aux states where no target state exists.

Elements. Slot (anchor a, depth d) predicts token_{a+d+2} (EAGLE-3's shift: slot t predicts
token_{t+2}); its reference position is ref = a + d, RoPE position a + d:
    depth 0:  hidden = fc(aux_a),        token = input_ids[a] (= token_{a+1})
    depth d:  hidden = fc(mask_hidden),  token = mask_token_id
Visibility (one attention over all elements of a row):
    visible(q, kv) = (depth_kv == 0 and anchor_q >= anchor_kv) or (anchor_q == anchor_kv and depth_q >= depth_kv)
i.e. every query sees the real context up to its anchor plus its own anchor's mask slots up to itself.
The rule is kept as its index tensors (:class:`ElementMask`) and built per block of query rows as a bool
mask, so no (N, N) fp32 mask exists and no layer makes a float copy of one.

Packed rows (``data.packing``: the supervision's ``doc_ids`` (B, T), one contiguous run per conversation,
-1 on padding) add ``doc(q) == doc(kv)`` to the rule, restart RoPE positions at each document's first
slot, and draw each document's COD elements with that conversation's own generator in its own
coordinates (:func:`packed_sample`), so a packed row gives the loss and gradients of its conversations
trained one per row.

Inference (`propose`, `propose_cached`, as vLLM 0.32 runs a parallel draft) lives in infer.py, with the
parallel proposer. The EAGLE-3 parts are composed, not inherited: the EAGLE layout's modules
(drafts/eagle_layers.py: `Eagle3Model`, `Eagle3Attention`) under the same on-disk names, and its head
functions, which EAGLE-3's draft composes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import eagle_layers, eagle_summary
from ..chunked import MAX_ELEMENTS, attention_rows
from ..eagle_layers import Eagle3Attention, add_eagle_modules
from ..eagle_summary import simulated_tau
from ..layers import DraftKVCache, LossParts, RMSNorm, RowGenerators, SwiGLU, document_positions, row_generator
from .config import PEagleConfig
from .infer import PEagleInference, PEagleProposal

__all__ = ["PEagleDraft", "PEagleOutput", "PEagleProposal", "cod_sample", "full_sample", "packed_sample",
           "document_spans", "pad_elements", "visibility", "attention_mask", "ElementMask", "attach_target", "summarize",
           "describe"]

FREEZE_EMBEDDINGS = False  # speculators trains them (the mask token's row must move)


def cod_sample(valid: torch.Tensor, num_depths: int, ratio: float, ratio_min: float,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Conditional-drop (COD) sample of one row: flat (anchor (N,), depth (N,)) int64.

    valid (T,) bool = the (shifted) loss mask. Depth 0 takes ALL T positions, valid or not: they are
    the real context every deeper slot attends to (as vLLM's KV cache holds every prefix position),
    and the loss charges them only where valid. Depth d >= 1 samples reference positions (ref = anchor + d):
        pool_1 = valid \\ {0}                  (ref 0 would give anchor -1)
        size_d = int(max(0, n_valid - d) * max(ratio^d, ratio_min)), stop when <= 0
        sampled = sorted random subset of pool_d of that size (the whole pool if smaller)
        pool_{d+1} = ((sampled + 1) mod T) \\ {0}, restricted to valid
    so a depth-d slot exists only where its anchor's depth-(d-1) slot was kept (chains stay whole).
    """
    t = valid.shape[0]
    valid = valid.bool().cpu()
    anchors, depths = [torch.arange(t)], [torch.zeros(t, dtype=torch.long)]
    pool = valid.nonzero().flatten()
    n_valid = pool.numel()
    pool = pool[pool != 0]
    for d in range(1, num_depths):
        size = int(max(0, n_valid - d) * max(ratio ** d, ratio_min))
        if size <= 0 or pool.numel() == 0:
            break
        if pool.numel() >= size:
            pick = torch.randperm(pool.numel(), generator=generator)[:size]
            sampled = pool[pick].sort().values
        else:
            sampled = pool
        anchors.append(sampled - d)
        depths.append(torch.full_like(sampled, d))
        nxt = (sampled + 1) % t
        pool = nxt[(nxt != 0) & valid[nxt]]
    return torch.cat(anchors), torch.cat(depths)


def full_sample(length: int, num_depths: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (anchor, depth) with anchor + depth < length, depth-major: the no-COD evaluation set."""
    anchors = [torch.arange(length - d) for d in range(min(num_depths, length))]
    depths = [torch.full_like(a, d) for d, a in enumerate(anchors)]
    return torch.cat(anchors), torch.cat(depths)


def pad_elements(rows: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row (anchor, depth) lists -> anchor, depth, real, each (B, N_max); padding = (0, -1, False)."""
    n = max(a.numel() for a, _ in rows)
    anchor = torch.zeros(len(rows), n, dtype=torch.long)
    depth = torch.full((len(rows), n), -1, dtype=torch.long)
    real = torch.zeros(len(rows), n, dtype=torch.bool)
    for b, (a, d) in enumerate(rows):
        anchor[b, : a.numel()], depth[b, : a.numel()], real[b, : a.numel()] = a, d, True
    return anchor, depth, real


def document_spans(doc_ids: torch.Tensor) -> dict[int, tuple[int, int, int]]:
    """doc_ids (B, T) of packed rows -> {document id: (row, first slot, end slot)}; padding (-1) is none."""
    spans: dict[int, tuple[int, int, int]] = {}
    for r, row in enumerate(doc_ids.tolist()):
        for t, j in enumerate(row):
            if j >= 0:
                spans[j] = (r, spans[j][1] if j in spans else t, t + 1)
    return spans


def packed_sample(doc_ids: torch.Tensor, valid: torch.Tensor, sample: Callable[[int, torch.Tensor], tuple],
                  ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per packed row (anchor, depth) lists: depth 0 at every slot (as an unpacked row), then each
    document's depth >= 1 elements, drawn by ``sample(j, valid_j)`` on document j's own slots
    (document-local coordinates, as its unpacked row draws them) and offset to where it lies.

    doc_ids (B, T), valid (B, T) bool. Documents are sampled in id order (the micro-batch's order), so
    one shared generator draws the same as unpacked rows 0, 1, ... do; the trainer's one generator per
    conversation is ``generators[j]`` for document j.
    """
    b, t = doc_ids.shape
    rows = [([torch.arange(t)], [torch.zeros(t, dtype=torch.long)]) for _ in range(b)]
    valid = valid.bool().cpu()
    for j, (r, s, e) in sorted(document_spans(doc_ids).items()):
        a, d = sample(j, valid[r, s:e])
        deep = d > 0  # depth 0 is the row's own arange above
        rows[r][0].append(a[deep] + s)
        rows[r][1].append(d[deep])
    return [(torch.cat(a), torch.cat(d)) for a, d in rows]


def visibility(anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor,
               doc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, N) element lists -> (B, N, N) bool, [b, q, kv] = kv visible to q (:class:`ElementMask`, all rows)."""
    return ElementMask(anchor, depth, real, doc).rows(0, anchor.shape[1])[:, 0]


def attention_mask(anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor,
                   doc: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Dense bool mask (B, 1, N, N) for SDPA: True where visible (tests and callers that want it whole)."""
    return visibility(anchor, depth, real, doc)[:, None]


class ElementMask:
    """The visibility rule of a row's N elements, kept as index tensors and built per block of query rows.

    anchor, depth, real (B, N) (:func:`pad_elements`); doc (B, N) int or None: each element's document in
    a packed row. :meth:`rows` gives query rows start..end-1 against all N keys, (B, 1, r, N) bool:
        pred(q, kv) = (depth_kv == 0 and anchor_q >= anchor_kv) or (anchor_q == anchor_kv and depth_q >= depth_kv)
    between real elements of one document, plus the diagonal for padding queries so that no softmax
    row is empty (padding rows are never charged). :func:`attend` runs SDPA per block of
    ``attention_rows(B * h, keys, max_elements)`` query rows (scores within the drafts' budget), each
    block's mask built and (in backward) rebuilt from these rules; one block: one mask for every layer.
    """

    def __init__(self, anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor,
                 doc: Optional[torch.Tensor] = None, max_elements: int = MAX_ELEMENTS):
        self.anchor, self.depth, self.real, self.doc = anchor, depth, real, doc
        self.max_elements = max_elements
        self._whole: Optional[torch.Tensor] = None  # (B, 1, N, N) bool, built once when one block holds all rows

    @property
    def size(self) -> int:
        return self.anchor.shape[1]

    def rows(self, start: int, end: int) -> torch.Tensor:
        """Query rows start..end-1 -> (B, 1, r, N) bool, True where visible."""
        aq, ak = self.anchor[:, start:end, None], self.anchor[:, None, :]
        dq, dk = self.depth[:, start:end, None], self.depth[:, None, :]
        vis = ((dk == 0) & (aq >= ak)) | ((aq == ak) & (dq >= dk))  # (B, r, N)
        vis &= self.real[:, start:end, None] & self.real[:, None, :]
        if self.doc is not None:
            vis &= self.doc[:, start:end, None] == self.doc[:, None, :]
        eye = torch.arange(start, end, device=vis.device)[:, None] == torch.arange(self.size, device=vis.device)
        return (vis | eye)[:, None]

    def whole(self) -> torch.Tensor:
        """All rows, (B, 1, N, N) bool, kept for the next layers."""
        if self._whole is None:
            self._whole = self.rows(0, self.size)
        return self._whole


def _block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: ElementMask, start: int,
                     gqa: bool) -> torch.Tensor:
    """SDPA of query rows start..start+r (q (B, h, r, d)) over all N keys, their mask built here."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.rows(start, start + q.shape[2]),
                                                            enable_gqa=gqa)


def attend(attn: Eagle3Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           mask: torch.Tensor | ElementMask, cache: DraftKVCache | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v: x (B, N, in) -> (B, h, N, d).

    mask: an :class:`ElementMask` (training's element rows), or a tensor (B or 1, 1, N, keys), bool
    (True = visible) or additive. With ``cache`` (S slots) the N new keys/values are appended to it
    first and the queries attend to all S + N of them. Fused SDPA calls: the dense (B, h, N, N) scores
    of a P-EAGLE row (N ~ 3.4 T elements at K=8) are never written out in fp32, which made the
    unfused form the draft's largest cost on CPU; the kernel accumulates in fp32 under bf16. An
    ElementMask over the budget runs in blocks of query rows, each recomputed in backward (its mask too),
    so neither the scores nor the mask grow as N^2.
    """
    q, k, v = attn.project(x, cos, sin)  # (B, h, N, d), (B, h_kv, N, d) x2
    if cache is not None:
        k, v = cache.append(k, v)  # (B, h_kv, S + N, d)
    gqa = attn.num_heads != attn.num_kv_heads
    if isinstance(mask, ElementMask):  # training's elements: keys are the queries' own N (no cache)
        n = q.shape[2]
        if k.shape[2] != mask.size:
            raise ValueError(f"attend: an ElementMask covers {mask.size} keys, got {k.shape[2]}; pass a tensor "
                             "mask (B or 1, 1, N, S + N) with a KV cache")
        rows = attention_rows(q.shape[0] * q.shape[1], k.shape[2], mask.max_elements)
        if rows >= n:  # one block: the whole mask, built once for every layer
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.whole(), enable_gqa=gqa)
        if not torch.is_grad_enabled():
            return torch.cat([_block_attention(q[:, :, a : a + rows], k, v, mask, a, gqa) for a in range(0, n, rows)], 2)
        return torch.cat([checkpoint(_block_attention, q[:, :, a : a + rows], k, v, mask, a, gqa, use_reentrant=False)
                          for a in range(0, n, rows)], 2)
    if mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # an additive mask in the scores' dtype
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class PEagleDecoderLayer(nn.Module):
    """A plain Llama layer on H (`model.layers.{1..L-1}.*`): pre-norm attention and SwiGLU MLP."""

    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg, input_size=cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: "torch.Tensor | ElementMask",
                cache: DraftKVCache | None = None) -> torch.Tensor:
        """h (B, N, H) -> (B, N, H): r = h + attn(norm(h)); r + mlp(norm(r)). ``cache``: see :func:`attend`."""
        out = attend(self.self_attn, self.input_layernorm(h), cos, sin, mask, cache)  # (B, h, N, d)
        r = h + self.self_attn.o_proj(out.transpose(1, 2).flatten(2))  # (B, N, h*d) -> (B, N, H)
        return r + self.mlp(self.post_attention_layernorm(r))


@dataclass
class PEagleOutput:
    """Training/eval result. `loss` carries grad; the rest are detached (K,) batch sums."""

    loss: torch.Tensor
    depth_losses: torch.Tensor  # (K,) mean KL per depth over its charged elements
    depth_correct: torch.Tensor  # (K,) int64: draft argmax == target's full-vocab argmax
    depth_prefix: torch.Tensor  # (K,) int64: depths 0..d all agree at the same anchor
    depth_count: torch.Tensor  # (K,) int64: charged elements per depth (draft-vocab misses included)
    parts: Optional[LossParts] = None  # loss = parts.loss(): KL summed over charged elements / their count

    @property
    def sums(self) -> dict[str, torch.Tensor]:
        """The (K,) counts that add up across micro-batches (see :func:`summarize`)."""
        return {"depth_correct": self.depth_correct, "depth_prefix": self.depth_prefix, "depth_count": self.depth_count}

    @property
    def depth_accuracy(self) -> torch.Tensor:
        """(K,) per-depth top-1 agreement rate."""
        return self.depth_correct.double() / self.depth_count.double().clamp(min=1)

    @property
    def simulated_tau(self) -> float:
        """1 + sum_d P(depths 0..d all agree at one anchor): tokens per target forward (bonus included)."""
        return simulated_tau(self.depth_prefix, self.depth_count)


class PEagleDraft(PEagleInference, nn.Module):
    """P-EAGLE draft: the EAGLE layout's modules (built by eagle_layers.add_eagle_modules, so the vocab map,
    embeddings, fc and head are EAGLE-3's under the same names) plus layers 1..L-1 and `mask_hidden`."""

    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        add_eagle_modules(self, cfg)
        self.model.layers.extend(PEagleDecoderLayer(cfg) for _ in range(cfg.num_draft_layers - 1))
        # N(0, 1) like the reference, not 0.02: it passes fc_norm/fc like a real aux state.
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, cfg.num_aux * cfg.target_hidden_size))
        # recompute each layer in backward instead of keeping its activations (train.activation_checkpointing);
        # the loss and gradients are the same up to rounding
        self.activation_checkpointing = False
        self.max_score_elements = MAX_ELEMENTS  # attention scores per block of query rows (ElementMask)

    # the EAGLE head (drafts/eagle_layers.py), composed in: P-EAGLE's layer 0, fc, norm and lm_head are EAGLE-3's
    set_vocab_map = eagle_layers.set_vocab_map
    draft_to_target = eagle_layers.draft_to_target
    load_target_embeddings = eagle_layers.load_target_embeddings
    init_from_target = eagle_layers.init_from_target
    init_layer_from_target = eagle_layers.init_layer_from_target
    combine = eagle_layers.combine
    compute_logits = eagle_layers.compute_logits

    def run_layers(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                   mask: "torch.Tensor | ElementMask", caches: list[DraftKVCache] | None = None) -> torch.Tensor:
        """All draft layers over a flat element sequence -> norm(h) (B, N, H).

        hidden (B, N, H) layer-0 draft state (fc output), input_ids (B, N) target ids, positions (B, N)
        RoPE positions, mask an :class:`ElementMask` or a (B or 1, 1, N, N) bool/additive tensor (see
        :func:`attend`). ``caches``: one per layer, each holding S earlier slots; the N new slots are
        appended to every one and mask is (B or 1, 1, N, S + N).
        """
        # activation checkpointing: training only (no grad or a KV cache is inference, nothing to save)
        recompute = self.activation_checkpointing and caches is None and torch.is_grad_enabled()
        caches = caches if caches is not None else [None] * len(self.model.layers)
        cos, sin = self.rotary(positions)  # (B, N, d) each
        layer0 = self.model.layers[0]
        hidden = hidden.to(self.model.fc.weight.dtype)

        def first(embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:  # (B, N, H) x2 -> (B, N, H)
            x = layer0.fuse(embeds, hidden)  # (B, N, 2H)
            return layer0.finish(attend(layer0.self_attn, x, cos, sin, mask, caches[0]), residual=layer0.residual(hidden))

        embeds = self.model.embed_tokens(input_ids)
        h = checkpoint(first, embeds, hidden, use_reentrant=False) if recompute else first(embeds, hidden)
        for layer, cache in zip(self.model.layers[1:], caches[1:]):
            h = checkpoint(layer, h, cos, sin, mask, use_reentrant=False) if recompute else layer(h, cos, sin, mask, cache)
        return self.model.norm(h)

    def flat_forward(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, anchor: torch.Tensor,
                     depth: torch.Tensor, real: torch.Tensor, doc_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Elements (B, N) over aux_hidden (B, T, n, Ht) and input_ids (B, T) -> norm(h) (B, N, H).

        doc_ids (B, T): packed rows; an element belongs to its anchor's document, attends within it, and
        rotates at its anchor's position in that document + depth (what its own row would use)."""
        h_ctx = self.combine(aux_hidden)  # (B, T, H)
        a = anchor.clamp(0, input_ids.shape[1] - 1)
        h0 = h_ctx.gather(1, a[..., None].expand(-1, -1, h_ctx.shape[-1]))  # (B, N, H)
        is0 = (depth == 0)[..., None]
        hidden = torch.where(is0, h0, self.combine(self.mask_hidden).to(h0.dtype))  # mask: (1, 1, H)
        ids = torch.where(depth == 0, input_ids.gather(1, a), self.cfg.mask_token_id)
        if doc_ids is None:
            positions, doc = anchor, None
        else:
            positions, doc = document_positions(doc_ids).gather(1, a), doc_ids.gather(1, a)  # (B, N) each
        mask = ElementMask(anchor, depth, real, doc, self.max_score_elements)
        return self.run_layers(hidden, ids, (positions + depth).clamp(min=0), mask)

    def forward(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, target_probs: torch.Tensor,
                loss_mask: torch.Tensor, generator: torch.Generator | RowGenerators = None,
                cod: bool = True, position_mask: Optional[torch.Tensor] = None,
                doc_ids: Optional[torch.Tensor] = None) -> PEagleOutput:
        """Parallel-drafting loss over EAGLE-3 supervision (right padding only).

        aux_hidden (B, T, n, Ht) unshifted; input_ids (B, T) = token_{t+1}; target_probs (B, T, Vd) =
        target distribution of token_{t+2}; loss_mask (B, T) shifted (use Eagle3Supervision.loss_mask:
        unlike EAGLE-3, elements whose target argmax lies outside the draft vocab stay charged).
        cod=True samples COD elements per row with `generator` (one, or one per row); cod=False takes every (anchor, depth)
        with ref < T (held-out metrics). Right padding is harmless: padded depth-0 slots are only
        visible to later (padded, uncharged) anchors.
            loss = sum_charged KL(p_ref || softmax(logits)) / #charged,  ref = anchor + depth < T,
        charged where loss_mask[ref] == 1; KL in fp32 summed over the draft vocab.
        Metrics count every charged element; a hit also needs position_mask[ref] (B, T) (the target's
        full-vocab argmax lies in the draft vocab; None: always), since p's argmax over the draft vocab
        is then another token than the target's and the draft could not have proposed the real one.
        doc_ids (B, T): packed rows (module docstring); document j samples with generator j (its
        conversation's, or the one given) in its own coordinates, and charges only refs in its own run.
        """
        cfg = self.cfg
        b, t = input_ids.shape
        valid = loss_mask.bool()

        def sample(i: int, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # conversation i's valid (T_i,)
            if cod:
                return cod_sample(v, cfg.num_depths, cfg.down_sample_ratio, cfg.down_sample_ratio_min,
                                  row_generator(generator, i))
            return full_sample(v.shape[0], cfg.num_depths)

        if doc_ids is None:
            rows = [sample(i, valid[i]) for i in range(b)]
        else:
            rows = packed_sample(doc_ids, valid, sample)
        anchor, depth, real = (x.to(input_ids.device) for x in pad_elements(rows))
        normed = self.flat_forward(aux_hidden, input_ids, anchor, depth, real, doc_ids)  # (B, N, H)
        ref = anchor + depth
        charged = real & (ref < t) & valid.gather(1, ref.clamp(0, t - 1))  # (B, N)
        if doc_ids is not None:  # never a ref in the next document (sampling keeps it inside already)
            charged &= doc_ids.gather(1, ref.clamp(0, t - 1)) == doc_ids.gather(1, anchor.clamp(0, t - 1))
        # lm_head, log-softmax and KL on charged rows only: (M, H) -> (M, Vd)
        logits = self.compute_logits(normed[charged])
        bi = torch.arange(b, device=ref.device)[:, None].expand_as(ref)[charged]
        p = target_probs[bi, ref[charged]].float()  # (M, Vd)
        kl = (torch.xlogy(p, p) - p * logits.log_softmax(-1)).sum(-1)  # (M,); 0 log 0 = 0
        parts = LossParts.of([kl.sum()], [charged.sum()], [1.0])  # loss = sum KL / #charged
        loss = parts.loss()
        with torch.no_grad():
            k, d_c = cfg.num_depths, depth[charged]
            count = torch.bincount(d_c, minlength=k)
            hit = logits.argmax(-1) == p.argmax(-1)  # (M,)
            if position_mask is not None:  # out of the draft vocab: a miss, still in depth_count
                hit &= position_mask.bool()[bi, ref[charged]]
            table = torch.zeros(b, t, k, dtype=torch.long, device=ref.device)  # [b, anchor, depth] agrees
            table[bi, anchor[charged], d_c] = hit.long()
            return PEagleOutput(
                loss=loss,
                depth_losses=torch.bincount(d_c, kl.detach(), minlength=k) / count.clamp(min=1),
                depth_correct=torch.bincount(d_c[hit], minlength=k),
                depth_prefix=table.cumprod(-1).sum((0, 1)),  # a miss or an uncharged depth ends the chain
                depth_count=count,
                parts=parts,
            )

    def supervised(self, sup: Any, generators: RowGenerators = None) -> PEagleOutput:
        """:meth:`forward` on ``eagle3`` supervision: COD while training (row i draws from
        ``generators[i]``; None: torch's global RNG, which every checkpoint saves), every (anchor,
        depth) in eval mode (held-out metrics). Packed supervision (``doc_ids``, train/packing.py):
        conversation i is document i, drawn with ``generators[i]`` as unpacked."""
        return self(sup.aux_hidden.float(), sup.input_ids, sup.target_probs, sup.loss_mask,
                    generator=generators if self.training else None, cod=self.training,
                    position_mask=sup.position_mask, doc_ids=getattr(sup, "doc_ids", None))

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json: EAGLE-3's plus the parallel-drafting keys (PEagleConfig.to_export)."""
        return self.cfg.to_export(aux_layer_ids, torch_dtype)


# ---------------------------------------------------------------------------------- training contract
def attach_target(model: PEagleDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any,
                  layer: Callable[[int], dict] | None = None) -> None:
    """The EAGLE layout's (embeddings, vocab map, lm_head rows + final norm, layer 0 from a target layer when
    asked), but embeddings train by default."""
    eagle_layers.attach_target(model, draft, embeddings=embeddings, head=head, vocab=vocab,
                               freeze_default=FREEZE_EMBEDDINGS, layer=layer)


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """Per-depth accuracy and simulated parallel tau from summed :attr:`PEagleOutput.sums`.

    The simulated tau drafts all K depths at every anchor and accepts the longest agreeing prefix
    (1 + sum_d P(depths 0..d agree)); on held-out data it is computed without COD.
    """
    return eagle_summary.position_summary(sums["depth_correct"], sums["depth_prefix"], sums["depth_count"])


def describe(summary: dict) -> str:
    """The EAGLE families' line (eagle_summary.describe), per depth and with the parallel tau."""
    return eagle_summary.describe(summary, "depth")
