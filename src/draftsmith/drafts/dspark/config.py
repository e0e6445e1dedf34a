"""DSpark configs: the run's ``draft`` section (:class:`DSparkDraftConfig`) and the model's
(:class:`DSparkConfig`), both ways between it and the config.json vLLM's ``Qwen3DSparkModel`` reads.
Torch-free.

What vLLM 0.32 reads (``model_executor/models/qwen3_dspark.py``, ``config/speculative.py``,
``v1/worker/gpu/spec_decode/dspark/speculator.py``, ``eagle3_utils.get_eagle3_aux_layers_from_config``):
the DFlash Qwen3 backbone keys, top-level ``target_layer_ids`` (0-based decoder-layer OUTPUTS: engine id
i + 1), ``mask_token_id``, ``block_size`` (K defaults to it: every slot drafts), ``markov_rank``,
``enable_confidence_head`` and ``confidence_head_with_markov`` (both default False there),
``draft_vocab_size`` (None: vocab_size) and ``sample_from_anchor``. The last decides the layout: True
(vLLM's native default) runs K slots [anchor, MASK x K-1], slot i predicting position p + i + 1; False
(speculators' default) runs DFlash's K + 1 fill-in slots with the anchor as a bonus token. A draft trained
one way and served the other drafts one slot off, which vLLM does not detect (acceptance near 0), so it is
always written, and doctor requires it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..family import DraftConfig, positive
from ..rope import draft_rope, rope_of_config

__all__ = ["ARCH", "DSparkDraftConfig", "DSparkConfig", "layer_rule", "config_from_target", "config_from_export"]

ARCH = "Qwen3DSparkModel"
HEAD_TYPE = "vanilla"  # the Markov head vLLM's Qwen3 DSpark serves: a bias from the previous token alone


@dataclass
class DSparkDraftConfig(DraftConfig):
    """``draft`` section of ``type: dspark``: a parallel block draft (the DFlash backbone) whose K slots all
    draft, plus a low-rank Markov head (the previous token's bias on each slot's logits, applied left to
    right) and a confidence head (each slot's acceptance probability)."""

    type: str = "dspark"
    mask_token_id: Optional[int] = None  # required: a reserved/unused target token id (the block's MASK slots)
    num_draft_layers: int = 3  # draft decoder layers (and default target layers read)
    block_size: int = 7  # K: slots per block, each drafting one token (the DSpark paper's K = 7)
    num_anchors: int = 64  # blocks sampled per conversation per step (on assistant tokens)
    loss_decay_gamma: Optional[float] = 4.0  # slot k (0-based) weighs exp(-k/gamma); null = uniform
    markov_rank: int = 256  # r of the Markov head: W1 (V x r) embeds the previous token, W2 (r -> V) its bias
    confidence_head: bool = True  # train the per-slot acceptance head (vLLM's enable_confidence_head)
    confidence_with_markov: bool = True  # the confidence head also reads the previous token's Markov embedding
    # the paper's loss, each slot weighted by the decay:
    ce_weight: float = 0.1  # weight of CE against the data token
    tv_weight: float = 0.9  # weight of the total-variation distance to the target's distribution
    confidence_weight: float = 1.0  # weight of the confidence head's BCE against 1 - TV (the acceptance probability)

    def problems(self) -> list[str]:
        p = super().problems()
        if self.mask_token_id is None:
            p.append("'draft.mask_token_id' is required for draft.type dspark: set a reserved or unused token id of "
                     "the target (e.g. 16 <empty_output> for SmolLM2, 128002 for Llama-3)")
        if self.block_size < 1:
            p.append(f"'draft.block_size' = {self.block_size}: expected an integer >= 1 (K, the tokens one block "
                     "drafts); the DSpark paper uses 7")
        for key in ("ce_weight", "tv_weight", "confidence_weight"):
            if getattr(self, key) < 0:
                p.append(f"'draft.{key}' = {getattr(self, key)}: expected a weight >= 0")
        if self.ce_weight == 0 and self.tv_weight == 0:
            p.append("'draft.ce_weight' and 'draft.tv_weight' are both 0: the draft would learn nothing; the paper "
                     "uses 0.1 and 0.9")
        if self.confidence_with_markov and not self.confidence_head:
            p.append("'draft.confidence_with_markov' is true but 'draft.confidence_head' is false: set "
                     "confidence_with_markov: false too, or train the head")
        return p + positive(self, "num_anchors", "num_draft_layers", "markov_rank")


@dataclass
class DSparkConfig:
    """Shape and training knobs of a DSpark draft. ``target_layer_ids`` in vLLM's on-disk convention:
    id j = output of target decoder layer j (engine id j + 1). ``block_size`` = K = slots per block."""

    hidden_size: int  # = the target's: the draft reads its embeddings and lm_head
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_target_layers: int
    target_layer_ids: list[int]
    mask_token_id: Optional[int]
    markov_rank: int = 256
    confidence_head: bool = True
    confidence_with_markov: bool = True
    num_hidden_layers: int = 1
    block_size: int = 7
    num_anchors: int = 64
    loss_decay_gamma: Optional[float] = 4.0
    ce_weight: float = 0.1
    tv_weight: float = 0.9
    confidence_weight: float = 1.0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[dict] = None
    max_position_embeddings: int = 2048
    causal: bool = False  # the block attends bidirectionally, as vLLM's DSpark backbone does
    extra: dict = field(default_factory=dict)
    # the target's logit transforms (TargetInfo: Granite's 1/logits_scaling, Gemma's softcap), which the target's
    # distribution that JetSpec and DSpark distil goes through; training only (the served draft's logits are plain)
    target_logit_multiplier: float = 1.0
    target_logit_softcap: Optional[float] = None

    def __post_init__(self):
        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.block_size) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size!r} must be an int >= 1 (K, the slots of one block)")
        m, v = self.mask_token_id, self.vocab_size
        if not is_int(m) or not 0 <= m < v:
            raise ValueError(f"mask_token_id={m!r} must be an int in 0..{v - 1} (the target vocab); set it to a "
                             "reserved or unused token id, e.g. 16 for SmolLM2")
        ids, n = list(self.target_layer_ids), self.num_target_layers
        if not ids or any(not is_int(i) or not 0 <= i < n for i in ids) or len(set(ids)) != len(ids):
            raise ValueError(f"target_layer_ids={ids!r} must be distinct decoder-layer outputs in 0..{n - 1} "
                             f"(engine ids 1..{n}: target.aux_layer_ids); fix target.aux_layer_ids")
        for key in ("num_hidden_layers", "num_anchors", "markov_rank"):
            if not is_int(getattr(self, key)) or getattr(self, key) < 1:
                raise ValueError(f"{key}={getattr(self, key)!r} must be an int >= 1")
        if self.confidence_with_markov and not self.confidence_head:
            raise ValueError("confidence_with_markov needs confidence_head (the head it feeds)")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads}")
        if self.loss_decay_gamma is not None and not self.loss_decay_gamma > 0:
            raise ValueError(f"loss_decay_gamma={self.loss_decay_gamma!r} must be > 0, or null for uniform weights")

    @property
    def num_aux(self) -> int:
        return len(self.target_layer_ids)

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size  # the draft reads the target's embeddings: its width is the target's

    def to_export(self, aux_layer_ids: list[int], torch_dtype: str = "float32", draft_type: str = "dspark") -> dict:
        """config.json as vLLM's ``Qwen3DSparkModel`` reads it (module docstring); ``aux_layer_ids`` are the
        engine ids (on disk: minus one). The layout flags are written explicitly, never left to a default
        that differs between vLLM and speculators."""
        c = self
        return {
            "architectures": [ARCH], "model_type": "qwen3", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
            "num_hidden_layers": c.num_hidden_layers, "num_target_layers": c.num_target_layers,
            "vocab_size": c.vocab_size, "draft_vocab_size": c.vocab_size, "target_hidden_size": c.hidden_size,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
            "max_position_embeddings": c.max_position_embeddings, "hidden_act": "silu", "attention_bias": False,
            "tie_word_embeddings": False, "layer_types": ["full_attention"] * c.num_hidden_layers,
            "use_sliding_window": False, "max_window_layers": c.num_hidden_layers, "is_causal": False,
            "block_size": c.block_size, "mask_token_id": c.mask_token_id, "target_layer_ids": [int(i) - 1 for i in aux_layer_ids],
            "use_aux_hidden_state": True, "markov_rank": c.markov_rank, "markov_head_type": HEAD_TYPE,
            "enable_confidence_head": bool(c.confidence_head),
            "confidence_head_with_markov": bool(c.confidence_with_markov),
            "sample_from_anchor": True, "dspark_bonus_anchor": False, "torch_dtype": torch_dtype,
            "draftsmith": {"draft_type": draft_type, "num_anchors": c.num_anchors, "loss_decay_gamma": c.loss_decay_gamma,
                           "ce_weight": c.ce_weight, "tv_weight": c.tv_weight, "confidence_weight": c.confidence_weight},
        }


