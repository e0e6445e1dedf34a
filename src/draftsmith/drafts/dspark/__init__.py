"""The DSpark family: a block draft whose K slots all draft in one parallel forward (the DFlash
backbone, drafts/block.py), corrected left to right by a low-rank Markov head (the previous token's bias)
and scored by a confidence head; what vLLM serves as method ``dspark`` (``Qwen3DSparkModel``).

Layout: ``config.py`` (the ``draft`` section and the model config both ways; torch-free), ``model.py``
(the heads and the paper's loss over the shared backbone), ``summary.py`` (metrics), ``export.py``
(loading an export, checkpoint meta), ``serving.py`` (what vLLM, speculators and doctor read of its
config.json; torch-free), ``api.py`` (the contract; the proposer is drafts/block_infer.py). This file:
its description, torch-free.
"""

from __future__ import annotations

from ..family import Family, KRule
from . import serving
from .config import ARCH, DSparkDraftConfig

__all__ = ["FAMILY", "is_dspark_config"]

ARCHS = (ARCH, "DSparkDraftModel", "Qwen3OmniDSparkModel")


def is_dspark_config(config: dict) -> bool:
    """A DSpark config.json: its architecture says so, or a Markov head without DFlash's section."""
    archs = config.get("architectures") or []
    return any(a in ARCHS for a in archs) or (config.get("markov_rank") is not None
                                               and not isinstance(config.get("dflash_config"), dict))


FAMILY = Family(
    supervision_module="draftsmith.drafts.block_supervision",
    name="dspark", display="DSpark (block)", api="draftsmith.drafts.dspark.api", config=DSparkDraftConfig,
    supervision="dflash_kd", recognises=is_dspark_config, layout="block", first_layer_id=1,
    layer_ids_key="target_layer_ids", layer_id_offset=-1, borrows_lm_head=True, needs_mask_token=True, packing=True,
    serve_k=KRule(("block_size",), offset=0, why="K = block_size (every slot drafts)", required=True, bound=True),
    serve_k_missing="DSpark draft has no block_size >= 1 in config.json; pass --num-speculative-tokens",
    required_keys=("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "num_hidden_layers",
                   "block_size", "mask_token_id", "target_layer_ids", "markov_rank"),
    vllm_method="dspark", vllm_arch=ARCH, speculators_type="dspark", vllm_writer=serving.vllm_config,
    speculators_writer=serving.speculators_fields, vllm_notes=serving.vllm_notes, doctor_checks=serving.doctor_problems,
    sglang_refusal=("SGLang 0.5 has no DSpark speculative algorithm (its DFLASH worker has no Markov head and drafts "
                    "the fill-in layout): serve it with `draftsmith serve vllm` on a GPU build of vLLM (method dspark)"),
)
