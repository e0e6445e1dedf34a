"""``draftsmith serve sglang`` for block drafts, where the installed SGLang has their algorithm (DFLASH).

SGLang facts used (sgl-project/sglang; SGLang has no CPU build here, so this path is tested on argv
and files only):

- DFLASH came with PR #22077 (merged April 2026, after v0.5.10 of 2026-04-06; v0.5.10 and older have
  none): ``python/sglang/srt/speculative/spec_info.py`` lists ``DFLASH`` among the algorithms,
  ``models/dflash.py`` is the draft (``DFlashDraftModel``: no embeddings, no lm_head, the target's;
  ``dflash_config.{target_layer_ids, mask_token_id, block_size}``, the z-lab layout vLLM loads too).
- CLI: ``--speculative-algorithm DFLASH --speculative-draft-model-path P``; the block width
  ``--speculative-dflash-block-size`` (= ``--speculative-num-draft-tokens``, the anchor included, so
  K + 1) defaults to the draft config's block size; topk is forced to 1.

Whether the installed SGLang has the algorithm is read from its source files (no import: SGLang
pulls CUDA at import); a SGLang that is not installed is not refused here (``--print-only`` needs
none; a real launch stops at the install hint).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Optional, Sequence

from .resolve import ServeError, family_of

__all__ = ["sglang_supports", "sglang_block_argv", "SGLANG_BLOCK_HINT"]

SGLANG_BLOCK_HINT = "an SGLang release after v0.5.10 (PR #22077 added --speculative-algorithm DFLASH), CUDA only"


def sglang_supports(algorithm: str) -> Optional[bool]:
    """Whether the installed SGLang lists ``algorithm`` (e.g. "DFLASH") in its speculative algorithms;
    None when SGLang is not installed (or its layout is unknown)."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0])
    info = root / "srt" / "speculative" / "spec_info.py"
    if not info.is_file():
        return None
    return algorithm in info.read_text(errors="replace")


def reject_block_for_sglang(config: dict) -> None:
    """A family SGLang serves only in some releases, with the installed SGLang lacking it: its refusal."""
    fam = family_of(config)
    if fam.sglang_algorithm and sglang_supports(fam.sglang_algorithm) is False:
        raise ServeError(fam.sglang_refusal)


def sglang_block_argv(target: str, draft_path: str, config: dict, *, k: Optional[int] = None,
                      host: str = "127.0.0.1", port: int = 30000, dtype: Optional[str] = None,
                      context_length: Optional[int] = None, extra: Sequence[str] = (),
                      python: str = sys.executable) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for a block draft (its family's
    ``sglang_algorithm``). ``k`` None: the draft's block_size - 1; at most that (the bound)."""
    from .vllm import default_k

    fam = family_of(config)
    if not fam.sglang_algorithm:
        raise ServeError(f"{fam.display} drafts have no SGLang block algorithm; serve them with `draftsmith serve vllm`")
    k = default_k(config, k)  # refuses K past block_size - 1
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(target),
            "--speculative-algorithm", fam.sglang_algorithm, "--speculative-draft-model-path", str(draft_path),
            "--speculative-dflash-block-size", str(k + 1), "--speculative-num-draft-tokens", str(k + 1),
            "--host", host, "--port", str(port)]
    if dtype:
        argv += ["--dtype", dtype]
    if context_length:
        argv += ["--context-length", str(context_length)]
    return argv + list(extra)
