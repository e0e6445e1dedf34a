"""EAGLE-3 / EAGLE-3.1 draft: one fused decoder layer over (token embedding, fused target state), trained
with the training-time-test (TTT) unroll.

Model math only. The modules, their on-disk names and the head are the EAGLE layout's
(drafts/eagle_layers.py: layer 0's equations there); this file adds the unroll, its loss and metrics.
A chain step feeds back
    h_next  = norm(h_pre) if norm_output else h_pre            to the next draft step,
and TTT step k reproduces chain step k at every position at once (iter_steps).
"""


from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .. import eagle_layers
from ..chunked import attention_rows
from ..eagle_layers import (add_eagle_modules, combine, compute_logits, draft_to_target, init_from_target, init_layer_from_target,
                            load_target_embeddings, set_vocab_map)
from ..eagle_summary import position_summary, simulated_tau
from ..layers import LossParts, RowGenerators, document_positions
from .config import Eagle3Config, ttt_depth
from .ttt import (LOGIT_BLOCK_ELEMENTS, SCORE_BLOCK_ELEMENTS, attention_mask, frozen_head, logits_fn, same_document,
                  soft_ce_block, soft_ce_rows, step_kv, step_rows, ttt_attention, ttt_step_rows)

__all__ = ["Eagle3Draft", "Eagle3Output", "Eagle3Step", "shift_left", "attach_target", "summarize"]

FREEZE_EMBEDDINGS = True  # draft.freeze_embeddings when the run config leaves it null


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


class Eagle3Draft(nn.Module):
    """EAGLE-3 / 3.1 draft with the training-time-test (TTT) unroll, loss and acceptance metrics."""

    def __init__(self, cfg: Eagle3Config):
        super().__init__()
        add_eagle_modules(self, cfg)
        self.max_score_elements = SCORE_BLOCK_ELEMENTS  # attention scores per block (see attention_rows)
        self.max_logit_elements = LOGIT_BLOCK_ELEMENTS  # draft-vocab logits per block of loss rows
        # train.activation_checkpointing: each TTT step recomputed in backward (keeps its inputs, outputs, K/V)
        self.activation_checkpointing = False
        self.depth = cfg.ttt_steps  # TTT steps a training forward unrolls (set_progress: the depth curriculum)

    def set_progress(self, step: int, total: int) -> None:
        """The trainer's optimizer step of the steps it plans: the depth curriculum's depth
        (config.ttt_depth; ttt_steps throughout when draft.ttt_ramp_fraction is 0)."""
        self.depth = ttt_depth(self.cfg.ttt_steps, self.cfg.ttt_ramp_fraction, step, total)

    # the EAGLE head (drafts/eagle_layers.py), shared with P-EAGLE
    set_vocab_map = set_vocab_map
    draft_to_target = draft_to_target
    load_target_embeddings = load_target_embeddings
    init_from_target = init_from_target
    init_layer_from_target = init_layer_from_target
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
        # training unrolls the curriculum's depth (set_progress); evaluation always the full ttt_steps
        steps = self.depth if self.training else self.cfg.ttt_steps
        for k, step in enumerate(self.iter_steps(aux_hidden, input_ids, steps=steps, logits=False, doc_ids=doc_ids)):
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
        # (ttt_steps,) metric sums whatever the depth: the steps a shallow curriculum step skips count 0
        # positions (accuracy 0 over 0, no part of simulated tau), so sums add across a depth change
        pad = self.cfg.ttt_steps - len(correct)
        return Eagle3Output(
            loss=parts.loss(),
            step_losses=(parts.num / parts.den.clamp(min=1)).detach(),
            step_correct=F.pad(torch.stack(correct), (0, pad)),
            prefix_correct=F.pad(torch.stack(prefix_hits), (0, pad)),
            step_count=F.pad(torch.stack(counts), (0, pad)),
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
                  layer: Callable[[int], dict] | None = None) -> None:
    """The EAGLE layout's (eagle_layers.attach_target) with EAGLE-3's default: embeddings frozen."""
    eagle_layers.attach_target(model, draft, embeddings=embeddings, head=head, vocab=vocab,
                               freeze_default=FREEZE_EMBEDDINGS, layer=layer)


def summarize(sums: dict[str, torch.Tensor]) -> dict:
    """Per-step accuracy, simulated tau and supervised positions from summed :attr:`Eagle3Output.sums`."""
    return position_summary(sums["step_correct"], sums["prefix_correct"], sums["step_count"])
