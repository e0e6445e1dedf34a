"""The free baselines a draft must beat: vLLM's draft-free speculation methods, ``ngram`` (prompt lookup)
and ``suffix`` (suffix decoding, arctic-inference's suffix trees over the prompt and past responses).

Both propose from text already seen, so they cost no model forward and need no training; they win where
answers copy their prompts (summaries, code edits, long-context QA). Every place that measures a draft
beside ngram (bench/serve_speedup.py, ``advise``, the demo's real check) takes suffix beside it when
:func:`suffix_support` says it runs here.

Suffix decoding's global tree caches past *responses* (``suffix_decoding_max_cached_requests``, 10,000 by
default): a measurement that decodes the same prompt twice (advise's warm-up and rounds) would let it
replay the earlier answer, a speed no real workload sees unless it repeats requests. ``repeats=True``
turns the global tree off for such measurements (prompt trees and the request's own output remain).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

__all__ = ["KINDS", "NGRAM_LOOKUP", "spec", "suffix_support"]

KINDS = ("ngram", "suffix")  # measurement kinds that need no draft (a draft's label may not take these)
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 4}  # vLLM's documented ngram example


def spec(kind: str, k: int, *, repeats: bool = False) -> dict:
    """vLLM's ``--speculative-config`` for baseline ``kind`` at K = ``k`` (suffix decoding's K is the cap
    of its dynamic speculation length). ``repeats``: the measurement decodes prompts more than once."""
    if kind == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, **NGRAM_LOOKUP}
    if kind == "suffix":
        out = {"method": "suffix", "num_speculative_tokens": k}
        if repeats:  # no replay of an earlier answer to the same prompt (module docstring)
            out["suffix_decoding_max_cached_requests"] = 0
        return out
    raise ValueError(f"baseline kind {kind!r}: expected one of {list(KINDS)}")


def suffix_support() -> tuple[bool, str]:
    """(usable, why): vLLM's ``suffix`` method needs a vLLM that knows it and arctic-inference installed."""
    found = importlib.util.find_spec("vllm")
    if found is None or not found.submodule_search_locations:
        return False, "vLLM is not installed"
    src = Path(list(found.submodule_search_locations)[0]) / "config" / "speculative.py"
    if not (src.is_file() and '"suffix"' in src.read_text(errors="replace")):
        return False, "the installed vLLM has no suffix decoding (method 'suffix' is not in its speculative config)"
    if importlib.util.find_spec("arctic_inference") is None:
        return False, ("the installed vLLM knows method 'suffix' but it needs arctic-inference, which is not "
                       "installed (`make suffix` builds it from source for this CPU, about 10 minutes)")
    return True, "vLLM suffix decoding (arctic-inference) is installed"
