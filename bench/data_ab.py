"""Data levers A/B'd at equal wall time: which rows make a CPU hour of training count.

    .venv/bin/python bench/data_ab.py --arm demo=demo --arm copy=demo,runs/data/copy-regen-160
        [--seconds 600 | --steps N] [-k 1 3] [--prompts 6] [--prompt-sets mt_bench mixed] [--max-new-tokens 96]
        [--multi-turn-sets mt_bench]
        [--threads N] [--reuse] [--out runs/bench/data_ab.json]

An arm is ``NAME=PART[,PART...]``, its training rows the union of its parts:

- ``demo``: the demo's training pool (`draftsmith.train.demo.prepare_data`: SmolLM2's own answers to
  ShareGPT first turns, sampled at temperature 0.8 since 2026-12-06, greedy before), less the held-out split
  below;
- ``DIR[@TURNS][:N]``: the conversations of a `draftsmith regenerate` output dir (all, or the first N after
  one seeded shuffle; with ``@TURNS``, each cut to its first TURNS exchanges), e.g. copy-heavy rows (``builtin:mix?summarization=80&extraction=80&...``), the demo's
  prompts regenerated greedy (``--temperature 0``, the same ``--max-rows 320 --seed 0``: the demo's data before
  it was sampled), or several turns (``--max-turns 3``; ``DIR@1`` is the same conversations' first turns, the
  arm to hold it against). A conversation whose first user message is a held-out
  row's is dropped from it (counted in the JSON), so a re-answered demo prompt never trains on the held-out
  split.

Every arm is scored on the same 24 held-out demo conversations (the first 24 of the demo's rows after one
seeded shuffle: bench/data_curve.py's split) and by the exact eval (`draftsmith eval`: HF target, fp32,
greedy; equal to vLLM's) on the first --prompts prompts of each --prompt-sets, spread over their categories;
``--multi-turn-sets mt_bench`` also scores those prompts turn after turn (MT-Bench's second turns follow the
target's own first answer: where multi-turn data should pay), and with --reuse scores the reused arms'
checkpoints on just the keys they lack.
One feature cache serves every arm: built once over the union of all arms' rows (the demo's cache settings:
max_length 2048, aux layers [2, 15, 27] + the last pre-norm state, the demo's precision), kept under
``<out stem>/cache-<fingerprint of the rows>`` and reused by a later run over the same rows.

The budget is equal wall time (--seconds, `train.max_time_s`; the LR cosine is fitted to it), the question a
user asks of a data lever: long copy-heavy rows cost more a step, so an arm that carries them sees fewer
conversations in the same seconds. Pin the run with taskset and --threads 1, and keep the core to it: a
busy core gives an arm fewer steps (the steps and tokens each arm got are printed beside it). --steps N
trains every arm for N optimizer steps instead (load-independent; then tokens differ). Prints one table
with every arm's real tau and its ratio to the first arm; --reuse keeps arms an earlier run of the same
settings finished.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from data_curve import (add_eval_args, conversations, demo_split, eval_keys, fill_real, real_taus,  # noqa: E402
                        write_jsonl)
from bench_errors import BadInput, run  # noqa: E402
from draftsmith import atomic  # noqa: E402
from draftsmith.data.regenerated import regenerated_manifest  # noqa: E402
from recipe_sweep import spread_prompts  # noqa: E402


def parse_arm(spec: str) -> tuple[str, list[tuple[str, int | None, int | None]]]:
    """``NAME=PART[,PART...]`` -> (NAME, [(path, N or None, TURNS or None)]); PART is ``demo`` or
    ``DIR[@TURNS][:N]``."""
    name, eq, rest = spec.partition("=")
    if not eq or not name or not rest:
        raise BadInput(f"data_ab: --arm {spec!r}: expected NAME=PART[,PART...], e.g. copy=demo,runs/data/copy-regen")
    parts = []
    for part in rest.split(","):
        path, colon, n = part.rpartition(":")
        count = int(n) if colon and n.isdigit() and path else None
        path = path if count is not None else part
        base, at, t = path.rpartition("@")
        turns = int(t) if at and t.isdigit() and int(t) > 0 and base else None
        parts.append((base if turns is not None else path, count, turns))
    return name, parts


def part_label(path: str, n: int | None, turns: int | None) -> str:
    return path + (f"@{turns}" if turns else "") + (f":{n}" if n is not None else "")


def first_turns(conv: dict, turns: int) -> dict:
    """``conv`` cut before its (turns + 1)-th user message: its first ``turns`` exchanges (a regenerated turn
    sees only the turns before it, so these are what a ``--max-turns turns`` regeneration writes)."""
    out, users = [], 0
    for m in conv["messages"]:
        users += m.get("role") == "user"
        if users > turns:
            break
        out.append(m)
    return {**conv, "messages": out}


def first_user(conv: dict) -> str:
    return next((m["content"] for m in conv.get("messages", []) if m.get("role") == "user"), "").strip()


def arm_rows(parts: list[tuple[str, int | None, int | None]], pool: list[dict],
             held_out: list[dict]) -> tuple[list[dict], dict]:
    """The training conversations of one arm and what each part gave: {part: {rows, dropped_held_out}}."""
    held = {first_user(c) for c in held_out}
    rows, report = [], {}
    for part, n, turns in parts:
        if part == "demo":
            taken, dropped = pool if n is None else pool[:n], 0
        else:
            d = Path(part)
            manifest = regenerated_manifest(d)
            if manifest is None or not manifest.get("complete"):
                why = "is not a `draftsmith regenerate` output dir" if manifest is None else "is not complete"
                raise BadInput(f"data_ab: arm part {part!r} {why}; run (or finish) `draftsmith regenerate --out "
                               f"{part} ...` first")
            convs = conversations(d)
            random.Random(0).shuffle(convs)
            kept = [c for c in convs if first_user(c) not in held]
            dropped = len(convs) - len(kept)
            taken = kept if n is None else kept[:n]
        if turns:
            taken = [first_turns(c, turns) for c in taken]
        rows += taken
        report[part_label(part, n, turns)] = {"rows": len(taken), "dropped_held_out": dropped}
    return rows, report


def messages_key(conv: dict) -> str:
    """A conversation's messages as canonical JSON: what makes two rows the same row."""
    return json.dumps(conv.get("messages"), sort_keys=True)


