"""GPU smoke run for `make gpu-check`: train a tiny EAGLE-3 draft on CUDA for ~30 s with the hf engine
and print training tokens/s and the peak CUDA memory torch allocated.

    python bench/gpu_check.py [--seconds 30] [--layers 8] [--hidden 512] [--batch-size 8] [--device cuda]

The target is a random Llama built in code (tests/fixtures.py: no download), co-located on the same
GPU as the draft (target.engine: hf, train.device), so the number covers the whole step: target
forward, supervision, the draft's TTT forward/backward and AdamW, with bf16 autocast as on any GPU
run. Without CUDA it prints one line saying it skipped and exits 0 (the CPU machines `make gpu-check`
also runs on). Exit 1 when the run trains no step or its loss is not finite.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="training budget (train.max_time_s)")
    ap.add_argument("--layers", type=int, default=8, help="decoder layers of the random target")
    ap.add_argument("--hidden", type=int, default=512, help="hidden size of the random target (2 heads)")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cuda or cuda:N")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu-check: skipped, no CUDA GPU here (torch {torch.__version__}); run it on a GPU machine")
        return 0

    from draftsmith.config import build_config
    from draftsmith.distributed import resolve_device
    from draftsmith.train.loop import train
    from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

    device = resolve_device(args.device, key="--device")
    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="draftsmith-gpu-check-"))
    target = make_tiny_llama(root / "target", make_tokenizer("chatml"), num_layers=args.layers, hidden=args.hidden)
    # long, distinct answers: batches near max_length, so tokens/s reflects full-size steps
    words = ["cat", "dog", "sea", "fox", "spider", "France", "Paris", "mouse", "tide", "gull"]
    rows = [{"messages": [{"role": "user", "content": f"Tell me about the {words[i % 10]}, {i}."},
                          {"role": "assistant", "content": " ".join(words[(i * j) % 10] for j in range(120))}]}
            for i in range(2000)]
    data = write_jsonl(root / "chats.jsonl", rows)
    L = args.layers
    aux = sorted({1, L // 2, L - 1})  # three distinct ids for any L >= 4 (the engine default repeats on small L)
    cfg = build_config({
        "target": {"path": str(target), "engine": "hf", "dtype": "bfloat16", "aux_layer_ids": aux},
        "data": {"sources": [str(data)], "max_length": args.max_length, "eval_size": 8, "draft_vocab_size": 256},
        "draft": {"ttt_steps": 3},
        "train": {"epochs": 100, "max_time_s": args.seconds, "batch_size": args.batch_size, "lr": 3e-4,
                  "warmup_steps": 10, "device": str(device), "log_every": 1000, "eval_max_batches": 1},
        "output": {"dir": str(root / "run"), "tensorboard": False},
    }, "gpu-check")
    # the allocator's stats exist once CUDA is initialised on the device; before that the reset raises
    # "Invalid device argument" (seen on an H200, torch 2.11)
    torch.empty(0, device=device)
    torch.cuda.reset_peak_memory_stats(device)
    result = train(cfg, progress=False)
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    losses = [loss for _, loss in result.history]
    ok = result.step > 0 and all(torch.isfinite(torch.tensor(x)) for x in losses)
    print(f"gpu-check: EAGLE-3 draft on {device} ({torch.cuda.get_device_name(device)}), hf target "
          f"{L} layers x {args.hidden} bf16 co-located: {result.step} steps, {result.tokens} tokens in "
          f"{result.wall_s:.1f} s = {result.tokens_per_s:.0f} tok/s; torch.cuda.max_memory_allocated "
          f"{peak:.0f} MiB; final loss {losses[-1] if losses else float('nan'):.3f}; "
          f"{time.perf_counter() - t0:.0f} s in all" + ("" if ok else "  FAILED: no step or a non-finite loss"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
