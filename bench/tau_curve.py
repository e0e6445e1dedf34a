"""Real tau against training tokens: one recipe trained from the demo cache, every saved checkpoint scored exactly.

    .venv/bin/python bench/tau_curve.py [--variant best] [--steps 500] [--save-every 100] [-k 3]
        [--prompts 8] [--prompt-sets mt_bench mixed] [--max-new-tokens 96] [--reuse] [--out runs/bench/tau_curve.json]

The recipe is one of bench/recipe_sweep.py's variants (the demo recipe with a few keys overridden; the
same data, cache, rows and order), trained for --steps optimizer steps with a checkpoint every
--save-every. Each checkpoint's `meta.json` records `tokens_seen` (real tokens trained on since step 0),
the x of the curve; its y is the real tau of exact `draftsmith eval` (HF target, fp32, greedy: equal to
vLLM's tau) on the same spread prompts the sweep uses. Writes JSON and a PNG (matplotlib) next to it, and
prints a table. --reuse scores the checkpoints of an earlier run instead of training again.

Where the curve still climbs at the right edge, more tokens (epochs over the same rows, or more rows)
buy more tau; where it is flat the data is used up (see the sweep's held-out figures for overfitting).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from recipe_sweep import VARIANTS, spread_prompts, variant_config  # noqa: E402  (bench/ is the script's dir)


def checkpoints(run_dir: Path) -> list[Path]:
    """Saved checkpoints of a run, in step order (``epoch_E_step_S`` with a meta.json)."""
    found = [p for p in (run_dir / "checkpoints").glob("epoch_*_step_*") if (p / "meta.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.rsplit("_", 1)[1]))


def plot(points: list[dict], keys: list[str], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key in keys:
        ax.plot([p["tokens_seen"] / 1e3 for p in points], [p["real"][key] for p in points], marker="o", label=key)
    ax.set_xlabel("training tokens (thousands)")
    ax.set_ylabel("real tau (exact eval == vLLM)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="best", help=f"a bench/recipe_sweep.py variant ({', '.join(VARIANTS)}) or demo (the demo's recipe)")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("-k", type=int, nargs="+", default=[3])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-sets", nargs="+", default=["mt_bench", "mixed"])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--reuse", action="store_true", help="score the checkpoints already under the run dir")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "tau_curve.json"))
    args = ap.parse_args()
    if args.variant not in VARIANTS and args.variant != "demo":
        ap.error(f"--variant {args.variant!r}: unknown; known: {', '.join(VARIANTS)}")
    if args.save_every <= 0 or args.save_every > args.steps:
        ap.error(f"--save-every {args.save_every}: expected 1..--steps ({args.steps})")

    from draftsmith.config import build_config
    from draftsmith.eval.offline import run_eval
    from draftsmith.train.demo import prepare_data
    from draftsmith.train.loop import train

    out = Path(args.out)
    run_dir = out.parent / "tau_curve" / args.variant
    prompt_files = {s: spread_prompts(s, args.prompts, out.parent / "tau_curve" / f"prompts_{s}.jsonl")
                    for s in args.prompt_sets}
    train_s = None
    if not (args.reuse and checkpoints(run_dir)):
        regen_dir, cache_dir, _ = prepare_data(progress=False)
        raw = variant_config(args.variant, run_dir, regen_dir, cache_dir)
        raw["train"].update(epochs=50, max_steps=args.steps, save_every=args.save_every)
        raw["output"]["tensorboard"] = False
        t0 = time.perf_counter()
        train(build_config(raw, f"tau_curve:{args.variant}"), progress=False)
        train_s = time.perf_counter() - t0
    keys = [f"{s}@K{k}" for s in args.prompt_sets for k in args.k]
    points = []
    for ckpt in checkpoints(run_dir):
        meta = json.loads((ckpt / "meta.json").read_text())
        if "tokens_seen" not in meta:
            print(f"tau_curve: {ckpt}/meta.json has no tokens_seen (written before it was kept); rerun without --reuse",
                  file=sys.stderr)
            return 2
        row = {"checkpoint": str(ckpt), "step": meta["step"], "tokens_seen": meta["tokens_seen"], "real": {},
               "acceptance_per_position": {}}
        for s in args.prompt_sets:
            for k in args.k:
                o = run_eval(target="smollm2", draft=str(ckpt), prompts=str(prompt_files[s]), k=k,
                             max_new_tokens=args.max_new_tokens, dtype="float32", plain=False, progress=False)["overall"]
                row["real"][f"{s}@K{k}"] = o["tau"]
                row["acceptance_per_position"][f"{s}@K{k}"] = o.get("acceptance_per_position")
        points.append(row)
        print(f"step {row['step']:>5}  tokens {row['tokens_seen']:>9,}  "
              + "  ".join(f"{key} tau {row['real'][key]:.3f}" for key in keys), flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"args": vars(args), "variant": VARIANTS.get(args.variant, "demo"), "train_s": train_s,
                                   "points": points}, indent=2) + "\n")
    if not points:
        print(f"tau_curve: no checkpoints under {run_dir}/checkpoints", file=sys.stderr)
        return 2
    png = out.with_suffix(".png")
    plot(points, keys, f"recipe '{args.variant}' from the demo cache: real tau vs training tokens", png)
    print("\n| step | training tokens | " + " | ".join(f"{key} tau" for key in keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for p in points:
        print(f"| {p['step']} | {p['tokens_seen']:,} | " + " | ".join(f"{p['real'][key]:.3f}" for key in keys) + " |")
    print(f"\nJSON: {out}\nplot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
