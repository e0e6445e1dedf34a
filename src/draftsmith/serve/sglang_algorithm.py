"""``draftsmith serve sglang`` for families SGLang serves with an algorithm of its own that only some releases
have (``Family.sglang_algorithm``: DFlash's DFLASH), where the installed SGLang has it.

The family owns what is its own: the algorithm's name, the release that has it (``sglang_release``), the
refusal when the installed SGLang lacks it (``sglang_refusal``) and the algorithm's flags for K
(``sglang_writer``, drafts/<family>/serving.py). This module reads whether the installed SGLang lists the
algorithm and writes the common command line (``--speculative-algorithm A --speculative-draft-model-path P``).
SGLang has no CPU build here, so this path is tested on argv and files only.

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

__all__ = ["sglang_supports", "sglang_algorithm_argv"]


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


def reject_missing_algorithm(config: dict) -> None:
    """A family SGLang serves only in some releases, with the installed SGLang lacking it: its refusal."""
    fam = family_of(config)
    if fam.sglang_algorithm and sglang_supports(fam.sglang_algorithm) is False:
        raise ServeError(fam.sglang_refusal)


def sglang_algorithm_argv(target: str, draft_path: str, config: dict, *, k: Optional[int] = None,
                      host: str = "127.0.0.1", port: int = 30000, dtype: Optional[str] = None,
                      context_length: Optional[int] = None, extra: Sequence[str] = (),
                      python: str = sys.executable) -> list[str]:
    """The ``python -m sglang.launch_server`` command line for a draft its family serves with its own
    ``sglang_algorithm``, the algorithm's flags from ``sglang_writer``. ``k`` None: the family's serve K
    (a block draft's block_size - 1); at most its bound."""
    from .vllm import default_k

    fam = family_of(config)
    if not fam.sglang_algorithm:
        raise ServeError(f"{fam.display} drafts have no SGLang algorithm of their own; serve them with "
                         "`draftsmith serve vllm`")
    k = default_k(config, k)  # refuses K past the family's bound (a block draft's block_size - 1)
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(target),
            "--speculative-algorithm", fam.sglang_algorithm, "--speculative-draft-model-path", str(draft_path),
            *(fam.sglang_writer(config, k) if fam.sglang_writer else []), "--host", host, "--port", str(port)]
    if dtype:
        argv += ["--dtype", dtype]
    if context_length:
        argv += ["--context-length", str(context_length)]
    return argv + list(extra)