def fingerprint(rows: list[dict]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(messages_key(r).encode() + b"|")
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arm", action="append", required=True, metavar="NAME=PART[,PART...]",
                    help="an arm and its training rows (repeat; the first is the baseline of the ratios)")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--seconds", type=float, default=600.0, help="training wall time per arm (default 600)")
    budget.add_argument("--steps", type=int, default=None, help="optimizer steps per arm instead of seconds")
    add_eval_args(ap)
    ap.add_argument("--reuse", action="store_true", help="keep arms an earlier run with the same settings finished")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "data_ab.json"))
    args = ap.parse_args()
    arms = dict(parse_arm(a) for a in args.arm)
    if len(arms) != len(args.arm):
        raise BadInput("data_ab: two --arm share a name; give each its own")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from draftsmith.cache.build import build_cache
    from draftsmith.config import build_config
    from draftsmith.train.demo import demo_config
    from draftsmith.train.loop import train

    _, _, held_out, pool = demo_split()
    root = Path(args.out).with_suffix("")
    held_file = write_jsonl(held_out, root / "held_out.jsonl")
    train_rows = {name: arm_rows(parts, pool, held_out) for name, parts in arms.items()}

    # one cache over every arm's rows and the held-out split (rows of several arms are cached once)
    union, seen = [], set()
    for rows, _ in train_rows.values():
        for r in rows:
            key = messages_key(r)
            if key not in seen:
                seen.add(key)
                union.append(r)
    cache_dir = root / f"cache-{fingerprint(union + held_out)}"
    union_file = write_jsonl(union, root / "union.jsonl")
    cache_raw = demo_config(str(root / "cache_run"), [str(union_file)], engine="cache", cache_dir=str(cache_dir))
    cache_raw["data"]["eval_sources"] = [str(held_file)]
    t0 = time.perf_counter()
    built = build_cache(build_config(cache_raw, "data_ab:cache"), cache_dir, progress=False)
    print(f"cache: {built['rows']} rows, {built['tokens']:,} tokens in {cache_dir} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)

    prompt_files = {s: spread_prompts(s, args.prompts, root / f"prompts_{s}.jsonl") for s in args.prompt_sets}
    # multi_turn_sets only adds keys: a reused arm is scored on the ones it lacks (fill_real)
    settings = {k: v for k, v in vars(args).items() if k not in ("arm", "reuse", "out", "threads", "multi_turn_sets")}
    old = json.loads(Path(args.out).read_text()) if args.reuse and Path(args.out).is_file() else {}
    done = {r["arm"]: r for r in old.get("arms", []) if old.get("settings") == settings}
    results = []

    def save() -> None:  # after each arm: --reuse resumes a stopped run from the JSON
        atomic.write_text(Path(args.out), json.dumps({"settings": settings, "arms": results}, indent=2) + "\n")

    for name, parts in arms.items():
        rows, report = train_rows[name]
        spec = ",".join(part_label(*p) for p in parts)
        if name in done and done[name]["spec"] == spec:
            results.append(done[name])
            if fill_real(done[name], prompt_files, args, fallback=root / name):  # the run dir: its LATEST
                save()
            continue
        run_dir = root / name
        raw = demo_config(str(run_dir), [str(write_jsonl(rows, root / f"train_{name}.jsonl"))],
                          engine="cache", cache_dir=str(cache_dir))
        raw["data"]["eval_sources"] = [str(held_file)]
        raw["train"].update(epochs=10_000, log_every=25,
                            **({"max_steps": args.steps} if args.steps else {"max_time_s": args.seconds}))
        raw["output"]["tensorboard"] = False
        t0 = time.perf_counter()
        result = train(build_config(raw, f"data_ab:{name}"), progress=False)
        arm = {"arm": name, "spec": spec, "parts": report, "train_rows": len(rows), "steps": result.step,
               "tokens": result.tokens, "epochs": result.epoch, "train_s": round(time.perf_counter() - t0, 1),
               "held_out_tau": result.eval.get("simulated_tau"), "draft": str(result.checkpoint),
               "real": real_taus(result.checkpoint, prompt_files, args.k, args.max_new_tokens, args.multi_turn_sets)}
        results.append(arm)
        save()
        print(f"{name}: {len(rows)} rows, {result.step} steps, {result.tokens:,} tokens  "
              + "  ".join(f"{key} {v['tau']:.3f}" for key, v in arm["real"].items()), flush=True)

    keys = eval_keys(args.prompt_sets, args.k, args.multi_turn_sets)
    base = results[0]
    print("\n| arm | rows | steps | tokens seen | held-out sim tau | " + " | ".join(keys) + " |")
    print("|---|---|---|---|---|" + "---|" * len(keys))
    for r in results:
        held = f"{r['held_out_tau']:.3f}" if r["held_out_tau"] is not None else "-"
        cells = [f"{r['real'][k]['tau']:.3f}" + ("" if r is base else f" ({r['real'][k]['tau'] / base['real'][k]['tau']:.3f}x)")
                 for k in keys]
        print(f"| {r['arm']} | {r['train_rows']} | {r['steps']} | {r['tokens']:,} | {held} | " + " | ".join(cells) + " |")
    print(f"\nJSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