def layer_rule(draft: Any) -> tuple[str, Optional[int]]:
    """One target layer per draft layer, evenly spaced (the block drafts' rule)."""
    return "dflash", draft.num_draft_layers


def config_from_target(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int,
                       layer_ids: Optional[list[int]] = None) -> DSparkConfig:
    """The draft for a target (``info``: TargetInfo) and the run's ``draft`` section; ``layer_ids``: the
    engine ids it reads (placeholders 1..n when only the count is known). The draft predicts the full
    target vocab (``draft_vocab_size`` is not used: the lm_head is the target's)."""
    ids = [i - 1 for i in (layer_ids or range(1, num_layer_ids + 1))]
    return DSparkConfig(
        hidden_size=info.hidden_size, num_attention_heads=info.num_attention_heads,
        num_key_value_heads=info.num_key_value_heads, head_dim=info.head_dim, intermediate_size=draft.mlp_width(info),
        vocab_size=info.vocab_size, num_target_layers=info.num_layers, target_layer_ids=ids,
        mask_token_id=draft.mask_token_id, markov_rank=draft.markov_rank, confidence_head=draft.confidence_head,
        confidence_with_markov=draft.confidence_with_markov, num_hidden_layers=draft.num_draft_layers,
        block_size=draft.block_size, num_anchors=draft.num_anchors, loss_decay_gamma=draft.loss_decay_gamma,
        ce_weight=draft.ce_weight, tv_weight=draft.tv_weight, confidence_weight=draft.confidence_weight,
        rms_norm_eps=info.rms_norm_eps, rope_theta=info.rope_theta,
        rope_scaling=draft_rope(info.rope_scaling, info.max_position_embeddings),
        max_position_embeddings=info.max_position_embeddings,
        target_logit_multiplier=float(getattr(info, "logit_multiplier", 1.0)),
        target_logit_softcap=getattr(info, "logit_softcap", None))


