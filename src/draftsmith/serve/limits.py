"""What a draft was trained for, against what it is about to be served with: K and context length.

- K: a family whose ``serve_k`` is a bound (P-EAGLE ``num_depths``, DFlash ``block_size - 1``) cannot
  draft past it, so a larger K is refused (one line, exit 2); a family with a ``trained_depth``
  (EAGLE-3's TTT unroll, ``draftsmith.ttt_steps`` in config.json) can, but positions past it were
  never trained, so a larger K is served with a warning.
- Context: the checkpoint's config.yaml records ``data.max_length``, the longest row the draft saw.
  A serving context longer than that (``--max-model-len`` / ``--context-length``, or, when not given,
  the target's ``max_position_embeddings``, which vLLM and SGLang default to) is served with a warning:
  acceptance past the trained length is unknown and usually lower.

The family description is asked (:meth:`draftsmith.drafts.family.Family.k_limit`); no family is named here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from .resolve import Draft, ServeError, family_of

__all__ = ["check_k_bound", "k_warnings", "context_warnings", "target_context"]


def check_k_bound(config: dict, k: Optional[int], flag: str = "--num-speculative-tokens") -> None:
    """A K above what the draft can draft: a one-line ServeError naming the config key and the bound."""
    if k is None or not config:
        return
    fam = family_of(config)
    hard, _ = fam.k_limit(config)
    if hard is not None and k > hard:
        key, value = fam.serve_k.value(config)
        raise ServeError(f"{flag} {k}: this {fam.short} draft drafts at most {hard} tokens per step "
                         f"(config.json {key} {value}; {fam.serve_k.why}); pass {flag} {hard} or less, or omit it")


def k_warnings(config: dict, k: Optional[int]) -> list[str]:
    """A warning when K is above the depth the draft was trained to draft (served, but untrained positions)."""
    if k is None or not config:
        return []
    fam = family_of(config)
    _, soft = fam.k_limit(config)
    if soft is None or k <= soft:
        return []
    key, _ = fam.trained_depth.value(config)
    return [f"warning: K={k} is above the {soft} tokens this {fam.short} draft was trained to draft (config.json "
            f"{key}; {fam.trained_depth.why}): positions {soft + 1}..{k} were never trained and accept less; "
            f"K <= {soft} usually serves faster"]


def target_context(target: str) -> Optional[int]:
    """The target's ``max_position_embeddings`` (what vLLM and SGLang default the context to), or None."""
    path = Path(str(target)) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return None
    cfg = cfg.get("text_config", cfg)
    value = cfg.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


def context_warnings(draft: Draft, target: str, context: Optional[int], flag: str = "--max-model-len") -> list[str]:
    """A warning when the serving context exceeds the draft's training ``data.max_length`` (where its
    checkpoint records it); ``context`` None: the target's default, which the engine then uses."""
    if draft.is_hub:
        return []
    from draftsmith.layout import training_max_length

    trained = training_max_length(draft.dir)
    served = context if context is not None else target_context(target)
    if trained is None or served is None or served <= trained:
        return []
    how = f"{flag} {served}" if context is not None else f"no {flag}: the engine uses the target's {served}"
    return [f"warning: serving context {served} tokens ({how}) exceeds the {trained} the draft was trained on "
            f"(data.max_length in its checkpoint's config.yaml); acceptance past {trained} tokens is untrained and "
            f"usually lower: pass {flag} {trained} to serve only what it saw, or train on longer rows"]
