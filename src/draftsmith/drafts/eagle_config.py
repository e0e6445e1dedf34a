"""The EAGLE families' shared configs (EAGLE-3, P-EAGLE): the ``draft`` knobs of the EAGLE layers and head
(:class:`EagleDraftConfig`), the model's shape (:class:`EagleConfig`), both ways between it and the
EAGLE-layout config.json (vLLM's LlamaForCausalLMEagle3), and the rules both families apply to a
config.json. Torch-free.

Each family extends both dataclasses with its own knobs (eagle3/config.py: the training-time-test
unroll; peagle/config.py: the parallel-drafting keys) and writes its config.json as :func:`eagle_export`
plus its own keys, so the keys both read sit in one place and in one order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .family import DraftConfig
from .rope import draft_rope, rope_of_config

__all__ = ["EagleDraftConfig", "EagleConfig", "REQUIRED_KEYS", "QWEN3_ARCHS", "eagle_fields", "eagle_export", "layer_rule",
           "refuse_other_family", "claimed_by_block_family"]

# vLLM 0.32's Qwen3-shaped EAGLE layer (model_executor/models/qwen3_eagle3.py; registry: both names, one class):
# Qwen3's decoder layer with layer 0's q/k/v over the fused 2H input; its attention has q_norm and k_norm.
# A config.json with model_type qwen3 or one of these architectures is that shape (speculators maps its
# transformer_layer_config model_type qwen3 to them too: transformers_utils/configs/speculators/algos.py).
QWEN3_ARCHS = ("Eagle3Qwen3ForCausalLM", "PeagleQwen3ForCausalLM")

# config.json keys doctor requires of an EAGLE-layout draft (both families: the same layer 0, fc and head)
REQUIRED_KEYS = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "rms_norm_eps",
                 "draft_vocab_size", "target_hidden_size")


@dataclass
class EagleDraftConfig(DraftConfig):
    """``draft`` knobs of the EAGLE-3 layers and head, shared by EAGLE-3 and P-EAGLE."""

    fc_norm: bool = False  # EAGLE-3.1: per-aux RMSNorm before fc
    norm_output: bool = False  # EAGLE-3.1: feed the post-norm hidden back
    norm_before_residual: bool = False  # layer-0 residual = hidden_norm(h) (speculators' default; vLLM reads it)
    norm_before_fc: bool = False  # one RMSNorm (`input_norm`) over the concatenated aux states before fc (vLLM reads it)
    freeze_lm_head: bool = False  # keep the lm_head at the target's rows (needs init_from_target); saves its weight-grad GEMM
    freeze_embeddings: Optional[bool] = None  # embeddings copied from the target; null = the family's default (eagle3 frozen, peagle trained)
    init_from_target: bool = True  # lm_head rows + final norm from the target, fc passes the deepest aux through
    # start layer 0 from this target decoder layer (negative counts from the end; null = random): its attention,
    # norms and MLP, q/k/v on both halves of the fused input; the layer whose id is the deepest aux layer reads
    # the state init_from_target's fc passes through
    init_layer_from_target: Optional[int] = None
    # Qwen3-shaped layers: an RMSNorm over each head's q and k before RoPE, as Qwen3's own attention (speculators
    # reports +3-7% acceptance length over the Llama-shaped layer); served as vLLM's Eagle3Qwen3ForCausalLM
    qk_norm: bool = False

    def problems(self) -> list[str]:
        p = super().problems()
        if self.freeze_lm_head and not self.init_from_target:
            p.append("'draft.freeze_lm_head' is true but draft.init_from_target is false: a frozen lm_head would stay "
                     "random; set init_from_target: true (it starts from the target's lm_head rows) or unfreeze it")
        return p


@dataclass
class EagleConfig:
    """Shape of an EAGLE-layout draft's layer 0, fc and head; `fc_norm`/`norm_output` are the EAGLE-3.1
    flags, `norm_before_residual`/`norm_before_fc` the two further norms speculators trains with (both
    read by vLLM 0.32's llama_eagle3.py: the layer-0 residual is hidden_norm(h); one RMSNorm `input_norm`
    over the concatenated aux states before fc_norm/fc). All four balance the raw target states that
    `init_from_target` passes straight into every step's residual."""

    hidden_size: int
    target_hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # target vocab = embedding rows
    draft_vocab_size: int
    num_aux: int = 3
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 2048
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    qk_norm: bool = False  # Qwen3-shaped attention: RMSNorm(head_dim) on q and k per head, before RoPE

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; pick a divisor for GQA"
            )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"draft_vocab_size={self.draft_vocab_size} must be in 1..vocab_size={self.vocab_size}"
            )
        if self.num_aux < 1:
            raise ValueError(f"num_aux={self.num_aux} must be >= 1: fc reads at least one target layer's state")

    @property
    def pruned(self) -> bool:
        """True when the draft vocab is a strict subset of the target vocab (d2t/t2d exist)."""
        return self.draft_vocab_size < self.vocab_size

    @staticmethod
    def export_fields(config: dict) -> dict:
        """The :class:`EagleConfig` fields an exported config.json dict holds (inverse of :func:`eagle_export`).

        Also reads plain third-party EAGLE-3 configs: missing fields take vLLM's defaults."""
        eagle = config.get("eagle_config") or {}
        layer_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        num_aux = config.get("num_aux_hidden_states") or (len(layer_ids) if layer_ids else 3)
        rope_theta, rope_scaling = rope_of_config(config)  # either transformers style, as vLLM reads it
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        return dict(
            hidden_size=hidden,
            target_hidden_size=config.get("target_hidden_size") or hidden,
            num_attention_heads=heads,
            num_key_value_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or hidden // heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            draft_vocab_size=config.get("draft_vocab_size") or config["vocab_size"],
            num_aux=num_aux,
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta if rope_theta is not None else 10000.0),
            rope_scaling=rope_scaling,
            max_position_embeddings=config.get("max_position_embeddings", 2048),
            fc_norm=bool(config.get("fc_norm", False)),
            norm_output=bool(config.get("norm_output", False)),
            # where vLLM 0.32 reads them: norm_before_residual top level, norm_before_fc in
            # eagle_config first, then top level
            norm_before_residual=bool(config.get("norm_before_residual", False)),
            norm_before_fc=bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
            qk_norm=is_qwen3_shaped(config),
        )


