"""``draftsmith eval`` and ``draftsmith bench-server``: thin adapters over eval.offline / eval.online.

Wired into the main parser by ``register(subparsers)``; handlers return an exit code and raise
:class:`draftsmith.eval.EvalError` (or DataError / TargetError / CheckpointError) for one-line user errors.
"""

from __future__ import annotations

import argparse
import sys


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from draftsmith.eval.offline import run_eval
    from draftsmith.eval.report import format_table, write_report

    if args.threads:
        torch.set_num_threads(args.threads)
    report = run_eval(chat_template_kwargs=template_kwargs_arg(args.chat_template_kwargs),target=args.target, draft=args.draft, prompts=args.prompts, k=args.k,
                      temperature=args.temperature, max_new_tokens=args.max_new_tokens, multi_turn=args.multi_turn,
                      limit=args.limit, dtype=args.dtype, plain=not args.no_plain, seed=args.seed,
                      ignore_eos=args.ignore_eos, progress=not args.quiet, device=args.device)
    print(format_table(report))
    paths = write_report(report, args.out, plot=not args.no_plot)
    print("report: " + "  ".join(str(p) for p in paths.values()))
    bad = (report.get("lossless") or {}).get("mismatches")
    if bad and args.dtype == "float32":
        print(f"draftsmith: error: speculative output differs from plain greedy decoding for {len(bad)} prompt(s) "
              f"in float32 ({', '.join(bad[:5])}); this is a bug, please report it with {paths['json']}",
              file=sys.stderr)
        return 1
    if bad:
        print(f"note: {len(bad)} prompt(s) differ from plain greedy in {args.dtype}: low-precision logits can flip "
              "near-ties when K+1 tokens are verified in one forward; use --dtype float32 to check losslessness",
              file=sys.stderr)
    return 0


def template_kwargs_arg(text: str | None) -> dict | None:
    """``--chat-template-kwargs JSON`` -> dict (None when not given)."""
    import json

    from draftsmith.eval import EvalError

    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError as e:
        value, why = None, str(e)
    else:
        why = "not a JSON object"
    if not isinstance(value, dict):
        raise EvalError(f"--chat-template-kwargs {text!r}: {why}; pass a JSON object, e.g. '{{\"enable_thinking\": false}}'")
    return value


def cmd_bench_server(args: argparse.Namespace) -> int:
    from draftsmith.eval.online import HttpClient, bench_server
    from draftsmith.eval.prompts import describe_prompts, load_prompts, render_prompt
    from draftsmith.eval.report import format_table, write_report

    prompts = load_prompts(args.prompts, multi_turn=args.multi_turn, limit=args.limit)
    print(describe_prompts(prompts, args.prompts), flush=True)
    render, kwargs = None, template_kwargs_arg(args.chat_template_kwargs)
    if args.api == "completions":
        from draftsmith.eval import EvalError

        if not args.tokenizer:
            raise EvalError("--api completions needs --tokenizer (the target's checkpoint dir or `smollm2`) "
                            "to render prompts into token ids")
        from transformers import AutoTokenizer

        from draftsmith.models import resolve_target

        tok = AutoTokenizer.from_pretrained(resolve_target(args.tokenizer), local_files_only=True)
        render = lambda messages: render_prompt(tok, messages, kwargs)  # noqa: E731
    client = HttpClient(retries=args.retries, backoff_s=args.backoff, timeout_s=args.timeout)
    report = bench_server(args.url, prompts, baseline_url=args.baseline_url, concurrency=args.concurrency,
                          max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=args.ignore_eos,
                          model=args.model, api=args.api, render=render, k=args.k, client=client,
                          # chat: the server renders, so it gets the kwargs (top level, as vLLM/SGLang read them)
                          extra={"chat_template_kwargs": kwargs} if kwargs and args.api == "chat" else None)
    print(format_table(report))
    paths = write_report(report, args.out, plot=not args.no_plot)
    print("report: " + "  ".join(str(p) for p in paths.values()))
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", required=True, metavar="SET|FILE",
                   help="a shipped set (mt_bench, gsm8k, humaneval, mixed) or a JSONL of {id, category, turns} (first "
                        "turn unless --multi-turn) or OpenAI/ShareGPT conversations (the last user turn, earlier "
                        "turns as context)")
    p.add_argument("--multi-turn", action="store_true", help="ask every turn, each after the answer to the previous")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); > 0 samples")
    p.add_argument("--ignore-eos", action="store_true", help="always generate the full token budget")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plot of per-position acceptance")
    p.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help="kwargs for the target's chat template, e.g. '{\"enable_thinking\": false}' (eval default: "
                        "the ones the draft was trained with, from its checkpoint)")


