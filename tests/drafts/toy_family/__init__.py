"""A toy draft family defined entirely in tests/, to prove that a family needs no edit in src/.

It is an EAGLE-3 chain draft under another name with one knob of its own (``toy_weight``, the TTT
step weight), learning from the existing ``eagle3`` supervision kind. Its config.json carries its own
architecture (``ToyEagleDraftModel``), which is how the registry recognises an export of it; vLLM
serves it as EAGLE-3 (``vllm_arch``). Register it with one line:

    register(toy_family.FAMILY)

This file is its description (torch-free); ``api.py`` is its code.
"""

from __future__ import annotations

from dataclasses import dataclass

from draftsmith.drafts.eagle3 import serving as eagle3_serving
from draftsmith.drafts.eagle3.config import EagleDraftConfig
from draftsmith.drafts.family import Family

ARCH = "ToyEagleDraftModel"


@dataclass
class ToyDraftConfig(EagleDraftConfig):
    """``draft`` section of ``type: toy``: EAGLE-3's layer knobs plus its own step weight."""

    type: str = "toy"
    toy_weight: float = 0.5  # TTT step k weighs toy_weight**k

    def problems(self) -> list[str]:
        bad = [] if 0 < self.toy_weight <= 1 else [f"'draft.toy_weight' = {self.toy_weight}: expected (0, 1]"]
        return super().problems() + bad


FAMILY = Family(
    name="toy", display="Toy (chain)", api="toy_family.api", config=ToyDraftConfig, supervision="eagle3",
    recognises=lambda config: (config.get("architectures") or [None])[0] == ARCH,
    vllm_method="eagle3", vllm_arch="LlamaForCausalLMEagle3", speculators_type="eagle3",
    # served as an EAGLE-3 chain: it composes EAGLE-3's engine writers
    vllm_writer=eagle3_serving.vllm_config, speculators_writer=eagle3_serving.speculators_fields,
    serve_k_missing="Toy drafts need --num-speculative-tokens K",
    required_keys=("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size", "draft_vocab_size"),
)
