"""Shared helpers of the real-vLLM serving tests (test_serve_vllm.py, test_serve_peagle.py,
test_serve_dflash.py, ...): a bounded, always-stopped OpenAI server, plain HTTP, the HF fp32 greedy
reference, the `draftsmith serve vllm` command line, and the served-in-process pattern (a draft
trained for seconds, served by the session's in-process vLLM host, compared with `draftsmith eval`)."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional, Sequence

import torch

from draftsmith.serve.process import ServerProcess

SRC = Path(__file__).resolve().parents[2] / "src"
READY_S = 300  # bounded wait for a server (CPU start ~30 s; generous for a loaded CI box)
MAX_TOKENS = 20


def http(url: str, body: dict | None = None, timeout: float = 120.0) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Server(ServerProcess):
    """A vLLM OpenAI server for these tests: started in its own group, always stopped."""

    def __init__(self, argv: list[str], port: int, log: Path, pythonpath: Sequence[Path] = ()):
        """``pythonpath``: extra directories put first on the server's PYTHONPATH (e.g. a test shim)."""
        super().__init__(argv, port, log, ready_s=READY_S, env={
            "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "PYTHONPATH": os.pathsep.join([*map(str, pythonpath), str(SRC), os.environ.get("PYTHONPATH", "")])})

    def __enter__(self):
        super().__enter__()
        self.model = json.loads(http(self.base + "/v1/models")[1])["data"][0]["id"]
        return self

    def complete(self, prompt_ids: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
        body = {"model": self.model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_token_ids": True}
        code, text = http(self.base + "/v1/completions", body)
        assert code == 200, text
        return json.loads(text)["choices"][0]["token_ids"]

    def spec_counters(self) -> dict[str, float]:
        """vllm:spec_decode_num_* summed over label sets, from the Prometheus text."""
        out: dict[str, float] = {}
        for line in http(self.base + "/metrics")[1].splitlines():
            name = line.split("{")[0].split(" ")[0]
            if name.startswith("vllm:spec_decode_num_") and name.endswith("_total") and "per_pos" not in name:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out


def hf_greedy(target: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy continuation with the HF model in fp32 (a plain argmax loop, no cache): the reference
    for "same output as without speculation" (FACTS.md: token-identical to vLLM fp32 greedy)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p])
            for _ in range(n):
                nxt = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            outs.append(ids[0, len(p):].tolist())
    return outs


def serve_cmd(target: Path, draft: Path, port: int, k: Optional[int]) -> list[str]:
    """`draftsmith serve vllm` in fp32, eager, seeded; ``k`` None leaves K to the draft's default."""
    kk = [] if k is None else ["--num-speculative-tokens", str(k)]
    return [sys.executable, "-m", "draftsmith.serve.cli", "serve", "vllm", "--target", str(target), "--draft", str(draft),
            *kk, "--port", str(port), "--dtype", "float32", "--max-model-len", "512",
            "--", "--enforce-eager", "--seed", "0"]


def prompt_ids(tok, questions: list[str]) -> list[list[int]]:
    out = []
    for q in questions:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        out.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    return out


# ---- the "trained for seconds, served, compared with the exact offline evaluator" pattern ----------
JOKES = [f"Tell me a joke about the number {i}." for i in range(12)]  # training questions
SERVED = 2  # the first two are served


def cached_greedy(target: Path, prompts: list[list[int]], n: int) -> list[list[int]]:
    """fp32 greedy continuations with the HF KV cache: training rows (``hf_greedy`` stays the reference)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for p in prompts:
            out = model(torch.tensor([p]), use_cache=True)
            ids = []
            for _ in range(n):
                ids.append(int(out.logits[0, -1].argmax()))
                out = model(torch.tensor([[ids[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            outs.append(ids)
    return outs


def self_distilled(tmp: Path, tok, target: Path, questions: Sequence[str] = JOKES, n: int = 48):
    """Chat rows of the target's own greedy continuations (a draft trained on them for seconds has
    something to accept when served on the same questions) -> (jsonl path, greedy ids per question).
    The rows come from the KV-cached loop; the served questions' first MAX_TOKENS are checked equal to
    :func:`hf_greedy` (the reference the served output is compared with), so callers may use either."""
    from draftsmith.eval.prompts import render_prompt
    from fixtures import write_jsonl

    ids = [render_prompt(tok, [{"role": "user", "content": q}]) for q in questions]
    greedy = cached_greedy(target, ids, n)
    assert hf_greedy(target, ids[:SERVED], MAX_TOKENS) == [g[:MAX_TOKENS] for g in greedy[:SERVED]]
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": tok.decode(out)}]}
            for q, out in zip(questions, greedy)]
    return write_jsonl(tmp / "chats.jsonl", rows), greedy


def served_prompts(tmp: Path, questions: Sequence[str] = JOKES[:SERVED]) -> Path:
    """The served questions as a prompt file (what `draftsmith eval --prompts FILE` reads)."""
    from fixtures import write_jsonl

    return write_jsonl(tmp / "prompts.jsonl", [{"id": f"q{i}", "category": "jokes", "turns": [q]}
                                               for i, q in enumerate(questions)])


def served_in_process(host, tok, target: Path, draft: Path, prompt_file: Path, k: int) -> tuple[dict, str]:
    """The draft as `draftsmith serve vllm` would serve it, run in the session's in-process vLLM host
    (tests/vllm_inproc.py: one vLLM import, ~2-5 s an engine), the prompts one at a time (batch 1,
    greedy, exactly MAX_TOKENS each) -> (report with token ids and vLLM's counters, the notes serve prints)."""
    from vllm_inproc import serve_in_process

    online, log, _ = serve_in_process(host, tok, target, draft, prompt_file, k, MAX_TOKENS)
    return online, log


def offline_eval(target: Path, draft: Path, prompt_file: Path, k: int) -> dict:
    """`draftsmith eval` on the same prompts, K and budget as :func:`served_in_process` (fp32, greedy)."""
    from draftsmith.eval.offline import run_eval

    return run_eval(target=str(target), draft=str(draft), prompts=str(prompt_file), k=k, temperature=0.0,
                    max_new_tokens=MAX_TOKENS, dtype="float32", plain=False, ignore_eos=True, progress=False)


def assert_lossless_and_same_tau(label: str, online: dict, offline: dict, want: list[list[int]]) -> None:
    """Served output == the target's greedy output, something accepted, offline tau == vLLM tau (1%)."""
    assert [r["token_ids"] for r in online["records"]] == want  # fp32 speculation is lossless
    a, b = offline["overall"], online["overall"]
    assert b["drafts"] > 0 and b["accepted"] > 0, f"the draft accepted nothing ({b}); the tau check would be vacuous"
    print(f"{label}: offline tau {a['tau']:.4f} ({a['drafts']} drafts, {a['accepted']} accepted); "
          f"vLLM tau {b['tau']:.4f} ({b['drafts']} drafts, {b['accepted']} accepted)")
    assert [r["token_ids"] for r in offline["records"]] == want
    assert abs(a["tau"] - b["tau"]) / b["tau"] <= 0.01, (a, b)
