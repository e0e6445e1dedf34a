"""Draft-training throughput on SmolLM2 next to the target forward alone, on the same batches.

    python bench/train_throughput.py [--batches 12] [--dtype bfloat16] [--ttt-steps 4]

Prints tokens/s for (a) the target forward that produces features, (b) a full co-located training
step (features + supervision + draft TTT forward/backward + AdamW) and (c) the draft part alone on
precomputed features, measured in one run on the same batches, and the ratio (b)/(a): how close
training runs to the speed of the target forward that bounds it.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--ttt-steps", type=int, default=4)
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast for the draft (train.bf16)")
    args = ap.parse_args()

    from draftsmith.config import build_config
    from draftsmith.data.dataset import collate
    from draftsmith.drafts.eagle_supervision import eagle3_supervision
    from draftsmith.train.loop import Trainer

    out = tempfile.mkdtemp(prefix="draftsmith-bench-")
    cfg = build_config({
        "target": {"path": "smollm2", "dtype": args.dtype},
        "data": {"sources": ["builtin:sharegpt"], "max_rows": 400, "max_length": args.max_length,
                 "eval_size": 0, "draft_vocab_size": args.draft_vocab_size},
        "draft": {"ttt_steps": args.ttt_steps},
        "train": {"batch_size": args.batch_size, "bf16": args.bf16},
        "output": {"dir": out, "tensorboard": False},
    }, "bench")
    tr = Trainer(cfg, progress=False)
    # Full-length batches first, so every measurement sees the same, realistic shapes.
    rows = sorted(tr.train_set, key=lambda e: -len(e.input_ids))[: args.batches * args.batch_size]
    batches = [rows[i : i + args.batch_size] for i in range(0, len(rows), args.batch_size)]
    n_tok = sum(int(collate(b, tr.pad_id).attention_mask.sum()) for b in batches)
    tr.train_window([batches[0]])  # warm-up (allocator, autograd graph)

    t = time.perf_counter()
    feats = []
    for b in batches:
        batch = collate(b, tr.pad_id)
        f = tr.engine.features(batch, tr.aux_ids, logits=True)
        feats.append(eagle3_supervision(batch, f, tr.vocab.draft_ids if tr.pruned else None))
    target_s = time.perf_counter() - t

    t = time.perf_counter()
    for b in batches:
        tr.train_window([b])
    train_s = time.perf_counter() - t

    t = time.perf_counter()
    for sup in feats:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.train.bf16):
            o = tr.draft(sup.aux_hidden.float(), sup.input_ids, sup.target_probs, sup.position_mask)
        o.loss.backward()
        tr.optimizer.step()
        tr.optimizer.zero_grad(set_to_none=True)
    draft_s = time.perf_counter() - t

    print(f"SmolLM2-135M target ({args.dtype}), {len(batches)} batches x {args.batch_size}, {n_tok} tokens, "
          f"TTT {args.ttt_steps} steps, draft vocab {tr.vocab.draft_ids.numel()}, draft bf16 autocast {args.bf16}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'what':<34}{'seconds':>10}{'tokens/s':>12}")
    print(f"{'target forward only (features)':<34}{target_s:>10.2f}{n_tok / target_s:>12.0f}")
    print(f"{'draft training, co-located':<34}{train_s:>10.2f}{n_tok / train_s:>12.0f}")
    print(f"{'draft step alone (cached feats)':<34}{draft_s:>10.2f}{n_tok / draft_s:>12.0f}")
    print(f"ratio training / target-forward tokens/s: {target_s / train_s:.3f}")
    tr.engine.close()


if __name__ == "__main__":
    main()
