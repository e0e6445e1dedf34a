"""DFlash-family configs: the run's ``draft`` sections (DFlash, and JetSpec / Domino over it) and the
model's (:class:`DFlashConfig`), both ways between it and an exported config.json. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..family import DraftConfig, positive
from ..rope import draft_rope, rope_of_config

__all__ = ["DFlashDraftConfig", "JetSpecDraftConfig", "DominoDraftConfig", "DFlashConfig", "ARCH",
           "EXPORTED_EXTRA", "layer_rule", "config_kwargs", "config_from_target", "config_from_export"]

ARCH = "Qwen3DFlashDraftModel"
# dflash_config keys a serving engine reads (Domino's head shape); the rest go under "draftsmith"
EXPORTED_EXTRA = ("projector_type", "emb_dim", "gru_hidden_dim", "pure_draft_prefix_len", "shift_label")


@dataclass
class DFlashDraftConfig(DraftConfig):
    """``draft`` section of ``type: dflash``: one forward drafts a block; num_draft_layers draft layers
    read as many target layers (evenly spaced unless target.aux_layer_ids says otherwise)."""

    type: str = "dflash"
    mask_token_id: Optional[int] = None  # required: a reserved/unused target token id (the block's MASK slots)
    num_draft_layers: int = 4  # draft decoder layers (and default target layers read)
    block_size: int = 16  # anchor + block_size - 1 drafted tokens; vLLM serves K = block_size - 1
    num_anchors: int = 64  # blocks sampled per conversation per step (on assistant tokens)
    loss_decay_gamma: Optional[float] = 7.0  # position k weighs exp(-(k-1)/gamma); DFlash uses 7 (bs 16), 5 (10), 4 (8); null = uniform

    def problems(self) -> list[str]:
        p = super().problems()
        if self.mask_token_id is None:
            p.append(f"'draft.mask_token_id' is required for draft.type {self.type}: set a reserved or unused token id "
                     "of the target (e.g. 16 <empty_output> for SmolLM2, 128002 for Llama-3)")
        if self.block_size < 2:
            p.append(f"'draft.block_size' = {self.block_size}: expected an integer >= 2 (the anchor plus at least "
                     "one drafted token); DFlash uses 16, 10 or 8")
        return p + positive(self, "num_anchors", "num_draft_layers")


@dataclass
class JetSpecDraftConfig(DFlashDraftConfig):
    """``draft`` section of ``type: jetspec``: DFlash's, causal in the block, distilled at a temperature."""

    type: str = "jetspec"
    kd_temperature: float = 1.0  # KD temperature T (loss x T^2)


@dataclass
class DominoDraftConfig(DFlashDraftConfig):
    """``draft`` section of ``type: domino``: DFlash's plus the GRU correction head."""

    type: str = "domino"
    emb_dim: int = 256  # embed_proj width
    gru_hidden_dim: int = 256  # prefix GRU width
    pure_draft_prefix_len: int = 0  # leading drafted tokens that use the base logits only
    shift_label: bool = True  # slot k predicts anchor + k + 1 (all block_size slots draft)
    lambda_start: float = 1.0  # base-loss weight at step 0 ...
    lambda_decay_ratio: float = 0.5  # ... falling linearly to 0 over this fraction of the steps


