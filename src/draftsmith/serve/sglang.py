"""``draftsmith serve sglang``: an SGLang-ready EAGLE-3 copy, its token map, and the launch argv.

SGLang facts used (read from sgl-project/sglang, ``python/sglang/srt/...``; SGLang has no CPU build
on this machine, so these paths are tested on argv and files only):

- ``models/llama_eagle3.py`` ``LlamaForCausalLMEagle3``: the draft layer is ``model.midlayer``; its
  ``load_weights`` tries each name as-is and then with ``model.`` prepended, and silently skips names
  it does not know, so ``layers.0.*`` must be renamed ``midlayer.*`` or the layer stays random. ``fc``
  is ``Linear(3 * target_hidden, hidden)`` (exactly 3 aux states), there is no ``fc_norm``, and the
  hidden fed to the next step is the pre-norm one (no EAGLE-3.1 ``norm_output``). ``d2t`` is read
  as ``hot_token_id = d2t + arange(Vd)``; ``t2d`` is skipped.
- ``model_executor/model_runner.py`` reads ``eagle_config.eagle_aux_hidden_state_layer_ids`` from the
  draft config and the target's ``set_eagle3_layers_to_capture`` captures ``[i + 1 for i in ids]``,
  each taken as the residual stream *before* that layer runs: SGLang id j = the output of layer j =
  vLLM id j + 1. The copy therefore writes the ids shifted down by one.
- ``speculative/spec_utils.py`` ``load_token_map``: ``torch.load(path, weights_only=True)`` turned
  into an int64 tensor of TARGET ids, one per draft id in draft order (``head[hot_token_id]``). Recent
  ``eagle_worker.py`` ignores ``--speculative-token-map`` for EAGLE3 (it uses ``d2t`` from the
  weights, with a warning); older releases and EAGLE-2 drafts use the file. We write and pass it.
- CLI (``server_args.py``, docs "Speculative Decoding"): ``--speculative-algorithm EAGLE3
  --speculative-draft-model-path --speculative-num-steps --speculative-eagle-topk
  --speculative-num-draft-tokens --speculative-token-map``; server module ``sglang.launch_server``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional, Sequence

from draftsmith.drafts.eagle_config import is_qwen3_shaped
from draftsmith.weights import read_tensors

from .export import Prepared, prepare_cached
from .resolve import (Draft, ServeError, check_family_weights, family_of, reject_unservable, servable_config)

SGLANG_EAGLE3_ARCH = "LlamaForCausalLMEagle3"
TOKEN_MAP = "speculative_token_map.pt"
SGLANG_INSTALL_HINT = "pip install 'sglang[all]' on a CUDA machine (SGLang has no CPU wheel)"
SGLANG_AUX = 3  # SGLang's fc is Linear(3 * target_hidden, hidden)


def sglang_key(name: str) -> Optional[str]:
    """draftsmith name -> SGLang name: drop ``t2d``, strip ``model.``, ``layers.0.`` -> ``midlayer.``."""
    if name == "t2d":
        return None
    if name.startswith("model."):
        name = name[len("model."):]
    if name.startswith("layers.0."):
        name = "midlayer." + name[len("layers.0."):]
    return name


def reject_for_sglang(config: dict, source: Optional[str] = None) -> None:
    """A family SGLang does not serve (``Family.sglang_refusal``): one-line ServeError pointing to vLLM."""
    reject_unservable(config, source)  # served by no engine: pointing it to vLLM would be wrong
    fam = family_of(config)
    if fam.sglang_algorithm:  # served by the SGLang releases that have its algorithm (sglang_algorithm.py)
        from .sglang_algorithm import reject_missing_algorithm

        reject_missing_algorithm(config)
        return
    if fam.sglang_refusal:
        raise ServeError(fam.sglang_refusal)


def sglang_config(config: dict) -> dict:
    """The config SGLang's ``LlamaForCausalLMEagle3`` needs (a new dict); for a block draft SGLang serves
    (its family's ``sglang_algorithm``), the z-lab DFlash config vLLM loads too."""
    reject_for_sglang(config)
    if family_of(config).sglang_algorithm:
        from .vllm import vllm_config

        return vllm_config(config)
    flags = [k for k in ("fc_norm", "norm_output", "norm_before_residual", "norm_before_fc")
             if config.get(k) or (config.get("eagle_config") or {}).get(k)]
    if flags:
        raise ServeError(f"{' / '.join(flags)}: these EAGLE-3.1 / speculators norms are not implemented by SGLang's "
                         "LlamaForCausalLMEagle3; serve the draft with `draftsmith serve vllm`")
    if is_qwen3_shaped(config):
        raise ServeError(f"architectures {config.get('architectures')}, model_type {config.get('model_type')!r}: a "
                         "Qwen3-shaped draft (draft.qk_norm: q/k norms per head), which SGLang's LlamaForCausalLMEagle3 "
                         "does not have; serve the draft with `draftsmith serve vllm`")
    if int(config.get("num_hidden_layers", 1)) != 1:
        raise ServeError(f"num_hidden_layers={config.get('num_hidden_layers')}: SGLang's EAGLE-3 loader reads one "
                         "draft layer (midlayer); serve multi-layer drafts with `draftsmith serve vllm`")
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids and len(ids) != SGLANG_AUX:
        raise ServeError(f"eagle_config.eagle_aux_hidden_state_layer_ids={ids}: SGLang needs exactly {SGLANG_AUX} aux "
                         "layer ids (its fc reads 3 target states); retrain with 3 aux layers or serve with vLLM")
    out = json.loads(json.dumps(config))
    out["architectures"] = [SGLANG_EAGLE3_ARCH]
    eagle = out.setdefault("eagle_config", {})
    eagle.setdefault("use_aux_hidden_state", True)
    if ids:
        eagle["eagle_aux_hidden_state_layer_ids"] = [int(i) - 1 for i in ids]  # vLLM id -> SGLang id
        out.setdefault("draftsmith", {})["vllm_aux_layer_ids"] = [int(i) for i in ids]
    # No ids (NeMo AutoModel's checkpoints): SGLang captures its default [2, L//2, L-3], the residual
    # stream before layer i = vLLM id i, which is what vLLM and AutoModel default to as well.
    return out


def draft_ids(draft: Draft):
    """Target id of each draft id, (Vd,) int64, from ``d2t`` in the weights or the checkpoint's
    ``vocab.safetensors``; None when the draft predicts the full target vocab."""
    import torch

    assert draft.dir is not None
    d2t = None
    files = [f for f in draft.weight_files if not f.name.endswith(".json")]
    if draft.index is not None:
        shard = draft.index["weight_map"].get("d2t") or draft.index["weight_map"].get("model.d2t")
        files = [draft.dir / shard] if shard else []
    for f in files:
        for t in read_tensors(f, ("d2t", "model.d2t")).values():
            d2t = t
    if d2t is not None:
        return torch.arange(d2t.numel(), dtype=torch.int64) + d2t.to(torch.int64)  # target = draft + d2t[draft]
    root = draft.checkpoint_root()
    if root is not None and (root / "vocab.safetensors").is_file():
        vocab = read_tensors(root / "vocab.safetensors")
        if "draft_ids" in vocab and vocab["draft_ids"].numel() < int(draft.config.get("vocab_size", 0) or 1 << 62):
            return vocab["draft_ids"].to(torch.int64)
    if draft.config.get("draft_vocab_size") and draft.config.get("draft_vocab_size") != draft.config.get("vocab_size"):
        raise ServeError(f"{draft.dir}: draft_vocab_size {draft.config['draft_vocab_size']} < vocab_size "
                         f"{draft.config.get('vocab_size')} but no d2t tensor or vocab.safetensors holds the vocab "
                         "map; re-export the checkpoint with its d2t")
    return None


def write_token_map(ids, path: Path) -> None:
    """torch-save the (Vd,) int64 tensor of target ids in draft order (SGLang's token map format)."""
    import torch

    torch.save(ids.to(torch.int64).contiguous().clone(), path)


def sglang_copy_args(draft: Draft) -> dict:
    """Keyword arguments for :func:`export.build_copy` producing an SGLang-ready copy + token map."""
    config = sglang_config(servable_config(draft)[0])  # the layer count the weights hold
    ids = draft_ids(draft)

    def extra(tmp: Path) -> None:
        if ids is not None:
            write_token_map(ids, tmp / TOKEN_MAP)

    return {"key_map": sglang_key, "config": config, "extra": extra}


def prepare_sglang(draft: Draft, *, dry_run: bool = False, export_dir: Optional[Path] = None) -> tuple[Prepared, Optional[Path]]:
    """Build (or reuse) ``<draft dir>/sglang_export/``; return it and the token map path (None if unpruned)."""
    if draft.is_hub:
        reject_for_sglang(draft.config, draft.source)
        return Prepared(draft.source, "hub", f"hub id {draft.source}: passed to SGLang untouched"), None
    check_family_weights(draft)  # e.g. P-EAGLE weights under a config that lost parallel_drafting
    args = sglang_copy_args(draft)
    pruned = int(draft.config.get("draft_vocab_size") or 0) not in (0, int(draft.config.get("vocab_size") or 0))
    prepared = prepare_cached(draft, kind="sglang", options={}, out=export_dir, dry_run=dry_run, **args)
    prepared.fixups = servable_config(draft)[1]
    return prepared, (Path(prepared.path) / TOKEN_MAP if pruned else None)


def sglang_argv(target: str, draft_path: str, *, num_steps: int = 3, topk: int = 1,
                num_draft_tokens: Optional[int] = None, token_map: Optional[Path] = None,
                host: str = "127.0.0.1", port: int = 30000, dtype: Optional[str] = None,
                context_length: Optional[int] = None, extra: Sequence[str] = (),
                python: str = sys.executable) -> list[str]:
    """The exact ``python -m sglang.launch_server`` command line for an EAGLE-3 draft.

    With ``topk`` 1 the draft is a chain and SGLang verifies ``num_steps + 1`` tokens (the default)."""
    if num_steps < 1 or topk < 1:
        raise ServeError(f"--num-steps {num_steps} / --eagle-topk {topk}: both must be >= 1")
    n_draft = num_draft_tokens if num_draft_tokens is not None else (num_steps + 1 if topk == 1 else num_steps * topk + 1)
    argv = [python, "-m", "sglang.launch_server", "--model-path", str(target),
            "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", str(draft_path),
            "--speculative-num-steps", str(num_steps), "--speculative-eagle-topk", str(topk),
            "--speculative-num-draft-tokens", str(n_draft)]
    if token_map is not None:
        argv += ["--speculative-token-map", str(token_map)]
    argv += ["--host", host, "--port", str(port)]
    if dtype:
        argv += ["--dtype", dtype]
    if context_length:
        argv += ["--context-length", str(context_length)]
    return argv + list(extra)


__all__ = ["sglang_key", "sglang_config", "sglang_copy_args", "prepare_sglang", "sglang_argv", "draft_ids",
           "write_token_map", "TOKEN_MAP", "SGLANG_INSTALL_HINT", "SGLANG_EAGLE3_ARCH"]