def register(subparsers) -> None:
    """Add ``eval`` and ``bench-server`` to the ``draftsmith`` sub-command parser."""
    e = subparsers.add_parser("eval", help="real speculative decoding of a trained draft with the hf target: "
                                           "tau, per-position acceptance, speedup vs plain decoding")
    e.add_argument("--target", default=None, help="HF checkpoint dir, hub id org/name or `smollm2` (default: the checkpoint's target)")
    e.add_argument("--draft", required=True, metavar="CKPT",
                   help="run dir, checkpoint dir (epoch_<E>_step_<S>), model/consolidated or a vLLM export")
    _common(e)
    e.add_argument("-k", "--num-speculative-tokens", dest="k", type=int, default=None,
                   help="K drafted tokens per round (default 3 for EAGLE-3; P-EAGLE: its num_depths, at most "
                        "that; DFlash/JetSpec: block_size - 1; Domino with shift_label: block_size)")
    e.add_argument("--max-new-tokens", type=int, default=128, help="tokens per answer (default 128)")
    e.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype the target runs in (default float32, where greedy output is exactly lossless); "
                        "the draft runs in float32")
    e.add_argument("--device", default="auto",
                   help="where the target and the draft run: auto (the local rank's GPU when there is one, else "
                        "cpu), cpu, cuda, cuda:N")
    e.add_argument("--no-plain", action="store_true", help="skip plain decoding (no speedup, no lossless check)")
    e.add_argument("--seed", type=int, default=0, help="sampling seed with --temperature > 0 (default 0)")
    e.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    e.add_argument("--out", default="runs/eval",
                   help="directory for report.json and acceptance.png (default runs/eval)")
    e.add_argument("--quiet", action="store_true", help="no per-prompt progress lines")
    e.set_defaults(func=cmd_eval)

    b = subparsers.add_parser("bench-server", help="benchmark a running vLLM/SGLang server: tau and per-position "
                                                   "acceptance from its counters, throughput, speedup vs a baseline")
    b.add_argument("--url", required=True, help="speculative server, e.g. http://127.0.0.1:8000")
    b.add_argument("--baseline-url", default=None, help="the same target served without speculation")
    _common(b)
    b.add_argument("--concurrency", type=int, default=1, help="requests in flight (default 1)")
    b.add_argument("--max-tokens", type=int, default=128, help="max_tokens per request (default 128)")
    b.add_argument("--model", default=None, help="model name for requests (default: the first of /v1/models)")
    b.add_argument("--api", default="chat", choices=["chat", "completions"],
                   help="chat: the server renders the template; completions: token ids rendered with --tokenizer")
    b.add_argument("--tokenizer", default=None, help="target checkpoint (or `smollm2`) for --api completions")
    b.add_argument("-k", dest="k", type=int, default=None, help="K the server uses (default: from its counters)")
    b.add_argument("--retries", type=int, default=5, help="retries on 5xx/429/connection errors (default 5)")
    b.add_argument("--backoff", type=float, default=0.5, help="first retry delay in seconds, doubled each time")
    b.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    b.add_argument("--out", default="runs/bench-server", help="directory for report.json and acceptance.png")
    b.set_defaults(func=cmd_bench_server)

    from draftsmith.eval.check_cli import register as register_check  # served vs offline

    register_check(subparsers)
