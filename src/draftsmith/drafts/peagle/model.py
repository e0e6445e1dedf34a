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

Inference (`propose`, `propose_cached`, as vLLM 0.32 runs a parallel draft) lives in infer.py, with the
parallel proposer. The EAGLE-3 parts are composed, not inherited: the same modules (eagle3.model's
`Eagle3Model`, `Eagle3Attention`) under the same on-disk names, and EAGLE-3's head functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..eagle3 import model as eagle3
from ..eagle3.infer import DraftKVCache
from ..eagle3.model import Eagle3Attention, add_eagle_modules, simulated_tau
from ..layers import LossParts, RMSNorm, RowGenerators, SwiGLU, row_generator
from .config import PEagleConfig
from .infer import PEagleInference, PEagleProposal

__all__ = ["PEagleDraft", "PEagleOutput", "PEagleProposal", "cod_sample", "full_sample",
           "pad_elements", "visibility", "attention_mask"]

PROGRESS = {"acc": "acc0", "tau": "simulated_tau"}
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


def visibility(anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(B, N) element lists -> (B, N, N) bool, [b, q, kv] = kv visible to q.

    The predicate between real elements, plus the diagonal for padding queries so that no softmax
    row is empty (padding rows are never charged). Rows are separate batch entries (no packing).
    """
    aq, ak = anchor[:, :, None], anchor[:, None, :]
    dq, dk = depth[:, :, None], depth[:, None, :]
    pred = ((dk == 0) & (aq >= ak)) | ((aq == ak) & (dq >= dk))
    eye = torch.eye(anchor.shape[1], dtype=torch.bool, device=anchor.device)
    return (pred & real[:, :, None] & real[:, None, :]) | eye


def attention_mask(anchor: torch.Tensor, depth: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """Dense additive mask (B, 1, N, N) fp32: 0 where visible, -inf elsewhere."""
    vis = visibility(anchor, depth, real)
    return torch.zeros(vis.shape, dtype=torch.float32, device=vis.device).masked_fill(~vis, float("-inf"))[:, None]


def attend(attn: Eagle3Attention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           mask: torch.Tensor, cache: DraftKVCache | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v: x (B, N, in) -> (B, h, N, d).

    With ``cache`` (S slots) the N new keys/values are appended to it first and the queries attend
    to all S + N of them: mask (B or 1, 1, N, S + N). One fused SDPA call: the dense (B, h, N, N)
    scores of a P-EAGLE row (N ~ 3.4 T elements at K=8) are never written out in fp32, which made
    the unfused form the draft's largest cost on CPU; the kernel accumulates in fp32 under bf16.
    """
    q, k, v = attn.project(x, cos, sin)  # (B, h, N, d), (B, h_kv, N, d) x2
    if cache is not None:
        k, v = cache.append(k, v)  # (B, h_kv, S + N, d)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype),
                                                            enable_gqa=attn.num_heads != attn.num_kv_heads)


class PEagleDecoderLayer(nn.Module):
    """A plain Llama layer on H (`model.layers.{1..L-1}.*`): pre-norm attention and SwiGLU MLP."""

    def __init__(self, cfg: PEagleConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg, input_size=cfg.hidden_size)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
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
    """P-EAGLE draft: the EAGLE-3 modules (built by eagle3.model.add_eagle_modules, so the vocab map,
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

    # EAGLE-3's head (eagle3/model.py), composed in: P-EAGLE's layer 0, fc, norm and lm_head are EAGLE-3's
    set_vocab_map = eagle3.set_vocab_map
    draft_to_target = eagle3.draft_to_target
    load_target_embeddings = eagle3.load_target_embeddings
    init_from_target = eagle3.init_from_target
    combine = eagle3.combine
    compute_logits = eagle3.compute_logits

    def run_layers(self, hidden: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor, caches: list[DraftKVCache] | None = None) -> torch.Tensor:
        """All draft layers over a flat element sequence -> norm(h) (B, N, H).

        hidden (B, N, H) layer-0 draft state (fc output), input_ids (B, N) target ids, positions (B, N)
        RoPE positions, mask (B or 1, 1, N, N) additive fp32. ``caches``: one per layer, each holding
        S earlier slots; the N new slots are appended to every one and mask is (B or 1, 1, N, S + N).
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
                     depth: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Elements (B, N) over aux_hidden (B, T, n, Ht) and input_ids (B, T) -> norm(h) (B, N, H)."""
        h_ctx = self.combine(aux_hidden)  # (B, T, H)
        a = anchor.clamp(0, input_ids.shape[1] - 1)
        h0 = h_ctx.gather(1, a[..., None].expand(-1, -1, h_ctx.shape[-1]))  # (B, N, H)
        is0 = (depth == 0)[..., None]
        hidden = torch.where(is0, h0, self.combine(self.mask_hidden).to(h0.dtype))  # mask: (1, 1, H)
        ids = torch.where(depth == 0, input_ids.gather(1, a), self.cfg.mask_token_id)
        return self.run_layers(hidden, ids, (anchor + depth).clamp(min=0), attention_mask(anchor, depth, real))

    def forward(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, target_probs: torch.Tensor,
                loss_mask: torch.Tensor, generator: torch.Generator | RowGenerators = None,
                cod: bool = True, position_mask: Optional[torch.Tensor] = None) -> PEagleOutput:
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
        """
        cfg = self.cfg
        b, t = input_ids.shape
        valid = loss_mask.bool()
        rows = [cod_sample(valid[i], cfg.num_depths, cfg.down_sample_ratio, cfg.down_sample_ratio_min,
                           row_generator(generator, i))
                if cod else full_sample(t, cfg.num_depths) for i in range(b)]
        anchor, depth, real = (x.to(input_ids.device) for x in pad_elements(rows))
        normed = self.flat_forward(aux_hidden, input_ids, anchor, depth, real)  # (B, N, H)
        ref = anchor + depth
        charged = real & (ref < t) & valid.gather(1, ref.clamp(0, t - 1))  # (B, N)
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
        depth) in eval mode (held-out metrics)."""
        return self(sup.aux_hidden.float(), sup.input_ids, sup.target_probs, sup.loss_mask,
                    generator=generators if self.training else None, cod=self.training,
                    position_mask=sup.position_mask)

    def export_config(self, aux_layer_ids: list[int], torch_dtype: str = "float32") -> dict:
        """config.json: EAGLE-3's plus the parallel-drafting keys (PEagleConfig.to_export)."""
        return self.cfg.to_export(aux_layer_ids, torch_dtype)


# ---------------------------------------------------------------------------------- training contract
def attach_target(model: PEagleDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any) -> None:
    """As EAGLE-3 (embeddings, vocab map, lm_head rows + final norm), but embeddings train by default."""
    eagle3.attach_target(model, draft, embeddings=embeddings, head=head, vocab=vocab, freeze_default=FREEZE_EMBEDDINGS)


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """Per-depth accuracy and simulated parallel tau from summed :attr:`PEagleOutput.sums`.

    The simulated tau drafts all K depths at every anchor and accepts the longest agreeing prefix
    (1 + sum_d P(depths 0..d agree)); on held-out data it is computed without COD.
    """
    return eagle3.position_summary(sums["depth_correct"], sums["depth_prefix"], sums["depth_count"])


scalars = eagle3.scalars


def describe(summary: dict) -> str:
    return eagle3.describe(summary, "depth")
