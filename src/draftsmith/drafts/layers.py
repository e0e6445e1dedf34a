"""Building blocks shared by the drafts: RMSNorm, rotary embedding, GQA helper, SwiGLU MLP, a KV cache.

Model math only (no I/O). Conventions follow HF Llama, which is also what vLLM serves:
- RMSNorm normalises in fp32 and casts back before the weight multiply.
- Rotary uses the "rotate_half" (GPT-NeoX) layout: dims [0, d/2) pair with [d/2, d). Its tables cover
  every rope type of drafts/rope.py (default, linear, llama3, yarn, longrope, dynamic), each as vLLM
  computes the draft's (the engine that serves it), attention factor on cos and sin included.
- `inv_freq` is always fp32, whatever dtype the module is cast to: in bf16 the angles
  `position * inv_freq` lose precision quickly (positions in the thousands), which would make the
  training-time rotation differ from the fp32 rotation the serving engine applies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .rope import (attention_scaling, dynamic_theta, rope_problems, rope_type, use_long_factors, with_original_len,
                   yarn_correction_range, yarn_factor)

__all__ = ["RMSNorm", "RotaryEmbedding", "apply_rotary", "rotate_half", "repeat_kv", "SwiGLU", "DraftKVCache",
           "LossParts", "conditional_rates", "document_positions"]


class RMSNorm(nn.Module):
    """`weight * x / sqrt(mean(x^2) + eps)`, normalised in fp32 and cast back to x's dtype."""

    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (..., H) -> (..., H)
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def _theta_powers(head_dim: int, theta: float) -> torch.Tensor:
    """(head_dim/2,) fp32 theta^(2i/d) = 1 / w_i."""
    return theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)


def _base_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    """(head_dim/2,) fp32 base frequencies w_i = theta^(-2i/d)."""
    return 1.0 / _theta_powers(head_dim, theta)