def is_qwen3_shaped(config: dict) -> bool:
    """Whether an EAGLE-layout config.json describes Qwen3-shaped layers (q/k norms): ``model_type`` qwen3
    or a Qwen3 EAGLE architecture (:data:`QWEN3_ARCHS`)."""
    return config.get("model_type") == "qwen3" or any(a in QWEN3_ARCHS for a in config.get("architectures") or ())


def eagle_export(cfg: EagleConfig, aux_layer_ids: list[int], torch_dtype: str, *, num_hidden_layers: int,
                 draftsmith: dict) -> dict:
    """The EAGLE-layout config.json of ``cfg`` for vLLM's LlamaForCausalLMEagle3 / NeMo AutoModel (inverse
    of :meth:`EagleConfig.export_fields`): ``num_hidden_layers`` decoder layers, ``draftsmith`` the
    family's own section. A family adds its keys after these (P-EAGLE's parallel-drafting keys), so the
    keys both write keep this order in every export."""
    if len(aux_layer_ids) != cfg.num_aux:
        raise ValueError(f"aux_layer_ids {list(aux_layer_ids)} has {len(aux_layer_ids)} ids but the draft's "
                         f"fc expects num_aux={cfg.num_aux}")
    out = {
        # the Llama shape under NeMo AutoModel's / speculators' name (serve/ stamps vLLM's), the Qwen3 shape
        # under vLLM's own (the only one it has)
        "architectures": [QWEN3_ARCHS[0]] if cfg.qk_norm else ["LlamaEagle3DraftModel"],
        "model_type": "qwen3" if cfg.qk_norm else "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": num_hidden_layers,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": dict(cfg.rope_scaling) if cfg.rope_scaling else None,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": cfg.draft_vocab_size,
        "target_hidden_size": cfg.target_hidden_size,
        "tie_word_embeddings": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [int(i) for i in aux_layer_ids],
            "use_aux_hidden_state": True,
        },
        "fc_norm": cfg.fc_norm,
        "norm_output": cfg.norm_output,
        "torch_dtype": torch_dtype,
        "draftsmith": draftsmith,
    }
    # written only when on, where vLLM 0.32 reads them (a draft without them exports as before)
    if cfg.norm_before_residual:
        out["norm_before_residual"] = True
    if cfg.norm_before_fc:
        out["eagle_config"]["norm_before_fc"] = True
    return out


def eagle_fields(info: Any, draft: Any, *, draft_vocab_size: int, num_layer_ids: int) -> dict:
    """The :class:`EagleConfig` fields both EAGLE families take from the target (``info``: TargetInfo,
    one target decoder layer's shape) and from the shared knobs of ``draft`` (an EagleDraftConfig)."""
    return dict(
        hidden_size=info.hidden_size, target_hidden_size=info.hidden_size,
        num_attention_heads=info.num_attention_heads, num_key_value_heads=info.num_key_value_heads,
        head_dim=info.head_dim, intermediate_size=draft.mlp_width(info), vocab_size=info.vocab_size,
        draft_vocab_size=draft_vocab_size, num_aux=num_layer_ids, rms_norm_eps=info.rms_norm_eps,
        rope_theta=info.rope_theta, rope_scaling=draft_rope(info.rope_scaling, info.max_position_embeddings),
        max_position_embeddings=info.max_position_embeddings, fc_norm=draft.fc_norm, norm_output=draft.norm_output,
        norm_before_residual=draft.norm_before_residual, norm_before_fc=draft.norm_before_fc, qk_norm=draft.qk_norm,
    )


def layer_rule(draft: Any) -> tuple[str, Optional[int]]:
    """vLLM's default EAGLE-3 aux layers (3 ids): the ``eagle3`` rule of eagle_supervision.py, both families'."""
    return "eagle3", None


def refuse_other_family(config: dict, expected: str) -> None:
    """A block-family config.json given to an EAGLE loader: one-line DraftError naming the family
    (its weights would otherwise fail later as missing embed_tokens / lm_head, naming nothing).
    ``expected``: the draft the loader wanted, with its article ("an EAGLE-3")."""
    from . import FAMILIES, DraftError, family_of_config

    family = family_of_config(config)
    if FAMILIES[family].layout != "eagle":
        arch = (config.get("architectures") or ["?"])[0]
        raise DraftError(f"config.json describes a {family} block draft ({arch}, dflash_config), not {expected} "
                         f"draft; load it with draftsmith.drafts.get_family({family!r}).load_exported")


def claimed_by_block_family(config: dict) -> bool:
    """Whether a registered block-layout family recognises ``config``: the registry is asked, so an EAGLE
    family's ``recognises`` stays exclusive of theirs without naming one of them (a config.json two
    families recognise is refused as ambiguous, drafts/__init__.py)."""
    from . import FAMILIES

    return any(f.layout == "block" and f.recognises(config) for f in FAMILIES.values())
