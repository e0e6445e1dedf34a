"""Serving speedup on real vLLM: no speculation vs vLLM `ngram` and `suffix` vs draftsmith drafts (EAGLE-3, P-EAGLE, DFlash, JetSpec).

    .venv/bin/python bench/serve_speedup.py [--draft runs/demo/checkpoints/LATEST] [-k 1 3] [--prompts N] [--max-tokens M]
    .venv/bin/python bench/serve_speedup.py --draft eagle3=runs/e3 --draft peagle=runs/pe -k 1 3 5 7
    .venv/bin/python bench/serve_speedup.py --draft eagle3=runs/e3 --draft dflash=runs/df@3,7,15 -k 1 3

Each `--draft` (a path, or NAME=PATH to label it) is served at every K (or at its own list, PATH@K,K);
its family (chain EAGLE-3, parallel P-EAGLE, block DFlash/JetSpec) comes from its config.json, exactly
as `draftsmith serve vllm` resolves it. `--draft none` measures the baselines alone. vLLM's `suffix`
(suffix decoding) runs beside ngram at ngram's K whenever arctic-inference is installed (`make suffix`;
`--suffix off` skips it, `--suffix on` fails when it cannot run).

One vLLM OpenAI server per configuration, the same target (SmolLM2-135M-Instruct, models.smollm2()),
the same prompts sent one at a time (batch 1), greedy. Per configuration: output tokens/s over all
prompts (after one warm-up request), and tau = 1 + accepted / drafts from the /metrics counter
diffs (vLLM's `vllm:spec_decode_num_*_total`), and the acceptance rate per draft position
(`..._num_accepted_tokens_per_pos_total{position=i}` / drafts). Prompts: the first turn of the first N MT-Bench
questions (`--prompt-set`, default `mt_bench`, shipped with draftsmith; gsm8k, humaneval, mixed or a file),
rendered with the target's chat template (`--chat-template-kwargs '{"enable_thinking": false}'` passes
template variables). The EAGLE-3 server is launched exactly as `draftsmith serve vllm` would (plan_vllm:
resolution + vllm_export/). The measuring itself is draftsmith.eval.speedup (measure / best_by_kind /
one_line), shared with other front ends. Writes runs/bench/serve_speedup.json and prints a table and
one summary line.

As users deploy: `--dtype bfloat16` (fp32, the default, is the lossless check: every configuration's
text must equal no speculation's; in bf16 a verification batch can round differently from a one-token
step, so the outputs may part after a near-tie), `--preload-tcmalloc --preload-iomp` (vLLM CPU's
recommended LD_PRELOAD of tcmalloc and Intel OpenMP) and `--env KEY=VALUE` for the servers (e.g.
VLLM_CPU_OMP_THREADS_BIND=0-1; vLLM's default is auto).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from draftsmith.eval.speedup import (best_by_kind, describe_prompt_set, measure, one_line,  # noqa: E402
                                     outputs_identical, render_prompts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", action="append", default=None, metavar="[NAME=]PATH[@K,K...]",
                    help="a draft checkpoint (repeatable; default runs/demo/checkpoints/LATEST); @K,K... gives it "
                         "its own K list instead of -k (e.g. a DFlash block draft: dflash=runs/df@3,7,15)")
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--prompt-set", default="mt_bench", help="mt_bench | gsm8k | humaneval | mixed | a prompt file")
    ap.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                    help="a JSON object passed to the chat template, e.g. '{\"enable_thinking\": false}'")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("-k", "--num-speculative-tokens", type=int, nargs="+", default=[3],
                    help="K for ngram and the draft; several values run one server per K (default 3)")
    ap.add_argument("--ngram-k", type=int, nargs="+", default=None,
                    help="K for ngram when it should differ from the drafts' (default: the -k list)")
    ap.add_argument("--suffix", choices=("auto", "on", "off"), default="auto",
                    help="vLLM suffix decoding beside ngram: auto = when arctic-inference is installed")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--preload-iomp", action="store_true",
                    help="LD_PRELOAD <venv>/lib/libiomp5.so for every configuration (vLLM CPU's advice)")
    ap.add_argument("--preload-tcmalloc", action="store_true",
                    help="LD_PRELOAD the system's libtcmalloc_minimal.so.4 too (vLLM CPU's advice; Debian/Ubuntu: "
                         "apt-get install libtcmalloc-minimal4)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for every server (repeatable), e.g. VLLM_CPU_OMP_THREADS_BIND=0-1")
    ap.add_argument("--out", default=str(ROOT / "runs" / "bench" / "serve_speedup.json"))
    args = ap.parse_args()
    libs = []
    if args.preload_tcmalloc:  # first: the allocator must be in place before anything allocates
        found = [p for p in (Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
                             Path("/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4"),
                             Path("/usr/lib64/libtcmalloc_minimal.so.4"), Path("/usr/lib/libtcmalloc_minimal.so.4"))
                 if p.is_file()]
        if not found:
            ap.error("--preload-tcmalloc: libtcmalloc_minimal.so.4 not found in /usr/lib*; install it "
                     "(Debian/Ubuntu: apt-get install libtcmalloc-minimal4) or drop the flag")
        libs.append(str(found[0]))
    if args.preload_iomp:
        lib = Path(sys.prefix) / "lib" / "libiomp5.so"
        if not lib.is_file():
            ap.error(f"--preload-iomp: {lib} not found (it ships with vllm-cpu's intel-openmp dependency)")
        libs.append(str(lib))
    preload = ":".join(libs)
    server_env = {}
    for kv in args.env:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            ap.error(f"--env {kv!r}: expected KEY=VALUE, e.g. --env VLLM_CPU_OMP_THREADS_BIND=0-1")
        server_env[key] = value

    template_kwargs = None
    if args.chat_template_kwargs is not None:
        try:
            template_kwargs = json.loads(args.chat_template_kwargs)
        except json.JSONDecodeError as e:
            ap.error(f"--chat-template-kwargs: invalid JSON ({e.msg}); pass an object such as '{{\"enable_thinking\": false}}'")
        if not isinstance(template_kwargs, dict):
            ap.error(f"--chat-template-kwargs: expected a JSON object, got {type(template_kwargs).__name__}; "
                     "pass e.g. '{\"enable_thinking\": false}'")

    from transformers import AutoTokenizer

    from draftsmith.data.formats import DataError
    from draftsmith.eval import EvalError
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.models import resolve_target
    from draftsmith.serve.resolve import ServeError, resolve_draft

    from draftsmith.eval.baselines import suffix_support

    suffix, suffix_note = suffix_support()
    if args.suffix == "on" and not suffix:
        ap.error(f"--suffix on: {suffix_note}")
    suffix = suffix and args.suffix != "off"
    drafts, draft_ks = {}, {}  # label -> resolved draft, label -> its own K list
    for spec in [] if args.draft == ["none"] else args.draft or [str(ROOT / "runs" / "demo" / "checkpoints" / "LATEST")]:
        label, _, path = spec.rpartition("=")
        path, at, klist = path.partition("@")
        try:
            own = [int(k) for k in klist.split(",")] if at else None
        except ValueError:
            ap.error(f"--draft {spec}: the K list after @ must be integers separated by commas, e.g. @3,7,15")
        try:
            d = resolve_draft(path)
        except ServeError as e:
            print(f"serve_speedup: {e}\n(train the demo draft first: `draftsmith demo`)", file=sys.stderr)
            return 2
        drafts[label or d.family] = d
        if own:
            draft_ks[label or d.family] = own
    target = resolve_target(args.target)
    tok = AutoTokenizer.from_pretrained(target)
    source = args.prompt_set
    try:
        prompts = render_prompts(tok, load_prompts(source, limit=args.prompts), template_kwargs)
    except (DataError, EvalError) as e:
        print(f"serve_speedup: {e}", file=sys.stderr)
        return 2
    ks = args.num_speculative_tokens
    out_dir = Path(args.out).parent
    print(f"target {target}\ndrafts {', '.join(f'{n}={d.dir} ({d.family})' for n, d in drafts.items())}\nprompts: {len(prompts)} from {source}, max_tokens {args.max_tokens}, "
          f"K {ks} (ngram {args.ngram_k or ks}), suffix: {'on' if suffix else suffix_note}, batch 1, dtype {args.dtype}, LD_PRELOAD {preload or '-'}, "
          f"env {server_env or '-'}\nserver logs (one vLLM server per configuration): {out_dir}/serve_*.log", flush=True)

    def show(r: dict) -> None:
        print(f"  {r['name']:<22} {r['tokens_per_s']:7.1f} tok/s  tau {r['tau']:.3f}  "
              f"{r['tokens_per_step']:.3f} tokens/step  (ready in {r['ready_s']:.0f} s)", flush=True)

    try:
        results = measure(target, drafts, ks, prompts, args.max_tokens, dtype=args.dtype, log_dir=out_dir,
                          preload=preload, progress=show, ngram_ks=args.ngram_k, draft_ks=draft_ks,
                          env=server_env or None, suffix=suffix)
    except (EvalError, ServeError) as e:
        print(f"serve_speedup: {e}", file=sys.stderr)
        return 2
    base = results[0]["tokens_per_s"]
    same = outputs_identical(results)
    print()
    # tau is vLLM's (over the steps that drafted); tokens/step is over every target forward, the figure that
    # compares ngram and suffix decoding (which draft only where a lookup matches) with a draft
    print("| config | tokens/s | speedup | tau | tokens/step | acceptance per position | drafts | accepted / draft tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        acc = f"{r['accepted']:.0f} / {r['draft_tokens']:.0f}" if r["drafts"] else "-"
        tau = f"{r['tau']:.3f}" if r["drafts"] else "1 (no drafts)"
        pos = " / ".join(f"{a:.2f}" for a in r["per_position"]) or "-"
        print(f"| {r['name']} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / base:.2f}x | {tau} | "
              f"{r['tokens_per_step']:.3f} | {pos} | {r['drafts']:.0f} | {acc} |")
    print(f"\noutputs identical across configurations (greedy, {args.dtype}): {same}")
    line = one_line(results, prompts=describe_prompt_set(source, len(prompts)))
    print(line)
    summary = {"target": target, "drafts": {n: str(d.dir) for n, d in drafts.items()}, "prompts": source, "n_prompts": len(prompts),
               "max_tokens": args.max_tokens, "k": ks, "dtype": args.dtype, "batch": 1, "ld_preload": preload, "env": server_env,
               "outputs_identical": same, "chat_template_kwargs": template_kwargs, "summary": line,
               "suffix": suffix_note if not suffix else "measured",
               "best": {label: r["name"] for label, r in best_by_kind(results).items()},
               "results": [{kk: v for kk, v in r.items() if kk != "outputs"} for r in results]}
    Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
