"""The DFlash family: block drafts that draft ``block_size - 1`` tokens in one forward over the target's
context states, with the target's embeddings and lm_head borrowed. JetSpec (``jetspec.py``: causal
blocks, distilled) and Domino (``domino.py``: + a GRU correction head) are DFlash drafts with one
change each, so they live here and reuse everything else.

Layout: ``config.py`` (the ``draft`` sections and the model config both ways; torch-free),
``model.py`` (anchors, blocks, visibility, loss, metrics, the draft), ``infer.py`` (the block
proposer), ``export.py`` (loading an export, checkpoint meta), ``api.py`` (DFlash's contract;
``jetspec.py`` and ``domino.py`` are their families' own). This file: the three families'
descriptions, torch-free.
"""

from __future__ import annotations

from ..family import Family, KRule
from .config import DFlashDraftConfig, DominoDraftConfig, JetSpecDraftConfig

__all__ = ["FAMILY", "JETSPEC", "DOMINO", "DFLASH_ARCHS", "is_block_config"]

DFLASH_ARCHS = ("Qwen3DFlashDraftModel", "DFlashDraftModel")


def is_block_config(config: dict) -> bool:
    """A DFlash-family config.json: its architecture or a ``dflash_config`` section says so."""
    archs = config.get("architectures") or []
    return any(a in DFLASH_ARCHS for a in archs) or isinstance(config.get("dflash_config"), dict)


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
    serve_k=KRule(("block_size", "dflash_config.block_size"), offset=-1, why="K = block_size - 1", required=False),
    serve_k_missing="DFlash draft has no block_size >= 2 in config.json (top level or dflash_config); "
                    "pass --num-speculative-tokens",
    required_keys=("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers"),
)
_SERVED = dict(vllm_method="dflash", vllm_arch="DFlashDraftModel", speculators_type="dflash")


def _sglang(name: str) -> str:
    return (f"{name} drafts are not supported by this SGLang path (EAGLE3 only); serve them with "
            "`draftsmith serve vllm` (method dflash)")


FAMILY = Family(
    name="dflash", display="DFlash (block)", api="draftsmith.drafts.dflash.api", config=DFlashDraftConfig,
    supervision="dflash", recognises=lambda c: is_block_config(c) and not _domino(c) and not _causal(c),
    sglang_refusal=_sglang("dflash"), **_BLOCK, **_SERVED,
)
JETSPEC = Family(
    name="jetspec", display="JetSpec (block)", api="draftsmith.drafts.dflash.jetspec", config=JetSpecDraftConfig,
    supervision="dflash_kd", recognises=lambda c: is_block_config(c) and not _domino(c) and _causal(c),
    sglang_refusal=_sglang("jetspec"), **_BLOCK, **_SERVED,
)
DOMINO = Family(
    name="domino", display="Domino (block)", api="draftsmith.drafts.dflash.domino", config=DominoDraftConfig,
    supervision="dflash", recognises=lambda c: is_block_config(c) and _domino(c), **_BLOCK,
    serve_refusal=("draft is a Domino draft (dflash_config.projector_type: domino): its GRU correction head has no "
                   "implementation in vLLM or SGLang, so no engine can serve it; measure it with `draftsmith eval "
                   "--draft {source}` (exact offline decoding), or train draft.type: dflash or jetspec (the same "
                   "block draft without the GRU head) to serve it with `draftsmith serve vllm`"),
)
