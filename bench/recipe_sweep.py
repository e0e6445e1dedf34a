"""Recipe sweep from one feature cache: each variant trained the same way, scored with exact `draftsmith eval`.

    .venv/bin/python bench/recipe_sweep.py [--variants baseline norms muon best] [--steps 600] [-k 1 3]
        [--prompts 8] [--prompt-sets mt_bench mixed] [--max-new-tokens 96] [--out runs/bench/recipe_sweep.json]

The data and cache are the demo's (`draftsmith.train.demo.prepare_data`: SmolLM2's own answers to 320
ShareGPT first turns, features at max_length 2048; built once, reused), so every variant sees the same
rows in the same order (same seed). Each variant is the demo's recipe (examples/smollm2_best.yaml's
shape) with a few keys overridden, trained for the same number of optimizer steps (--steps; equal
steps, not equal seconds, so a busy machine cannot tilt the comparison; the wall time is reported), then:

- held-out metrics from the trainer (step accuracy, conditional rate per position, simulated tau,
  draft-vocab coverage of the held-out text), and
- real tau and per-position acceptance from `draftsmith eval` (exact verification with the HF target in
  fp32, greedy; equal to vLLM's tau, tests/integration) on the first --prompts prompts of each
  --prompt-sets at each K. tau is a property of draft + target + prompts, not of the machine's speed,
  so these figures hold on a loaded machine; tokens/s are left to bench/serve_speedup.py.

Variants (--variants; `--list` prints them), each over the plain recipe (every knob off): baseline (the
plain recipe, the demo's until this sweep made "best" the demo's), each knob alone (norms: the
four EAGLE-3.1/speculators norms; freeze: frozen lm_head; muon: torch.optim.Muon), best (all of them),
vocab16k / vocab32k (draft vocab), ttt5, equal_weights (step_weight 1.0). Writes JSON and prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from draftsmith.train.demo import RECIPE_NORMS as NORMS  # noqa: E402  (the four norms, all on: one definition)

# Every variant starts from the plain recipe (the demo's shape with every knob off), whatever the demo
# itself uses now (since this sweep it is "best"), so the rows of one table stay comparable across runs.
PLAIN = {"draft": {**{k: False for k in NORMS}, "freeze_lm_head": False}, "train": {"optimizer": "adamw"}}
VARIANTS: dict[str, dict] = {
    "baseline": {},
    "norms": {"draft": NORMS},
    "freeze": {"draft": {"freeze_lm_head": True}},
    "muon": {"train": {"optimizer": "muon"}},
    "best": {"draft": {**NORMS, "freeze_lm_head": True}, "train": {"optimizer": "muon"}},
    "vocab16k": {"data": {"draft_vocab_size": 16384}},
    "vocab32k": {"data": {"draft_vocab_size": 32768}},
    "ttt5": {"draft": {"ttt_steps": 5}},
    "equal_weights": {"draft": {"step_weight": 1.0}},
}


def spread_prompts(prompt_set: str, n: int, out: Path) -> Path:
    """The first ``n`` prompts of ``prompt_set`` taken round-robin over its categories (MT-Bench lists
    10 writing prompts first), written as a prompt file ``draftsmith eval`` reads, every user turn kept
    (a reader asks for the first only unless it reads turn after turn: ``--multi-turn``)."""
    from draftsmith.eval.prompts import load_prompts

    by_cat: dict[str, list] = {}
    for p in load_prompts(prompt_set, multi_turn=True):
        by_cat.setdefault(p.category, []).append(p)
    chosen, i = [], 0
    while len(chosen) < n and any(i < len(v) for v in by_cat.values()):
        chosen += [v[i] for v in by_cat.values() if i < len(v)][: n - len(chosen)]
        i += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": p.id, "category": p.category, "turns": list(p.turns)} if not p.context else
            {"id": p.id, "category": p.category, "messages": [*p.context, {"role": "user", "content": p.turns[0]}]}
            for p in chosen]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def merged(base: dict, over: dict) -> dict:
    out = {k: dict(v) for k, v in base.items()}
    for sec, kv in over.items():
        out.setdefault(sec, {}).update(kv)
    return out


def variant_config(name: str, run_dir: Path, regen_dir: Path, cache_dir: Path) -> dict:
    """The run config of variant ``name`` (a key of VARIANTS: the plain recipe plus its overrides, or
    "demo": the demo's recipe as it is) from the demo data and cache."""
    from draftsmith.train.demo import demo_config

    raw = demo_config(str(run_dir), [str(regen_dir)], engine="cache", cache_dir=str(cache_dir))
    return raw if name == "demo" else merged(merged(raw, PLAIN), VARIANTS[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", nargs="+", default=["baseline", "norms", "muon", "best"])
    ap.add_argument("--list", action="store_true", help="print the variants and exit")
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps per variant (equal for all)")
    ap.add_argument("-k", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-sets", nargs="+", default=["mt_bench", "mixed"])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-dtype", default="float32", help="the target's dtype in the exact eval")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "recipe_sweep.json"))
    args = ap.parse_args()
    if args.list:
        for name, over in VARIANTS.items():
            print(f"{name}: {json.dumps(over)}")
        return 0
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {unknown}; known: {', '.join(VARIANTS)}")

    from draftsmith.config import build_config
    from draftsmith.eval.offline import run_eval
    from draftsmith.train.demo import prepare_data
    from draftsmith.train.loop import train

    regen_dir, cache_dir, _ = prepare_data(progress=False)
    out_root = Path(args.out).parent / "recipe_sweep"
    prompt_files = {s: spread_prompts(s, args.prompts, out_root / f"prompts_{s}.jsonl") for s in args.prompt_sets}
    results = []
    for name in args.variants:
        run_dir = out_root / name
        raw = variant_config(name, run_dir, regen_dir, cache_dir)
        raw["train"]["epochs"], raw["train"]["max_steps"] = 50, args.steps
        raw["output"]["tensorboard"] = False
        cfg = build_config(raw, f"recipe_sweep:{name}")
        t0 = time.perf_counter()
        result = train(cfg, progress=False)
        train_s = time.perf_counter() - t0
        row = {"variant": name, "overrides": VARIANTS[name], "steps": result.step, "tokens": result.tokens,
               "train_s": round(train_s, 1), "held_out": result.eval, "real": {}}
        for prompt_set in args.prompt_sets:
            for k in args.k:
                rep = run_eval(target="smollm2", draft=str(result.checkpoint), prompts=str(prompt_files[prompt_set]),
                               k=k, max_new_tokens=args.max_new_tokens, dtype=args.eval_dtype,
                               plain=False, progress=False)
                o = rep["overall"]
                row["real"][f"{prompt_set}@K{k}"] = {
                    "tau": o["tau"], "acceptance_per_position": o.get("acceptance_per_position"),
                    "conditional": o.get("conditional_acceptance_per_position"), "drafts": o.get("drafts")}
        results.append(row)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
        print(f"{name}: " + "  ".join(f"{key} tau {v['tau']:.3f}" for key, v in row["real"].items())
              + f"  (held-out sim tau {result.eval.get('simulated_tau', float('nan')):.3f}, {train_s:.0f} s)", flush=True)

    keys = [f"{s}@K{k}" for s in args.prompt_sets for k in args.k]
    print("\n| variant | steps | train s | held-out sim tau | " + " | ".join(f"{key} tau" for key in keys) + " |")
    print("|---|---|---|---|" + "---|" * len(keys))
    for r in results:
        cells = " | ".join(f"{r['real'][key]['tau']:.3f}" for key in keys)
        print(f"| {r['variant']} | {r['steps']} | {r['train_s']:.0f} | {r['held_out'].get('simulated_tau', 0):.3f} | {cells} |")
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
