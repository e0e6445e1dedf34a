"""The repeating tiny target and the `draftsmith advise` run on it, shared by
tests/integration/test_advise_vllm.py (behaviour) and bench/advise_agreement.py (predicted vs measured).

The tiny target is made to repeat itself (a token -> its successor in a cycle of 3; attention and
MLP outputs zeroed so the residual stream is the token's embedding, the lm_head rows permuted
embeddings), so ngram drafting has something to find and speculation pays."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from fixtures import make_tiny_llama, make_tokenizer

KMAX, MAX_TOKENS, PERIOD = 2, 96, 3
ROUNDS = 3  # the test's timed passes (advise's default): it checks behaviour, not how close the timings come
BENCH_ROUNDS = 12  # bench/advise_agreement.py: per-round medians over 12 rounds, as the old 15% check ran
QUESTIONS = ["Tell me a joke about cats.", "Write a haiku about the sea.", "What is the capital of France?",
             "How many legs does a spider have?"]


def make_cycle_target(path, tok):
    """A 2-layer hidden-64 Llama whose greedy next token is succ(x) = x - x % 3 + (x % 3 + 1) % 3."""
    from transformers import LlamaForCausalLM

    make_tiny_llama(path, tok, num_layers=2, hidden=64)
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the input token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        x = torch.arange(emb.shape[0])
        succ = x - x % PERIOD + (x % PERIOD + 1) % PERIOD
        keep = succ < emb.shape[0]
        model.lm_head.weight[succ[keep]] = emb[x[keep]]  # logits[succ(x)] = |e_x|^2 / rms: the largest
    model.save_pretrained(path)
    return model


def advise_setup(tmp: Path, rounds: int = ROUNDS) -> tuple:
    """Write the cycle target and the prompts under ``tmp``: (tokenizer, model, advise argv, out dir)."""
    tok = make_tokenizer("chatml")
    model = make_cycle_target(tmp / "target", tok)
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "category": "c", "turns": [q]}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    out = tmp / "advise"
    argv = ["advise", "--target", str(tmp / "target"), "--prompts", str(prompts), "--kmax", str(KMAX),
            "--max-tokens", str(MAX_TOKENS), "--max-model-len", "512", "--ready-timeout", "300", "--enforce-eager",
            "--rounds", str(rounds), "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--out", str(out)]
    return tok, model, argv, out


def measured_rows(pb: dict) -> list:
    """The rows advise measured: the recommendation, and the best speculative row when that is none."""
    return [r for r in pb["predictions"] if "measured" in r]


def per_round(walls: dict) -> list:
    """Per-round speed-ups (plain wall / speculative wall) of one paired measurement."""
    return [p / s for p, s in zip(walls["plain_full"], walls["full"])]