def _inv_freq(head_dim: int, theta: float, rope_scaling: dict | None, max_position_embeddings: int) -> torch.Tensor:
    """(head_dim/2,) fp32 frequencies whose angle at position p is p * inv_freq (linear's p / factor;
    see :attr:`RotaryEmbedding.position_divisor`), per type as drafts/rope.py's docstring states."""
    kind = rope_type(rope_scaling)
    if kind in ("default", "linear"):  # linear scales the position, as vLLM does
        return _base_inv_freq(head_dim, theta)
    p = rope_scaling
    if kind == "dynamic":
        return _base_inv_freq(head_dim, dynamic_theta(p, theta, head_dim, max_position_embeddings))
    if kind == "longrope":
        side = "long_factor" if use_long_factors(p, max_position_embeddings) else "short_factor"
        f = torch.tensor([float(x) for x in p[side]], dtype=torch.float32)  # (d/2,) one factor per frequency
        return 1.0 / (f * _theta_powers(head_dim, theta))
    if kind == "yarn":
        factor = float(yarn_factor(p, max_position_embeddings))
        powers = _theta_powers(head_dim, theta)
        kept, scaled = 1.0 / powers, 1.0 / (factor * powers)  # w_i, w_i / factor
        lo, hi = yarn_correction_range(p, head_dim, theta)
        if lo == hi:
            hi += 0.001  # a one-dim ramp
        r = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)  # (d/2,) 0 -> 1
        keep = 1 - r  # weight of w_i: 1 below lo (fast dims), 0 above hi
        return scaled * (1 - keep) + kept * keep
    # llama3 (Llama 3.1): by wavelength 2 pi / w_i against L / low_freq_factor and L / high_freq_factor
    inv = _base_inv_freq(head_dim, theta)
    factor = float(p["factor"])
    low, high = float(p["low_freq_factor"]), float(p["high_freq_factor"])
    old_len = float(p["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low) if high != low else torch.zeros_like(inv)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding returning fp32 `(cos, sin)` tables for given positions, for every
    rope type of drafts/rope.py (default, linear, llama3, yarn, longrope, dynamic) as vLLM computes
    the draft's: angle = (p / position_divisor) * inv_freq, cos and sin times `attention_scaling`
    (yarn's and longrope's m; 1.0 otherwise).

    `inv_freq` is a non-persistent buffer that is recomputed in fp32 after every `.to()/.half()/
    .bfloat16()/.cuda()` (see `_apply`), so it never carries a low-precision copy.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float = 10000.0,
        rope_scaling: dict | None = None,
        max_position_embeddings: int = 2048,
    ):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary head_dim={head_dim} must be even (rotate_half pairs dims)")
        rope_scaling = with_original_len(rope_scaling, max_position_embeddings)
        problems = rope_problems(rope_scaling, head_dim, where="rope_scaling")
        if problems:
            raise ValueError(problems[0])
        self.head_dim, self.theta = head_dim, float(theta)
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.max_position_embeddings = max_position_embeddings
        kind = rope_type(self.rope_scaling)
        self.position_divisor = float(self.rope_scaling["factor"]) if kind == "linear" else 1.0
        self.attention_scaling = attention_scaling(self.rope_scaling, max_position_embeddings)
        self.register_buffer("inv_freq", self._table(), persistent=False)

    def _table(self) -> torch.Tensor:
        return _inv_freq(self.head_dim, self.theta, self.rope_scaling, self.max_position_embeddings)

    def _apply(self, fn, recurse: bool = True):
        # Module.to(dtype) casts floating buffers too; rebuild inv_freq exactly in fp32 on the new device.
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        if device.type != "meta":
            self.inv_freq = self._table().to(device)
        else:
            self.inv_freq = torch.empty(self.head_dim // 2, dtype=torch.float32, device=device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) int64 -> (cos, sin), each (B, T, head_dim) fp32."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            pos = positions[..., None].float()  # (B, T, 1)
            if self.position_divisor != 1.0:
                pos = pos / self.position_divisor
            freqs = pos * self.inv_freq.float()  # (B, T, d/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, d): same angle for dim i and i + d/2
            cos, sin = emb.cos(), emb.sin()
            if self.attention_scaling != 1.0:
                cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
            return cos, sin

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, theta={self.theta}, rope_scaling={self.rope_scaling}"


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dim."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, heads, T, d) by cos/sin (B, T, d): `x*cos + rotate_half(x)*sin`.

    Computed in fp32 and cast back to x's dtype.
    """
    cos, sin = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()  # (B, 1, T, d) broadcast over heads
    x32 = x.float()
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """GQA: (B, h_kv, T, d) -> (B, h_kv * n_rep, T, d); query head i uses kv head i // n_rep."""
    if n_rep == 1:
        return x
    b, h_kv, t, d = x.shape
    return x[:, :, None].expand(b, h_kv, n_rep, t, d).reshape(b, h_kv * n_rep, t, d)


class SwiGLU(nn.Module):
    """Llama MLP: `down_proj(silu(gate_proj(x)) * up_proj(x))`, no biases. (..., H) -> (..., H)."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


@dataclass
class DraftKVCache:
    """Rotated keys and values of every slot so far: each (B, h_kv, S, d), or None when empty. One per
    attention layer of an incrementally run draft (EAGLE-3's chain, P-EAGLE's per-layer caches)."""

    keys: Optional[torch.Tensor] = None
    values: Optional[torch.Tensor] = None

    def __len__(self) -> int:
        return 0 if self.keys is None else int(self.keys.shape[2])

    def crop(self, length: int) -> None:
        """Keep the first ``length`` slots (drop drafted slots after verification)."""
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


@dataclass
class LossParts:
    """A loss written as ratios: ``loss = sum_i coef_i * num_i / max(den_i, 1e-6)``.

    num (P,) carries grad (sums over supervised elements), den (P,) is detached (their counts or
    weights), coef (P,) are constants. Every family builds its loss with :meth:`loss`, so the trainer
    can normalise by counts summed over ranks: with den summed over the global micro-batch, the
    gradient of ``world * loss(den_global)`` averaged over ranks (what DDP and FSDP do) equals the
    gradient of one process holding every rank's rows.
    """

    num: torch.Tensor
    den: torch.Tensor
    coef: torch.Tensor

    def loss(self, den: Optional[torch.Tensor] = None, num: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The scalar loss, optionally with another ``den`` (e.g. summed over ranks) or ``num``."""
        num = self.num if num is None else num
        den = (self.den if den is None else den).to(num.dtype).clamp(min=1e-6)
        return (self.coef.to(num.device, num.dtype) * num / den).sum()

    @staticmethod
    def of(num: Sequence[torch.Tensor], den: Sequence[torch.Tensor], coef: Sequence[float]) -> "LossParts":
        """From per-part scalars: ``num`` with grad, ``den`` counts (detached here), ``coef`` floats."""
        n = torch.stack([x.float().reshape(()) for x in num])
        d = torch.stack([torch.as_tensor(x).detach().float().reshape(()).to(n.device) for x in den])
        return LossParts(n, d, torch.tensor([float(c) for c in coef], device=n.device))


RowGenerators = Optional[Sequence[torch.Generator]]


def row_generator(generators: Union[RowGenerators, torch.Generator], row: int) -> Optional[torch.Generator]:
    """Row ``row``'s generator: the trainer passes one per row (training randomness keyed by the
    conversation, so a row draws the same samples whichever rank or micro-batch holds it); a single
    generator or None applies to every row."""
    if generators is None or isinstance(generators, torch.Generator):
        return generators
    return generators[row]


def document_positions(doc: torch.Tensor) -> torch.Tensor:
    """A packed row's (``data.packing``) RoPE positions, what each conversation's own row rotates at.

    doc (B, T) int -> (B, T) int64: each slot's position within its document, 0 at the document's first
    slot (a document is a run of equal ids). Padding's run counts on too: no real slot reads it."""
    b, t = doc.shape
    idx = torch.arange(t, device=doc.device).expand(b, t)  # (B, T)
    first = torch.ones_like(doc, dtype=torch.bool)
    first[:, 1:] = doc[:, 1:] != doc[:, :-1]
    start = torch.where(first, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (B, T) first slot of its run
    return idx - start


def conditional_rates(prefix: torch.Tensor, count: torch.Tensor) -> list[float]:
    """(K,) prefix hits and positions per drafted position -> (K,) conditional acceptance rates.

    rate_k = prefix_k / count_k is the share of chains whose first k+1 drafts all agree (vLLM's
    "per-position acceptance rate", accepted_per_pos_k / drafts); cond_k = rate_k / rate_{k-1}
    (rate_{-1} = 1) is the chance that draft k is accepted given drafts 0..k-1 were. With equal counts
    per position (every vLLM draft has K positions) this is prefix_k / prefix_{k-1}. Where a deeper
    position has fewer positions (a sequence's tail), the ratio of rates still keeps
    rate_k = prod_{j <= k} cond_j, so simulated tau = 1 + sum_k prod_{j <= k} cond_j. When no chain
    reached k-1, cond_k is 0.
    """
    rate = prefix.double() / count.double().clamp(min=1)  # (K,)
    prev = torch.cat([rate.new_ones(1), rate[:-1]])  # (K,) rate_{k-1}
    return torch.where(prev > 0, rate / prev.clamp(min=1e-300), rate.new_zeros(())).tolist()
