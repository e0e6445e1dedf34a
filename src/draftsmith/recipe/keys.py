"""The AutoModel recipe keys draftsmith knows: which draftsmith key each maps to, which change nothing
here, why the others have no equivalent, and AutoModel's defaults where draftsmith's differ. Facts from
NVIDIA-NeMo/Automodel's examples/speculative/*.yaml and recipes/llm/train_{eagle3,dflash,jetspec,domino}.py
(recipe_cfg.get(key, default))."""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["RECIPE_FAMILIES", "EAGLE_RECIPE", "PARALLEL_FAMILY", "BACKENDS", "HOOK_NOTE", "DIRECT", "NO_EFFECT",
           "EAGLE_ONLY", "ENGINE_KEYS", "BLOCK_ONLY", "HINTS", "DEFAULTS", "OPTIMIZER", "PARALLEL_SIZES", "scope_ok"]

# AutoModel recipe class -> draftsmith draft.type (TrainEagle3Recipe with parallel_drafting: true -> P-EAGLE)
RECIPE_FAMILIES = {"TrainEagle3Recipe": "eagle3", "TrainDFlashRecipe": "dflash", "TrainJetSpecRecipe": "jetspec",
                   "TrainDominoRecipe": "domino"}
EAGLE_RECIPE, PARALLEL_FAMILY = "TrainEagle3Recipe", "peagle"
BACKENDS = {"colocated": "hf", "vllm": "vllm", "sglang": "sglang", "remote": "remote"}  # target_model_backend -> target.engine
HOOK_NOTE = ("AutoModel {ids} are HF-hook ids (the output of decoder layer j); draftsmith's are engine ids, j + 1: "
             "converted")


# Which recipes read a key: "eagle" = TrainEagle3Recipe, "block" = the DFlash family, or one family.
def scope_ok(scope: Optional[str], recipe: str, family: str) -> bool:
    if scope is None:
        return True
    if scope == "eagle":
        return recipe == EAGLE_RECIPE
    if scope == "block":
        return recipe != EAGLE_RECIPE
    return family == scope or RECIPE_FAMILIES.get(recipe) == scope


def nonneg_every(v: Any) -> Any:
    return 0 if v is None or (isinstance(v, int) and v <= 0) else v


# recipe_args key -> (draftsmith key, scope, value conversion); the value is checked by build_config
DIRECT: dict[str, tuple[str, Optional[str], Optional[Callable[[Any], Any]]]] = {
    "target_model_name_or_path": ("target.path", None, None),
    "output_dir": ("output.dir", None, None),
    "seq_length": ("data.max_length", None, None),
    "micro_batch_size": ("train.batch_size", None, None),
    "grad_accumulation_steps": ("train.grad_accum", None, None),
    "num_epochs": ("train.epochs", None, None),
    "max_grad_norm": ("train.max_grad_norm", None, None),
    "log_every_steps": ("train.log_every", None, None),
    "shuffle_seed": ("train.seed", None, None),
    "ckpt_every_steps": ("train.save_every", None, nonneg_every),
    "mask_token_id": ("draft.mask_token_id", None, None),
    "ttt_steps": ("draft.ttt_steps", "eagle", None),
    "draft_vocab_size": ("data.draft_vocab_size", "eagle", None),
    "freeze_embeddings": ("draft.freeze_embeddings", "eagle", None),
    "fc_norm": ("draft.fc_norm", "eagle", None),
    "norm_output": ("draft.norm_output", "eagle", None),
    "draft_gradient_checkpointing": ("train.activation_checkpointing", "eagle", None),
    "target_prefetch_depth": ("target.prefetch_depth", "eagle", None),
    "remote_timeout": ("target.remote_timeout_s", "eagle", None),
    "remote_max_retries": ("target.remote_retries", "eagle", None),
    "num_depths": ("draft.num_depths", PARALLEL_FAMILY, None),
    "num_draft_layers": ("draft.num_draft_layers", PARALLEL_FAMILY, None),
    "down_sample_ratio": ("draft.down_sample_ratio", PARALLEL_FAMILY, None),
    "down_sample_ratio_min": ("draft.down_sample_ratio_min", PARALLEL_FAMILY, None),
    "draft_num_hidden_layers": ("draft.num_draft_layers", "block", None),
    "block_size": ("draft.block_size", "block", None),
    "num_anchors": ("draft.num_anchors", "block", None),
    "loss_decay_gamma": ("draft.loss_decay_gamma", "block", None),
    "kd_temperature": ("draft.kd_temperature", "jetspec", None),
    "emb_dim": ("draft.emb_dim", "domino", None),
    "gru_hidden_dim": ("draft.gru_hidden_dim", "domino", None),
    "pure_draft_prefix_len": ("draft.pure_draft_prefix_len", "domino", None),
    "shift_label": ("draft.shift_label", "domino", None),
    "lambda_base_start": ("draft.lambda_start", "domino", None),
    "lambda_base_decay_ratio": ("draft.lambda_decay_ratio", "domino", None),
}

