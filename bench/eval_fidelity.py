"""Fidelity of the engine-free evaluator: tau from `draftsmith eval` vs tau from real vLLM, in one run.

    .venv/bin/python bench/eval_fidelity.py [--run runs/demo] [--per-category 3] [--max-new-tokens 64] [-k 3]

Same target (SmolLM2-135M-Instruct), same draft (the demo's checkpoints/LATEST for the evaluator,
its vLLM copy for the server), same token ids (rendered once with the target's chat template and sent
to /v1/completions), same K, greedy, fp32, ignore_eos so both generate exactly --max-new-tokens.
Prompts: the first turn of --per-category MT-Bench questions per category from
the shipped MT-Bench set, or --prompts SET|FILE (gsm8k, humaneval, mixed, a file).
vLLM's tau comes from its /metrics counter diffs (1 + accepted/drafts), the evaluator's from its
own verification rounds. Prints both, their relative difference (goal: within 5%), per-position
rates and how many generations are token-identical; writes runs/bench/eval_fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from draftsmith.serve.process import ServerProcess, free_port, sigterm_exits  # noqa: E402

def pick_prompts(path: str | None, per_category: int):
    from draftsmith.eval.prompts import load_prompts

    src = path or "mt_bench"  # shipped with draftsmith
    chosen, seen = [], {}
    for p in load_prompts(src):
        if seen.get(p.category, 0) < per_category:
            seen[p.category] = seen.get(p.category, 0) + 1
            chosen.append(p)
    return chosen, src


def vllm_copy(run: Path, tmp: Path) -> Path:
    """The run's vLLM draft (the demo writes <run>/vllm_draft); else a minimal copy in vLLM's names."""
    if (run / "vllm_draft" / "config.json").is_file():
        return run / "vllm_draft"
    from safetensors.torch import load_file, save_file

    from draftsmith.eval.offline import resolve_draft_dir

    src = resolve_draft_dir(run)
    state = {(k if k in ("lm_head.weight", "d2t") else k.removeprefix("model.")): v
             for k, v in load_file(str(src / "model.safetensors")).items() if k != "t2d"}
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLMEagle3"]
    out = tmp / "vllm_draft"
    out.mkdir()
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config))
    return out


def vllm_tau(target: str, draft: Path, prompts, render, k: int, max_tokens: int, log: Path) -> dict:
    """Start ONE vLLM server (bounded wait, always stopped) and bench it with draftsmith's bench-server."""
    from draftsmith.eval.online import HttpClient, bench_server

    port = free_port()
    spec = json.dumps({"method": "eagle3", "model": str(draft), "num_speculative_tokens": k})
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", target, "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-model-len", "2048", "--enforce-eager", "--seed", "0",
            "--speculative-config", spec]
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    with sigterm_exits(), ServerProcess(argv, port, log, env=env, ready_s=600, stop_s=60) as srv:
        return bench_server(srv.base, prompts, api="completions", render=render, max_tokens=max_tokens,
                            ignore_eos=True, k=k, client=HttpClient(timeout_s=900), extra={"return_token_ids": True})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", default=str(ROOT / "runs" / "demo"), help="run dir (checkpoints/LATEST, vllm_draft)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--prompts", default=None, help="shipped set (mt_bench, gsm8k, humaneval, mixed) or prompt file (default: mt_bench, --per-category per category)")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "eval_fidelity.json"))
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from draftsmith.eval.offline import run_eval
    from draftsmith.eval.prompts import render_prompt
    from draftsmith.models import resolve_target

    run, out = Path(args.run), Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    target = str(resolve_target(args.target))
    prompts, source = pick_prompts(args.prompts, args.per_category)
    prompt_file = out.with_suffix(".prompts.jsonl")  # exactly what both sides see
    prompt_file.write_text("".join(json.dumps({"id": p.id, "category": p.category, "turns": p.turns}) + "\n"
                                   for p in prompts))
    print(f"{len(prompts)} prompts from {source}; K={args.k}, {args.max_new_tokens} new tokens, greedy, fp32")

    t0 = time.monotonic()
    offline = run_eval(target=target, draft=str(run), prompts=str(prompt_file), k=args.k, temperature=0.0,
                       max_new_tokens=args.max_new_tokens, dtype="float32", plain=False, ignore_eos=True,
                       progress=False)
    offline_s = time.monotonic() - t0
    tok = AutoTokenizer.from_pretrained(target, local_files_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        online = vllm_tau(target, vllm_copy(run, Path(tmp)), prompts, lambda m: render_prompt(tok, m), args.k,
                          args.max_new_tokens, out.with_suffix(".vllm.log"))
        online_s = time.monotonic() - t0

    a, b = offline["overall"], online["overall"]
    served = {r["id"]: r.get("token_ids") for r in online["records"]}
    identical = sum(served.get(r["id"]) == r["token_ids"] for r in offline["records"])
    rel = abs(a["tau"] - b["tau"]) / b["tau"]
    result = {
        "prompts": len(prompts), "source": source, "k": args.k, "max_new_tokens": args.max_new_tokens,
        "draft": offline["config"]["draft"], "target": target,
        "offline": {key: a[key] for key in ("tau", "drafts", "accepted", "acceptance_per_position")},
        "vllm": {key: b[key] for key in ("tau", "drafts", "accepted", "acceptance_per_position")},
        "relative_difference": rel, "within_5_percent": rel <= 0.05, "identical_generations": identical,
        "categories": {c: {"offline_tau": offline["categories"][c]["tau"], "vllm_tau": online["categories"][c]["tau"]}
                       for c in offline["categories"]},
        "wall_s": {"offline": offline_s, "vllm_incl_startup": online_s},
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    fmt = lambda xs: " ".join(f"{x:.3f}" for x in xs)  # noqa: E731
    print(f"draftsmith eval: tau {a['tau']:.4f}  ({a['drafts']} drafts, {a['accepted']} accepted)  "
          f"per position {fmt(a['acceptance_per_position'])}  [{offline_s:.0f} s]")
    print(f"vLLM           : tau {b['tau']:.4f}  ({b['drafts']} drafts, {b['accepted']} accepted)  "
          f"per position {fmt(b['acceptance_per_position'])}  [{online_s:.0f} s incl. startup]")
    print(f"relative difference {100 * rel:.2f}% (goal <= 5%); token-identical generations {identical}/{len(prompts)}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
