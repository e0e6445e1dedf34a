"""Shared helpers of the real-vLLM serving tests (test_serve_vllm.py, test_serve_peagle.py,
test_serve_dflash.py): a bounded, always-stopped OpenAI server, plain HTTP, the HF fp32 greedy
reference and the `draftsmith serve vllm` command line."""

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
