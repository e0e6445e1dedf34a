"""Draft training from an offline feature cache next to co-located training, on the same batches.

    python bench/cache_throughput.py [--batches 40] [--batch-size 2] [--max-rows 200] [--num-threads 2]

On SmolLM2 (bf16 target, bf16-autocast EAGLE-3 draft, TTT 3, draft vocab 8192, max_length 512):
builds the cache for the rows first (target forward once; prints its tokens/s and bytes per token),
then trains the SAME micro-batches (a) co-located with the hf engine and (b) from the cache engine,
each from the same fresh draft, and prints tokens/s of both and their ratio. Writes
runs/bench/cache_throughput.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch


def timed_training(cfg, batches_of_rows, pad_id) -> tuple[float, int]:
    """(seconds, real tokens) of one optimizer step per micro-batch, after one warm-up step."""
    from draftsmith.train.loop import Trainer

    tr = Trainer(cfg, progress=False)
    try:
        tr.train_window([batches_of_rows[0]])  # warm-up (allocator, autograd graph, weight reads)
        start, tokens = time.perf_counter(), 0
        sups = tr.supervise(batches_of_rows)  # the engine's own path: features + contract per batch
        for rows in batches_of_rows:
            tokens += tr.train_window([rows], sups)["tokens"]
        sups.close()
        return time.perf_counter() - start, tokens
    finally:
        tr.engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-rows", type=int, default=200)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--num-threads", type=int, default=None)
    ap.add_argument("--out", default="runs/bench/cache_throughput.json")
    args = ap.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    from draftsmith.cache.build import build_cache
    from draftsmith.config import build_config
    from draftsmith.train.loop import Trainer

    work = Path(tempfile.mkdtemp(prefix="draftsmith-cache-bench-"))

    def cfg_for(engine: str, out: str):
        return build_config({
            "target": {"path": "smollm2", "dtype": "bfloat16", "engine": engine,
                       **({"cache_dir": str(work / "cache")} if engine == "cache" else {})},
            "data": {"sources": ["builtin:sharegpt"], "max_rows": args.max_rows, "max_length": args.max_length,
                     "eval_size": 0, "draft_vocab_size": 8192, "vocab_cache_dir": str(work / "vocab")},
            "draft": {"type": "eagle3", "ttt_steps": args.ttt_steps},
            "train": {"batch_size": args.batch_size, "bf16": True, "lr": 2e-3, "num_threads": args.num_threads},
            "output": {"dir": str(work / out), "tensorboard": False},
        }, "bench")

    manifest = build_cache(cfg_for("hf", "build"), work / "cache", batch_size=args.batch_size, progress=False)
    build_tok_s = manifest["build"]["tokens"] / manifest["build"]["seconds"]
    probe = Trainer(cfg_for("cache", "probe"), progress=False)  # the trainer's rows and pad id, from the cache
    rows, pad_id = probe.train_set[: args.batches * args.batch_size], probe.pad_id
    probe.engine.close()
    batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]

    hf_s, hf_tok = timed_training(cfg_for("hf", "hf"), batches, pad_id)
    cache_s, cache_tok = timed_training(cfg_for("cache", "cached"), batches, pad_id)
    assert hf_tok == cache_tok
    res = {
        "target": "SmolLM2-135M-Instruct bf16", "draft": f"eagle3 bf16 autocast, TTT {args.ttt_steps}, vocab 8192",
        "batches": len(batches), "batch_size": args.batch_size, "tokens": hf_tok, "threads": torch.get_num_threads(),
        "cache_rows": manifest["rows"], "cache_tokens": manifest["tokens"], "cache_build_tok_s": round(build_tok_s, 1),
        "bytes_per_token": manifest["bytes_per_token"],
        "cache_mib": round(manifest["tokens"] * manifest["bytes_per_token"] / 2**20, 1),
        "colocated_s": round(hf_s, 2), "colocated_tok_s": round(hf_tok / hf_s, 1),
        "from_cache_s": round(cache_s, 2), "from_cache_tok_s": round(cache_tok / cache_s, 1),
        "ratio_cache_over_colocated": round(hf_s / cache_s, 3),
    }
    print(f"SmolLM2-135M target (bf16), {len(batches)} batches x {args.batch_size}, {hf_tok} tokens, "
          f"EAGLE-3 TTT {args.ttt_steps}, draft vocab 8192, bf16 autocast, {res['threads']} threads")
    print(f"cache build: {manifest['rows']} rows, {manifest['tokens']} tokens, {build_tok_s:.0f} tok/s, "
          f"{manifest['bytes_per_token']} bytes/token ({res['cache_mib']} MiB)")
    print(f"{'training':<28}{'seconds':>10}{'tokens/s':>12}")
    print(f"{'co-located (hf engine)':<28}{hf_s:>10.2f}{hf_tok / hf_s:>12.0f}")
    print(f"{'from the cache':<28}{cache_s:>10.2f}{cache_tok / cache_s:>12.0f}")
    print(f"ratio cache / co-located tokens/s: {res['ratio_cache_over_colocated']:.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