@dataclass
class DFlashConfig:
    """Shape and training knobs of a DFlash draft. ``target_layer_ids`` are in DFlash's on-disk
    convention: id j = output of target decoder layer j (our engine id j + 1)."""

    hidden_size: int  # = the target's: the draft reads its embeddings and lm_head
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: Optional[int]
    num_hidden_layers: int = 1
    block_size: int = 16
    causal: bool = False  # JetSpec: causal attention inside the block
    num_anchors: int = 64  # blocks sampled per row while training
    loss_decay_gamma: Optional[float] = 7.0  # w_k = exp(-(k-1)/gamma); None = uniform
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    extra: dict = field(default_factory=dict)  # family knobs (JetSpec temperature, Domino head); exported as is
    # the target's logit transforms (TargetInfo: Granite's 1/logits_scaling, Gemma's softcap), which the target's
    # distribution that JetSpec and DSpark distil goes through; training only (the served draft's logits are plain)
    target_logit_multiplier: float = 1.0
    target_logit_softcap: Optional[float] = None

    def __post_init__(self):
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.block_size) or self.block_size < 2:
            raise ValueError(f"block_size={self.block_size!r} must be an int >= 2 (the anchor plus at least one "
                             "drafted token); DFlash uses 16, 10 or 8")
        m, v = self.mask_token_id, self.vocab_size
        if not is_int(m) or not 0 <= m < v:
            raise ValueError(f"mask_token_id={m!r} must be an int in 0..{v - 1} (the target vocab); set it to a "
                             "reserved or unused token id, e.g. 16 for SmolLM2")
        ids, L = list(self.target_layer_ids), self.num_target_layers
        if not ids or any(not is_int(i) or not 0 <= i < L for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"target_layer_ids={ids!r} must be distinct decoder-layer outputs in 0..{L - 1} "
                             f"(engine ids 1..{L}: target.aux_layer_ids); fix target.aux_layer_ids")
        for key in ("num_hidden_layers", "num_anchors"):
            if not is_int(getattr(self, key)) or getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} must be an int >= 1")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.loss_decay_gamma is not None and not self.loss_decay_gamma > 0:
            raise ValueError(f"loss_decay_gamma={self.loss_decay_gamma!r} must be > 0, or null for uniform weights")

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size

    @property
    def num_aux(self) -> int:
        return len(self.target_layer_ids)


    def to_export(self, aux_layer_ids: list[int], torch_dtype: str = "float32", draft_type: str = "dflash") -> dict:
        """config.json as docs/guides/families.md and vLLM's DFlash loader read it (``aux_layer_ids``
        are engine ids; the on-disk ``target_layer_ids`` are those minus one); ``draft_type``: the
        family that wrote it (DFlash, JetSpec or Domino)."""
        cfg = self
        dflash = {"block_size": cfg.block_size, "mask_token_id": cfg.mask_token_id,
                  "target_layer_ids": [i - 1 for i in aux_layer_ids]}
        if cfg.causal:
            dflash["causal"] = True
        dflash.update({k: v for k, v in cfg.extra.items() if k in EXPORTED_EXTRA})
        return {
            "architectures": [ARCH], "model_type": "qwen3", "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "num_hidden_layers": cfg.num_hidden_layers, "num_target_layers": cfg.num_target_layers,
            "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "rope_scaling": cfg.rope_scaling, "max_position_embeddings": cfg.max_position_embeddings,
            "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * cfg.num_hidden_layers, "use_sliding_window": False,
            "max_window_layers": cfg.num_hidden_layers,
            # vLLM reads is_causal before dflash_config.causal: it must say the same
            "is_causal": bool(cfg.causal), "block_size": cfg.block_size, "dflash_config": dflash,
            "torch_dtype": torch_dtype,
            "draftsmith": {"draft_type": draft_type, "num_anchors": cfg.num_anchors,
                           "loss_decay_gamma": cfg.loss_decay_gamma,
                           **{k: v for k, v in cfg.extra.items() if k not in EXPORTED_EXTRA}},
        }



def layer_rule(draft: Any) -> tuple[str, Optional[int]]:
    """DFlash's default: one target layer per draft layer, evenly spaced (docs/guides/families.md)."""
    return "dflash", draft.num_draft_layers


def config_kwargs(info: Any, draft: Any) -> dict:
    """DFlashConfig fields from the target (``info``) and the run's ``draft`` section (all but the layer ids)."""
    return dict(
        hidden_size=info.hidden_size, num_attention_heads=info.num_attention_heads,
        num_key_value_heads=info.num_key_value_heads, head_dim=info.head_dim,
        intermediate_size=draft.mlp_width(info), vocab_size=info.vocab_size, num_target_layers=info.num_layers,
        num_hidden_layers=draft.num_draft_layers, block_size=draft.block_size, mask_token_id=draft.mask_token_id,
        num_anchors=draft.num_anchors, loss_decay_gamma=draft.loss_decay_gamma, rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta, rope_scaling=draft_rope(info.rope_scaling, info.max_position_embeddings),
        max_position_embeddings=info.max_position_embeddings,
        target_logit_multiplier=float(getattr(info, "logit_multiplier", 1.0)),
        target_logit_softcap=getattr(info, "logit_softcap", None),
    )


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> DFlashConfig:
    """The draft for a target (``info``: TargetInfo) and the run's ``draft`` section; ``layer_ids``
    are the engine ids it reads (the trainer's), placeholders 1..n when only the count is known."""
    ids = [i - 1 for i in (layer_ids or range(1, num_layer_ids + 1))]
    return DFlashConfig(**config_kwargs(info, draft), target_layer_ids=ids)


def config_from_export(config: dict, cls: type = DFlashConfig, **extra: Any) -> DFlashConfig:
    """Rebuild from an exported config.json (inverse of :meth:`DFlashDraft.export_config`)."""
    d = config.get("dflash_config") or {}
    own = config.get("draftsmith") or {}
    rope_theta, rope_scaling = rope_of_config(config)  # either transformers style, as vLLM reads it
    return cls(hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
               num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
               head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
               intermediate_size=config["intermediate_size"], vocab_size=config["vocab_size"],
               num_target_layers=config.get("num_target_layers", max(d.get("target_layer_ids") or [0]) + 1),
               target_layer_ids=list(d.get("target_layer_ids") or []), mask_token_id=d.get("mask_token_id"),
               num_hidden_layers=config["num_hidden_layers"],
               block_size=d.get("block_size", config.get("block_size", 16)), causal=bool(d.get("causal", False)),
               num_anchors=own.get("num_anchors", 64), loss_decay_gamma=own.get("loss_decay_gamma", 7.0),
               rms_norm_eps=config.get("rms_norm_eps", 1e-6),
               rope_theta=rope_theta if rope_theta is not None else 1000000.0,  # vLLM's DFlash default
               rope_scaling=rope_scaling,
               max_position_embeddings=config.get("max_position_embeddings", 2048), **extra)
