"""A DSpark draft trained for a few steps on CUDA (bf16 autocast, the hf target co-located), then decoded
exactly by `draftsmith eval`: prints steps, the last loss and eval's tau/lossless line. One skip line
without CUDA. Run on a lent GPU machine: PYTHONPATH=src python bench/gpu_dspark.py"""

import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def main() -> int:
    if not torch.cuda.is_available():
        print(f"gpu_dspark: skipped, no CUDA GPU here (torch {torch.__version__})")
        return 0
    import json

    from draftsmith.config import build_config
    from draftsmith.eval.offline import run_eval
    from draftsmith.train.loop import train
    from fixtures import make_tiny_llama, make_tokenizer, write_chats

    root = Path(tempfile.mkdtemp(prefix="draftsmith-gpu-dspark-"))
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=6, hidden=256)
    cfg = build_config({
        "target": {"path": str(target), "engine": "hf", "dtype": "bfloat16", "aux_layer_ids": [2, 5]},
        "data": {"sources": [str(write_chats(root / "chats.jsonl", n=64))], "max_length": 64, "eval_size": 4},
        "draft": {"type": "dspark", "mask_token_id": 5, "block_size": 4, "num_draft_layers": 2, "num_anchors": 8,
                  "markov_rank": 32},
        "train": {"epochs": 3, "batch_size": 4, "lr": 3e-3, "warmup_steps": 2, "device": "cuda"},
        "output": {"dir": str(root / "run"), "tensorboard": False},
    }, "gpu-dspark")
    res = train(cfg, progress=False)
    prompts = root / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "p0", "category": "chat", "turns": ["Tell me about the cat."]}) + "\n")
    report = run_eval(target=None, draft=str(res.output_dir), prompts=str(prompts), max_new_tokens=24, device="cuda",
                      progress=False)
    print(f"gpu_dspark: {res.step} steps on {torch.cuda.get_device_name(0)}, loss {res.history[0][1]:.3f} -> "
          f"{res.history[-1][1]:.3f}; eval k={report['config']['k']} tau {report['overall']['tau']:.3f} "
          f"lossless {report['lossless']}")
    return 0 if report["lossless"]["mismatches"] == [] else 1


if __name__ == "__main__":
    sys.exit(main())
