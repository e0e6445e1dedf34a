"""Draft training on 1 rank next to N ranks (torchrun, DDP or FSDP2) on the same global batch.

    python bench/train_scaling.py [--nproc 2] [--parallel ddp] [--global-batch 4] [--steps 12]
                                  [--target smollm2] [--engine hf] [--draft eagle3]

Both runs train the same conversations in the same global order for the same optimizer steps: one
process with train.batch_size = global batch (and every core), then ``torchrun --nproc-per-node N``
with batch_size = global batch / N (cores split between ranks). Each is a real ``draftsmith train``
subprocess; the figures are the trainer's own "trained S steps (T tokens, X tok/s, W s)" line (loop
time, after setup), printed side by side with their ratio. Writes runs/bench/train_scaling.json.

On a machine with one core per rank or fewer (this 2-core CI box) the ratio mostly shows what the
ranks cost (a second target copy per rank, gradient all-reduce over gloo, smaller matmuls), not a
speed-up; on GPUs each rank brings its own device.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

LINE = re.compile(r"trained (\d+) steps \((\d+) tokens, (\d+) tok/s, (\d+) s\)")


def run(cmd: list[str], env: dict) -> dict:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"bench: {' '.join(cmd[:8])} ... failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    m = LINE.search(proc.stdout)
    if m is None:
        sys.exit(f"bench: no 'trained ...' line in the output:\n{proc.stdout[-2000:]}")
    steps, tokens, tok_s, wall = map(int, m.groups())
    return {"steps": steps, "tokens": tokens, "tokens_per_s": tok_s, "loop_s": wall,
            "process_s": round(time.perf_counter() - start, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--parallel", choices=["ddp", "fsdp2"], default="ddp")
    ap.add_argument("--global-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--engine", default="hf")
    ap.add_argument("--draft", default="eagle3", choices=["eagle3", "peagle"])
    ap.add_argument("--max-rows", type=int, default=96)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default="runs/bench/train_scaling.json")
    args = ap.parse_args()
    if args.global_batch % args.nproc:
        sys.exit(f"--global-batch {args.global_batch} must be a multiple of --nproc {args.nproc}")

    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="draftsmith-scaling-"))
    draft = {"type": args.draft, "ttt_steps": 3}
    if args.draft == "peagle":
        draft.update(mask_token_id=16, num_depths=4, num_draft_layers=2)  # 16: SmolLM2's <empty_output>
    base = {
        "target": {"path": args.target, "engine": args.engine, "dtype": "bfloat16"},
        "data": {"sources": ["builtin:sharegpt"], "max_rows": args.max_rows, "max_length": args.max_length,
                 "eval_size": 0, "draft_vocab_size": 8192},
        "draft": draft,
        "train": {"max_steps": args.steps, "lr": 1e-4, "device": args.device, "parallel": args.parallel},
        "output": {"tensorboard": False},
    }
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results = {}
    for ranks in (1, args.nproc):
        cfg = json.loads(json.dumps(base))
        cfg["train"].update(batch_size=args.global_batch // ranks, num_threads=max(1, cores // ranks))
        cfg["output"]["dir"] = str(work / f"ranks{ranks}")
        path = work / f"ranks{ranks}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        if ranks == 1:
            cmd = [sys.executable, "-m", "draftsmith", "train", str(path), "--no-progress"]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                   "-m", "draftsmith", "train", str(path), "--no-progress"]
        print(f"bench: {ranks} rank(s) x batch {args.global_batch // ranks}, {max(1, cores // ranks)} thread(s) each ...",
              flush=True)
        results[ranks] = run(cmd, {**env, "OMP_NUM_THREADS": str(max(1, cores // ranks))})
    one, many = results[1], results[args.nproc]
    ratio = many["tokens_per_s"] / max(one["tokens_per_s"], 1)
    print(f"{'ranks':>5} {'steps':>5} {'tokens':>7} {'tok/s':>7} {'loop s':>6}")
    for ranks, r in results.items():
        print(f"{ranks:>5} {r['steps']:>5} {r['tokens']:>7} {r['tokens_per_s']:>7} {r['loop_s']:>6}")
    print(f"{args.nproc} ranks / 1 rank tokens/s: {ratio:.2f}x ({args.parallel}, global batch {args.global_batch}, "
          f"{cores} cores{'; at most one core per rank: mostly overhead, not speed-up' if cores <= args.nproc else ''})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "cores": cores, "results": results, "ratio": ratio}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
