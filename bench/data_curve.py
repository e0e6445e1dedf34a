"""What data buys: real tau against the number of distinct regenerated conversations, at a fixed number of steps.

    .venv/bin/python bench/data_curve.py [--rows 36 72 145 291] [--steps 150] [--eval-every 25] [--patience 3]
        [-k 1 3] [--prompts 6] [--prompt-sets mt_bench mixed] [--max-new-tokens 96] [--threads N] [--reuse]
        [--data REGEN_DIR --cache CACHE_DIR [--config RUN.yaml]] [--out runs/bench/data_curve.json]

The data and feature cache are the demo's by default (`draftsmith.train.demo.prepare_data`: SmolLM2's own
answers to ShareGPT first turns, sampled at temperature 0.8 since 2026-12-06, greedy before; built once and
reused), trained with the demo's recipe. --data and --cache name another `draftsmith regenerate` output and
the feature cache built over it (e.g. the 60-minute recipe's thousands of `builtin:mix` conversations), and
--config the run YAML to train each point with instead of the demo's recipe (e.g. examples/smollm2_best.yaml;
its sources, cache, held-out rows, step budget and output dir are the bench's). The conversations are
shuffled once (seed 0): the first 24 are the held-out split of every point (``data.eval_sources``, so every
point is scored on the same rows),
the rest is the training pool, and point N trains on the pool's first N (nested: each point's rows contain
the smaller points'). Every point is the recipe trained for the same --steps optimizer steps (so a
small N runs many epochs, a large one few: the x axis is distinct conversations, not passes), with
`train.keep_best` and `train.early_stop_patience` on, evaluated every --eval-every steps: the draft scored is
the best held-out one, so more passes over a small set cannot make its point worse than it has to be.

The y axis is real tau from `draftsmith eval` (exact verification with the HF target in fp32, greedy; equal
to vLLM's) at each K on the first --prompts prompts of each --prompt-sets. The budget is steps, not seconds,
so the figures do not depend on the machine's speed or load (pin with taskset and --threads anyway: the run
is long). Prints the table and the least-squares slope of tau against log2(N), "tau per doubling of the
data", the rule of thumb docs/benchmarks.md quotes; writes JSON and a PNG beside it. --reuse keeps the
points an earlier run of the same settings finished.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_errors import BadInput, run  # noqa: E402
from draftsmith import atomic  # noqa: E402
from draftsmith.data.regenerated import read_manifest, shard_rows  # noqa: E402
from recipe_sweep import spread_prompts  # noqa: E402  (the same prompt spread as the other benches)

HELD_OUT = 24  # the demo's held-out split size


def conversations(regen_dir: Path) -> list[dict]:
    """Every conversation of a `draftsmith regenerate` output dir, in its manifest's shard order (read as the
    trainer reads them: lines end at "\n" only, answers may hold U+2028)."""
    return [row for name in read_manifest(regen_dir)["shards"] for row in shard_rows(regen_dir / name)]


def split(regen_dir: Path) -> tuple[list[dict], list[dict]]:
    """(held-out conversations, training pool) of a regenerate dir: shuffled once with seed 0, the first
    HELD_OUT held out for every point or arm."""
    convs = conversations(regen_dir)
    random.Random(0).shuffle(convs)
    return convs[:HELD_OUT], convs[HELD_OUT:]


def demo_split() -> tuple[Path, Path, list[dict], list[dict]]:
    """(the demo's regenerate dir, its feature cache, held-out conversations, training pool): the demo's data
    (built once, reused) split by :func:`split`."""
    from draftsmith.train.demo import prepare_data

    regen_dir, cache_dir, _ = prepare_data(progress=False)
    return (regen_dir, cache_dir, *split(regen_dir))


def point_config(base: Optional[dict], run_dir: Path, train_file: Path, held_file: Path, cache_dir: Path,
                 steps: int, eval_every: int, patience: int) -> dict:
    """One point's raw run config: ``base`` (a run config's mapping, RunConfig.to_dict(); None: the demo's recipe) trained on
    ``train_file`` from the feature cache ``cache_dir`` for ``steps`` optimizer steps, scored on ``held_file``
    every ``eval_every`` steps with the best held-out checkpoint kept. A time budget in ``base`` is dropped:
    the budget is steps, so a point does not depend on the machine's speed (and the LR cosine ends at them)."""
    if base is None:
        from draftsmith.train.demo import demo_config

        raw = demo_config(str(run_dir), [str(train_file)], engine="cache", cache_dir=str(cache_dir))
    else:
        raw = {sec: dict(v) if isinstance(v, dict) else v for sec, v in base.items()}
        for sec in ("target", "data", "train", "output"):
            raw.setdefault(sec, {})
        raw["target"].update(engine="cache", cache_dir=str(cache_dir))
        raw["data"]["sources"] = [str(train_file)]
        raw["output"]["dir"] = str(run_dir)
        raw["train"]["max_time_s"] = None
    raw["data"]["eval_sources"] = [str(held_file)]
    raw["train"].update(epochs=10_000, max_steps=steps, eval_every=eval_every, keep_best=True,
                        early_stop_patience=patience, log_every=25)
    raw["output"]["tensorboard"] = False
    return raw


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def add_eval_args(ap: argparse.ArgumentParser) -> None:
    """The exact eval's flags (K, prompts, sets, tokens) and --threads, as data_curve and data_ab take them."""
    ap.add_argument("-k", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-sets", nargs="+", default=["mt_bench", "mixed"])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--multi-turn-sets", nargs="*", default=[], metavar="SET",
                    help="also score these of --prompt-sets turn after turn (each turn asked after the target's "
                         "answer to the one before, `draftsmith eval --multi-turn`): keys <set>+turns@K<k>")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")


def eval_keys(prompt_sets: list[str], ks: list[int], multi_turn_sets: list[str] = ()) -> list[str]:
    """The keys :func:`real_taus` fills, in its order: ``<set>@K<k>``, then ``<set>+turns@K<k>``."""
    return ([f"{s}@K{k}" for s in prompt_sets for k in ks]
            + [f"{s}+turns@K{k}" for s in prompt_sets if s in multi_turn_sets for k in ks])


def real_taus(draft: Path, prompt_files: dict[str, Path], ks: list[int], max_new_tokens: int,
              multi_turn_sets: list[str] = (), only: Optional[set] = None) -> dict:
    """{"<set>@K<k>": {tau, acceptance_per_position}}: the exact eval (HF target, fp32, greedy; equal to vLLM's)
    of checkpoint ``draft`` on each prompt file at each K; for the sets in ``multi_turn_sets`` also every turn
    of each prompt (``<set>+turns@K<k>``: MT-Bench's second turns follow the target's own first answer).
    ``only``: just these keys (the ones a reused run lacks)."""
    from draftsmith.eval.offline import run_eval

    out = {}
    for key in eval_keys(list(prompt_files), ks, multi_turn_sets):
        if only is not None and key not in only:
            continue
        name, _, k = key.rpartition("@K")
        multi = name.endswith("+turns")
        o = run_eval(target="smollm2", draft=str(draft), prompts=str(prompt_files[name.removesuffix("+turns")]),
                     k=int(k), max_new_tokens=max_new_tokens, multi_turn=multi, dtype="float32", plain=False,
                     progress=False)["overall"]
        out[key] = {"tau": o["tau"], "acceptance_per_position": o.get("acceptance_per_position")}
    return out


def fill_real(entry: dict, prompt_files: dict[str, Path], args, fallback: Optional[Path] = None) -> bool:
    """A reused point or arm scored on the keys this run asks for that it lacks (a --multi-turn-sets added
    later), from the checkpoint it recorded (``entry["draft"]``, else ``fallback``) -> whether any was added."""
    want = eval_keys(list(prompt_files), args.k, args.multi_turn_sets)
    missing = {k for k in want if k not in entry["real"]}
    if not missing:
        return False
    draft = entry.get("draft") or fallback
    if draft is None:
        raise BadInput(f"{Path(sys.argv[0]).name}: a reused entry records no checkpoint to score "
                       f"{sorted(missing)} on; rerun without --reuse")
    entry["real"].update(real_taus(Path(draft), prompt_files, args.k, args.max_new_tokens, args.multi_turn_sets,
                                   only=missing))
    return True


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against log2(xs): tau gained per doubling of the data."""
    lx = [math.log2(x) for x in xs]
    mx, my = sum(lx) / len(lx), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ys)) / den if den else float("nan")


def plot(points: list[dict], keys: list[str], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for key in keys:
        ax.plot([p["rows"] for p in points], [p["real"][key]["tau"] for p in points], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("distinct training conversations (log2)")
    ax.set_ylabel("real tau (exact eval == vLLM)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[36, 72, 145, 291],
                    help="training conversations per point (nested prefixes of one shuffled pool)")
    ap.add_argument("--steps", type=int, default=150, help="optimizer steps per point (equal for all)")
    ap.add_argument("--eval-every", type=int, default=25, help="held-out evaluations for keep_best / early stop")
    ap.add_argument("--patience", type=int, default=3, help="train.early_stop_patience (0: train every step)")
    ap.add_argument("--data", help="a `draftsmith regenerate` output dir (default: the demo's data); needs --cache")
    ap.add_argument("--cache", help="the feature cache built over --data's conversations (`draftsmith cache`)")
    ap.add_argument("--config", help="a run YAML to train each point with (default: the demo's recipe), e.g. "
                                     "examples/smollm2_best.yaml")
    add_eval_args(ap)
    ap.add_argument("--reuse", action="store_true", help="keep points an earlier run with the same settings finished")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "data_curve.json"))
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    from draftsmith.config import build_config
    from draftsmith.train.loop import train

    if (args.data is None) != (args.cache is None):
        raise BadInput("data_curve: --data and --cache go together (a regenerate dir and the feature cache built "
                       "over it, `draftsmith cache RUN.yaml --out DIR`); pass both or neither")
    for flag, value in (("--data", args.data), ("--cache", args.cache)):
        if value is not None and not (Path(value) / "manifest.json").is_file():
            raise BadInput(f"data_curve: {flag} {value}: no manifest.json there; pass a finished output dir")
    base = None
    if args.config:  # read and checked as `draftsmith train` reads it, before any point spends its steps
        from draftsmith.config import ConfigError, load_config

        try:
            base = load_config(args.config).to_dict()
        except ConfigError as e:
            raise BadInput(f"data_curve: --config {e}") from None
    if args.data:
        regen_dir, cache_dir = Path(args.data), Path(args.cache)
        held_out, pool = split(regen_dir)
    else:
        regen_dir, cache_dir, held_out, pool = demo_split()
    root = Path(args.out).with_suffix("")
    if max(args.rows) > len(pool):
        raise BadInput(f"data_curve: --rows {max(args.rows)} is more than the {len(pool)} training conversations "
                       f"of {regen_dir} ({len(pool) + HELD_OUT} less {HELD_OUT} held out)")
    held_file = write_jsonl(held_out, root / "held_out.jsonl")
    prompt_files = {s: spread_prompts(s, args.prompts, root / f"prompts_{s}.jsonl") for s in args.prompt_sets}
    # multi_turn_sets only adds keys: a reused point is scored on the ones it lacks (fill_real)
    settings = {k: v for k, v in vars(args).items() if k not in ("rows", "reuse", "out", "threads", "multi_turn_sets")}
    for k in ("data", "cache", "config"):  # absent when not given: a demo run's settings read as they did before
        if settings[k]:
            settings[k] = str(Path(settings[k]).resolve())
        else:
            del settings[k]
    old = json.loads(Path(args.out).read_text()) if args.reuse and Path(args.out).is_file() else {}
    done = {p["rows"]: p for p in old.get("points", []) if old.get("settings") == settings}
    points = []

    def save() -> None:  # after each point: --reuse resumes a stopped run from the JSON
        atomic.write_text(Path(args.out), json.dumps({"settings": settings, "points": points}, indent=2) + "\n")

    for n in sorted(args.rows):
        if n in done:
            points.append(done[n])
            if fill_real(done[n], prompt_files, args):
                save()
            continue
        run_dir = root / f"rows_{n}"
        raw = point_config(base, run_dir, write_jsonl(pool[:n], root / f"train_{n}.jsonl"), held_file, cache_dir,
                           args.steps, args.eval_every, args.patience)
        t0 = time.perf_counter()
        result = train(build_config(raw, f"data_curve:{n}"), progress=False)
        point = {"rows": n, "steps": result.step, "tokens": result.tokens, "epochs": result.epoch,
                 "train_s": round(time.perf_counter() - t0, 1),
                 "best_step": result.best.step if result.best else None,
                 "held_out_tau": result.best.score if result.best else None, "real": {}}
        # the best held-out checkpoint (keep_best), else the last one
        draft = result.best.checkpoint if result.best and result.best.checkpoint else result.checkpoint
        point["draft"] = str(draft)
        point["real"] = real_taus(draft, prompt_files, args.k, args.max_new_tokens, args.multi_turn_sets)
        points.append(point)
        save()
        print(f"rows {n}: {result.step} steps ({result.epoch} epochs), best step {point['best_step']}, "
              + "  ".join(f"{key} {v['tau']:.3f}" for key, v in point["real"].items()), flush=True)

    keys = eval_keys(args.prompt_sets, args.k, args.multi_turn_sets)
    print("\n| conversations | steps | epochs | best step | held-out sim tau | " + " | ".join(keys) + " |")
    print("|---|---|---|---|---|" + "---|" * len(keys))
    for p in points:
        held = f"{p['held_out_tau']:.3f}" if p["held_out_tau"] is not None else "-"
        print(f"| {p['rows']} | {p['steps']} | {p['epochs']} | {p['best_step']} | {held} | "
              + " | ".join(f"{p['real'][k]['tau']:.3f}" for k in keys) + " |")
    print("\ntau per doubling of the distinct conversations (least squares over log2 N):")
    for k in keys:
        print(f"  {k}: {slope([p['rows'] for p in points], [p['real'][k]['tau'] for p in points]):+.3f}")
    png = Path(args.out).with_suffix(".png")
    recipe = Path(args.config).name if args.config else "demo recipe"
    data = f", {Path(args.data).name}" if args.data else ""
    plot(points, keys, png, f"{recipe}{data}, {args.steps} steps a point, best held-out checkpoint")
    print(f"\nJSON: {args.out}\nPNG: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