# recipe_args keys that change nothing here, with the values that mean so (None: any value) and why
NO_EFFECT: dict[str, tuple[Optional[tuple], str]] = {
    "num_workers": (None, "data-loader worker processes; the data and its order are the same"),
    "attention_backend": (None, "draftsmith's block attention is its own (same mask, same math)"),
    "draft_attn_implementation": (None, "draftsmith picks the draft's attention kernel (same math)"),
    "target_attn_implementation": (None, "draftsmith's engine picks the target's attention kernel (same math)"),
    "target_force_hf": (None, "the hf engine runs the target with transformers itself"),
    "selected_token_ids_path": (None, "draftsmith caches the draft vocab itself (data.vocab_cache_dir)"),
    "kd_chunk_size": (None, "a memory knob; draftsmith's KD loss is computed in row chunks anyway"),
    "trust_remote_code": ((False, None), "no remote code is run"),
    "train_shuffle": ((True, None), "draftsmith shuffles the training rows (seeded by train.seed)"),
    "mask_reasoning_content": ((False, None), "no reasoning spans are masked"),
    "sequence_partitions": ((1, None), "one partition: the flat P-EAGLE forward"),
    "cp_zigzag": ((False, None), "no context parallelism"),
    "loss_type": ((None, "dflash"), "the DFlash block loss"),
}
EAGLE_ONLY = {"sequence_partitions", "cp_zigzag", "draft_attn_implementation"}
ENGINE_KEYS = {"target_model_backend", "vllm_args", "sglang_args", "remote_urls", "remote_url"}  # EAGLE-3 recipe only
BLOCK_ONLY = {"attention_backend", "loss_type"}

HINTS = {  # why an AutoModel key has no equivalent, and what to do instead
    "cached_target_path": "AutoModel's precompute_eagle3 cache is not draftsmith's; build one with "
                          "`draftsmith cache CONFIG --out DIR` and set target.engine: cache, target.cache_dir: DIR",
    "draft_weights_path": "warm starts are not built; train from scratch or resume a draftsmith checkpoint (--resume)",
    "lk_loss_type": "LK losses are not built in draftsmith",
    "packed_sequence_size": "draftsmith packs into rows of data.max_length: set it to 0 or to seq_length",
    "trust_remote_code": "targets with remote code are not loaded; use a transformers-native architecture",
    "mask_reasoning_content": "reasoning spans are not masked from the loss in draftsmith",
    "train_shuffle": "the training rows are always shuffled (seeded by train.seed)",
    "sequence_partitions": "P-EAGLE sequence partitions are not built; train.activation_checkpointing saves memory instead",
    "loss_type": "only the DFlash block loss (loss_type: dflash) is built",
    "draft_sliding_window": "sliding-window DFlash drafts are not built",
    "draft_num_attention_heads": "the DFlash draft takes the target's attention shape",
    "draft_num_key_value_heads": "the DFlash draft takes the target's attention shape",
    "draft_head_dim": "the DFlash draft takes the target's attention shape",
    "peft": "LoRA drafts are not built; remove the section",
    "fp8": "FP8 draft compute is not built; remove the section",
    "compile": "torch.compile of the draft is not built; remove the section",
}

# AutoModel's defaults where draftsmith's differ: written when the recipe does not give the key
DEFAULTS: list[tuple[str, str, Optional[str], Any]] = [  # (AutoModel key, draftsmith key, scope, value)
    ("recipe_args.max_grad_norm", "train.max_grad_norm", None, 1.0),
    ("recipe_args.shuffle_seed", "train.seed", None, 42),
    ("optimizer.warmup_ratio", "train.warmup_fraction", None, 0.05),
    ("optimizer.min_lr_ratio", "train.min_lr_ratio", None, 0.1),
    ("recipe_args.draft_vocab_size", "data.draft_vocab_size", "eagle", None),  # None: the full target vocab
    ("recipe_args.num_draft_layers", "draft.num_draft_layers", PARALLEL_FAMILY, 1),
    ("recipe_args.draft_num_hidden_layers", "draft.num_draft_layers", "block", 5),
    ("recipe_args.num_anchors", "draft.num_anchors", "block", 512),
    ("recipe_args.gru_hidden_dim", "draft.gru_hidden_dim", "domino", 1024),
    ("recipe_args.pure_draft_prefix_len", "draft.pure_draft_prefix_len", "domino", 1),
]
OPTIMIZER = {"lr": "train.lr", "betas": "train.betas", "weight_decay": "train.weight_decay",
             "warmup_ratio": "train.warmup_fraction", "min_lr_ratio": "train.min_lr_ratio"}
PARALLEL_SIZES = ("tp_size", "cp_size", "pp_size", "ep_size", "dp_size", "dp_replicate_size")
