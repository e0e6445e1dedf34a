"""DSpark draft: the parallel block backbone (drafts/block.py) plus a sequential Markov head and a
confidence head, with the DSpark paper's loss.

Model math only (no I/O, no engines). On-disk names are vLLM's ``Qwen3DSparkModel`` ones (no ``model.``
prefix): the backbone's plus ``markov_head.markov_w1.weight`` (V, r), ``markov_head.markov_w2.weight``
(V, r) and ``confidence_head.proj.{weight (1, H [+ r]), bias (1,)}``; embeddings and lm_head are the
target's, borrowed.

Block (label offset 1, vLLM's ``sample_from_anchor``): K = block_size slots [anchor, MASK x K-1] at
positions a .. a+K-1; slot k predicts the token at a + k + 1, so the anchor slot drafts the first token.
    e_k      = W1[prev_k]                        (r,)  prev_0 = the anchor, prev_k = token a + k
    logits_k = lm_head(h_k) + W2 e_k             (V,)  what vLLM's speculator samples, left to right
    c_k      = sigmoid(proj([h_k | e_k]))              the slot's acceptance estimate (vLLM:
                                                       compute_confidence; [h_k] alone without markov)
Training is teacher-forced: prev_k is the data token a + k (at inference, the token drafted at slot
k - 1). With p_k = softmax(logits_k) and q_k the target's distribution for token a + k + 1 (its logits
at row a + k, rebuilt from ``dflash_kd`` supervision's last state with the target's final norm and
lm_head), per supervised slot m (weight w_m = exp(-k/gamma)):
    TV_m  = 1/2 sum_v |p - q|            alpha_m = sum_v min(p, q) = 1 - TV_m  (acceptance probability
                                                                                of speculative sampling)
    loss  = [ce_w sum w CE(logits, data token) + tv_w sum w TV + conf_w sum w BCE(c, alpha.detach())] / sum w
(paper: ce_w 0.1, tv_w 0.9, conf_w 1.0). Accuracy and accept length compare the draft's argmax with
the target's (greedy acceptance). The (M, V) rows run a chunk at a time (drafts/chunked.py).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..block import BlockDraft, BlockOutput, block_metrics, teacher_positions
from ..chunked import chunked_rows
from ..layers import LossParts
from .config import DSparkConfig

__all__ = ["DSparkDraft", "MarkovHead", "ConfidenceHead", "attach_target"]


class MarkovHead(nn.Module):
    """Low-rank previous-token bias: ``markov_w1`` (V, r) embeds the previous token, ``markov_w2`` (V, r)
    maps it to a bias over the (draft = target) vocab. W2 starts at zero: training starts from the plain
    block draft and learns the correction."""

    def __init__(self, vocab_size: int, rank: int):
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)
        self.markov_w2 = nn.Linear(rank, vocab_size, bias=False)
        nn.init.normal_(self.markov_w1.weight, std=rank ** -0.5)
        nn.init.zeros_(self.markov_w2.weight)

    def embed(self, prev: torch.Tensor) -> torch.Tensor:
        """(...,) token ids -> (..., r)."""
        return self.markov_w1(prev)

    def bias(self, e: torch.Tensor) -> torch.Tensor:
        """(..., r) -> (..., V)."""
        return self.markov_w2(e)


class ConfidenceHead(nn.Module):
    """proj: (H [+ r]) -> 1 in fp32, as vLLM keeps it (ReplicatedLinear with fp32 params over .float())."""

    def __init__(self, input_dim: int, with_markov: bool):
        super().__init__()
        self.with_markov = with_markov
        self.proj = nn.Linear(input_dim, 1, bias=True)

    def forward(self, h: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """(M, H), (M, r) -> (M,) logits of the acceptance probability."""
        x = torch.cat([h, e.to(h.dtype)], -1) if self.with_markov else h
        with torch.autocast(h.device.type, enabled=False):
            return F.linear(x.float(), self.proj.weight.float(), self.proj.bias.float())[..., 0]


class DSparkDraft(BlockDraft):
    """The block backbone + :class:`MarkovHead` + (optional) :class:`ConfidenceHead`."""

    label_offset = 1  # slot k predicts token anchor + k + 1 (vLLM's sample_from_anchor)
    draft_type = "dspark"
    # the Markov walk conditions each slot on the token drafted before it; the exact evaluator draws rows
    # independently when sampling, which would not be what vLLM's speculator samples
    greedy_only = "DSpark drafts are evaluated greedily (its Markov head walks its own argmax, as vLLM's greedy drafting does)"

    def __init__(self, cfg: DSparkConfig):
        super().__init__(cfg)
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.markov_rank)
        self.confidence_head = None
        if cfg.confidence_head:
            dim = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_with_markov else 0)
            self.confidence_head = ConfidenceHead(dim, cfg.confidence_with_markov)

    def prev_tokens(self, input_ids: torch.Tensor, anchor: torch.Tensor) -> torch.Tensor:
        """(B, S) ids, (B, N) anchors -> (B, N, K) the token before each slot's prediction: token a + k."""
        s = input_ids.shape[1]
        pos = (anchor[..., None] + torch.arange(self.cfg.block_size, device=anchor.device)).clamp(max=s - 1)
        return input_ids.gather(1, pos.flatten(1)).view_as(pos)

    def block_loss(self, h: torch.Tensor, labels: torch.Tensor, lmask: torch.Tensor, anchor: torch.Tensor,
                   sup: Any) -> BlockOutput:
        b, n, bs, _ = h.shape
        cfg = self.cfg
        pos = teacher_positions(anchor, bs, self.label_offset)  # (B, N, bs): row a + k
        rows = torch.arange(b, device=h.device)[:, None, None].expand_as(pos)
        r, p = rows[lmask], pos[lmask]  # (M,) the target row of each supervised slot
        e = self.markov_head.embed(self.prev_tokens(sup.input_ids, anchor)[lmask])  # (M, r)
        w = self.loss_weights.to(h.device).expand_as(lmask)[lmask]  # (M,)
        hm = h[lmask]  # (M, H)
        conf = (self.confidence_head(hm, e) if self.confidence_head is not None
                else hm.new_zeros(hm.shape[0], dtype=torch.float32))  # (M,) logits
        last = sup.last_hidden  # (B, S, H) target states at id L

        def slot_losses(start, hc, ec, yc, wc, cc):  # one chunk of the M supervised slots
            c = hc.shape[0]
            logits = (self.logits(hc) + self.markov_head.bias(ec).to(hc.dtype)).float()  # (c, V)
            teacher = self.teacher_logits(last[r[start:start + c], p[start:start + c]]).float()  # (c, V)
            lp, lq = F.log_softmax(logits, -1), F.log_softmax(teacher, -1)
            tv = 0.5 * (lp.exp() - lq.exp()).abs().sum(-1)  # (c,)
            alpha = (1.0 - tv).clamp(0.0, 1.0).detach()  # = sum_v min(p, q)
            ce = F.nll_loss(lp, yc, reduction="none")
            bce = F.binary_cross_entropy_with_logits(cc, alpha, reduction="none")
            err = (torch.sigmoid(cc) - alpha).abs().detach()
            hits = logits.argmax(-1) == teacher.argmax(-1)
            return (wc * ce).sum(), (wc * tv).sum(), (wc * bce).sum(), err.sum(), tv.detach().sum(), hits

        ce, tv, bce, err, tv_sum, hits = chunked_rows(slot_losses, [hm, e, labels[lmask], w, conf], self.vocab_rows,
                                                      self.max_logit_elements)
        den = w.sum()
        conf_w = cfg.confidence_weight if self.confidence_head is not None else 0.0
        parts = LossParts.of([ce, tv, bce], [den, den, den], [cfg.ce_weight, cfg.tv_weight, conf_w])
        correct = torch.zeros_like(lmask)
        correct[lmask] = hits
        sums = block_metrics(correct.detach(), lmask, 0)
        sums.update(tv_sum=tv_sum.detach().reshape(1), conf_err_sum=err.detach().reshape(1))
        return BlockOutput(parts.loss(), sums, parts)

    def head_logits(self, h: torch.Tensor, anchor_token: int) -> torch.Tensor:
        """Greedy walk over the drafted rows h (k, H), as vLLM's speculator samples: row i adds the bias of the
        token drafted at row i - 1 (row 0: the anchor's) -> (k, V)."""
        out = []
        prev = torch.tensor([anchor_token], device=h.device)
        for i in range(h.shape[0]):
            logits = (self.logits(h[i:i + 1]) + self.markov_head.bias(self.markov_head.embed(prev)).to(h.dtype)).float()
            out.append(logits[0])
            prev = logits.argmax(-1)
        return torch.stack(out)

    def empty_sums(self, device: Any = None) -> dict:
        """Zeros with the block metrics' keys and DSpark's own (a micro-batch with no valid anchors)."""
        z = torch.zeros(1, dtype=torch.float32, device=device)
        return {**super().empty_sums(device), "tv_sum": z, "conf_err_sum": z.clone()}


def attach_target(model: DSparkDraft, draft: Any, *, embeddings: torch.Tensor,
                  head: Callable[[], tuple[torch.Tensor, torch.Tensor]], vocab: Any, layer: Any = None) -> None:
    """Borrow the target's embeddings and lm_head, and keep its final norm: the TV loss's target
    distribution is the target's own, rebuilt from its last state (``dflash_kd`` supervision)."""
    lm_head, norm = head()
    model.attach_target(embeddings, lm_head)
    model.attach_teacher(norm, model.cfg.rms_norm_eps)
