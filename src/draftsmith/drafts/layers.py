"""Building blocks shared by the drafts: RMSNorm, rotary embedding, GQA helper, SwiGLU MLP.

Model math only (no I/O). Conventions follow HF Llama, which is also what vLLM serves:
- RMSNorm normalises in fp32 and casts back before the weight multiply.
- Rotary uses the "rotate_half" (GPT-NeoX) layout: dims [0, d/2) pair with [d/2, d).
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

__all__ = ["RMSNorm", "RotaryEmbedding", "apply_rotary", "rotate_half", "repeat_kv", "SwiGLU", "LossParts",
           "conditional_rates", "document_positions"]


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


def _inv_freq(head_dim: int, theta: float, rope_scaling: dict | None) -> torch.Tensor:
    """Inverse frequencies (head_dim/2,) fp32 for the supported `rope_scaling` types.

    default: theta^(-2i/d). linear: divided by `factor`. llama3 (Llama 3.1): wavelengths longer than
    `original_max_position_embeddings / low_freq_factor` are divided by `factor`, shorter than
    `.../high_freq_factor` are kept, and the band between is interpolated smoothly.
    """
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = _rope_type(rope_scaling)
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(rope_scaling["factor"])
    # llama3
    factor = float(rope_scaling["factor"])
    low, high = float(rope_scaling["low_freq_factor"]), float(rope_scaling["high_freq_factor"])
    old_len = float(rope_scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    low_wavelen, high_wavelen = old_len / low, old_len / high
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rope_type(rope_scaling: dict | None) -> str:
    if not rope_scaling:
        return "default"
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if kind not in ("default", "linear", "llama3"):
        raise ValueError(
            f"rope_scaling type {kind!r} is not supported; expected one of None, 'default', "
            "'linear', 'llama3' (set rope_scaling accordingly or extend drafts/layers.py)"
        )
    return kind


class RotaryEmbedding(nn.Module):
    """Rotary position embedding returning fp32 `(cos, sin)` tables for given positions.

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
        _rope_type(rope_scaling)  # validate early
        self.head_dim, self.theta = head_dim, float(theta)
        self.rope_scaling = dict(rope_scaling) if rope_scaling else None
        self.max_position_embeddings = max_position_embeddings
        self.register_buffer("inv_freq", _inv_freq(head_dim, self.theta, self.rope_scaling), persistent=False)

    def _apply(self, fn, recurse: bool = True):
        # Module.to(dtype) casts floating buffers too; rebuild inv_freq exactly in fp32 on the new device.
        super()._apply(fn, recurse)
        device = self.inv_freq.device
        if device.type != "meta":
            self.inv_freq = _inv_freq(self.head_dim, self.theta, self.rope_scaling).to(device)
        else:
            self.inv_freq = torch.empty(self.head_dim // 2, dtype=torch.float32, device=device)
        return self

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (B, T) int64 -> (cos, sin), each (B, T, head_dim) fp32."""
        with torch.autocast(device_type=positions.device.type, enabled=False):
            freqs = positions[..., None].float() * self.inv_freq.float()  # (B, T, d/2)
            emb = torch.cat((freqs, freqs), dim=-1)  # (B, T, d): same angle for dim i and i + d/2
            return emb.cos(), emb.sin()

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