def config_from_export(config: dict) -> DSparkConfig:
    """Rebuild from an exported config.json (inverse of :meth:`DSparkConfig.to_export`)."""
    own = config.get("draftsmith") or {}
    if config.get("markov_rank") is None:
        raise ValueError("config.json has no markov_rank; this is not a DSpark draft")
    rope_theta, rope_scaling = rope_of_config(config)
    return DSparkConfig(
        hidden_size=config["hidden_size"], num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        intermediate_size=config["intermediate_size"], vocab_size=config["vocab_size"],
        num_target_layers=config.get("num_target_layers", max(config.get("target_layer_ids") or [0]) + 1),
        target_layer_ids=list(config.get("target_layer_ids") or []), mask_token_id=config.get("mask_token_id"),
        markov_rank=config["markov_rank"], confidence_head=bool(config.get("enable_confidence_head", False)),
        confidence_with_markov=bool(config.get("confidence_head_with_markov", False)),
        num_hidden_layers=config["num_hidden_layers"], block_size=config.get("block_size", 7),
        num_anchors=own.get("num_anchors", 64), loss_decay_gamma=own.get("loss_decay_gamma", 4.0),
        ce_weight=own.get("ce_weight", 0.1), tv_weight=own.get("tv_weight", 0.9),
        confidence_weight=own.get("confidence_weight", 1.0), rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=rope_theta if rope_theta is not None else 1000000.0, rope_scaling=rope_scaling,
        max_position_embeddings=config.get("max_position_embeddings", 2048))
