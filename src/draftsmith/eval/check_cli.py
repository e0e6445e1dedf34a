"""``draftsmith check --target T --draft D --prompts SET [-k K] [--url URL]``: the runner and its parser.

:func:`run_check` validates everything cheap first (prompt set, draft, target sizes, the server at
``--url``), then decodes offline (:class:`draftsmith.eval.check.OfflineDecoder`), then serves (a
vLLM server started exactly as ``draftsmith serve vllm`` starts it, stopped afterwards, or the one
at ``--url``), compares (:mod:`draftsmith.eval.gap`), tests the causes (:mod:`draftsmith.eval.causes`)
and writes ``check.json`` + ``check.png``. Exit codes: 0 served matches offline, 1 served falls
short beyond the noise (the causes are named), 2 bad input (one line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

from draftsmith.eval import EvalError

__all__ = ["run_check", "cmd_check", "register", "check_sizes"]


def check_sizes(target_path: str, draft_dir: Path) -> None:
    """A draft built for another target (hidden size or vocab), from the two config.json files, before
    anything loads or a server starts: a one-line EvalError."""
    tcfg = json.loads((Path(target_path) / "config.json").read_text())
    tcfg = tcfg.get("text_config", tcfg)
    dcfg = json.loads((Path(draft_dir) / "config.json").read_text())
    th = dcfg.get("target_hidden_size") or dcfg.get("hidden_size")
    bad = []
    if th is not None and int(th) != int(tcfg["hidden_size"]):
        bad.append(f"target hidden size {th} (target_hidden_size) but the target's is {tcfg['hidden_size']}")
    if dcfg.get("vocab_size") is not None and int(dcfg["vocab_size"]) != int(tcfg["vocab_size"]):
        bad.append(f"vocab_size {dcfg['vocab_size']} but the target's is {tcfg['vocab_size']}")
    if bad:
        raise EvalError(f"--draft {draft_dir}: built for another target ({'; '.join(bad)}, {target_path}); pass "
                        "the target the draft was trained for")


def _log(progress: bool):
    return (lambda s: print(s, file=sys.stderr, flush=True)) if progress else None


def run_check(*, target: Optional[str], draft: str, prompts: str, k: Optional[int] = None, url: Optional[str] = None,
              limit: Optional[int] = None, max_tokens: int = 64, dtype: str = "float32",
              max_model_len: Optional[int] = None, alpha: float = 0.05, margin: float = 0.01,
              ignore_eos: bool = False, chat_template_kwargs: Optional[dict] = None, ready_s: float = 600.0,
              extra: tuple = (), out: Optional[Path] = None, progress: bool = True,
              transformers_backend: bool = False) -> dict:
    """Decode ``prompts`` served and offline and compare them -> the check report (see eval/check.py).
    ``transformers_backend``: start the server with vLLM's ``--model-impl transformers`` (serve/preflight.py)."""
    from draftsmith.eval.causes import (context_warning, d2t_cause, depth_warning, dtype_cause, explains,
                                        layer_cause, served_layer_ids, template_cause)
    from draftsmith.eval.check import (CHECK_ENV, OfflineDecoder, build_check_report, measure_served,
                                       served_facts, settled)
    from draftsmith.eval.offline import check_k, draft_meta, resolve_draft_dir, target_from_draft
    from draftsmith.eval.online import HttpClient
    from draftsmith.eval.prompts import describe_prompts, load_prompts
    from draftsmith.layout import find_run_config, training_max_length
    from draftsmith.models import resolve_target

    if (k is not None and k < 1) or max_tokens < 1 or not 0 < alpha < 1 or margin < 0:
        raise EvalError(f"-k {k} / --max-tokens {max_tokens} / --alpha {alpha} / --margin {margin}: k and max-tokens "
                        "must be >= 1, alpha in (0, 1), margin >= 0")
    log = _log(progress)
    items = load_prompts(prompts, limit=limit)  # a missing set: one line, exit 2, before anything starts
    draft_dir = resolve_draft_dir(draft)
    target = target or target_from_draft(draft_dir)
    if not target:
        raise EvalError(f"--target is required: {draft_dir} records no target in a meta.json")
    target_path = resolve_target(target)
    from draftsmith.targets.architecture import check_transformers

    check_transformers(target_path)  # the offline side loads the target with transformers
    check_sizes(target_path, draft_dir)
    client = HttpClient(retries=1, backoff_s=0.5, timeout_s=600.0)
    base, served_k = None, None
    if url:  # an unreachable or non-speculative server fails here, before the offline decode
        base = url.rstrip("/")
        facts = served_facts(client, base)
        served_k = facts["k"] or len(settled(client, base)["per_position"]) or None  # /server_info, else /metrics
        if k is not None and served_k is not None and k != served_k:
            raise EvalError(f"-k {k}: the server at {url} drafts {served_k} tokens per step (its /metrics); "
                            f"pass -k {served_k} or omit -k")
        k = k or served_k
    else:
        from draftsmith.serve.resolve import reject_unservable, resolve_draft
        from draftsmith.serve.vllm import VLLM_INSTALL_HINT, require_module

        reject_unservable(resolve_draft(draft).config, draft)
        require_module("vllm", VLLM_INSTALL_HINT)
        from draftsmith.serve.preflight import require_servable, serve_verdict

        # the target's architecture against the installed vLLM, before the offline decode and the server's start
        require_servable(serve_verdict(target_path, resolve_draft(draft).config,
                                       transformers_backend=transformers_backend, extra=extra))
    if log:
        log(describe_prompts(items, prompts))

    meta = draft_meta(draft_dir)
    kwargs = chat_template_kwargs if chat_template_kwargs is not None else (meta.get("chat_template_kwargs") or {})
    template = (find_run_config(draft_dir).get("data") or {}).get("chat_template")
    trained_len = training_max_length(draft_dir)
    decoder = OfflineDecoder(target_path, draft_dir, dtype=dtype, device="cpu")
    try:
        k = check_k(decoder.proposer, k, decoder.family.name)
        ids = decoder.render(items, kwargs, template)
        eos = [] if ignore_eos else decoder.eos_ids()
        longest = max(len(i) for i in ids) + max_tokens
        if not url:
            max_model_len = max_model_len or max(2048, longest)
            if longest > max_model_len:
                raise EvalError(f"--max-model-len {max_model_len}: the longest prompt + --max-tokens needs {longest}")
        if log:
            log(f"offline: {decoder.family.display} draft, K={k}, layers {decoder.aux_ids}, {dtype}")
        offline = decoder.decode(ids, k=k, max_new_tokens=max_tokens, eos_ids=eos)
        serve_kw = dict(k=k, max_tokens=max_tokens, ignore_eos=ignore_eos, log=log,
                        extra={"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else None)
        if url:
            facts = served_facts(client, base)
            served = measure_served(client, base, facts["model"], items, **serve_kw)
            launched = None
        else:
            from draftsmith.serve.process import ServerProcess, ServerStartError, free_port, sigterm_exits
            from draftsmith.serve.resolve import resolve_draft
            from draftsmith.serve.vllm import plan_vllm

            port = free_port()
            plan = plan_vllm(target_path, resolve_draft(draft), k=k, port=port, dtype=dtype,
                             max_model_len=max_model_len, extra=["--enforce-eager", "--seed", "0", *extra],
                             transformers_backend=transformers_backend)
            out_dir = Path(out or "runs/check")
            out_dir.mkdir(parents=True, exist_ok=True)
            env = {**CHECK_ENV, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
            if log:
                log(f"serving: {' '.join(plan.argv[2:])} (log {out_dir / 'serve.log'})")
            try:
                with sigterm_exits(), ServerProcess(plan.argv, port, out_dir / "serve.log", env=env, ready_s=ready_s,
                                                    stop_s=60) as srv:
                    facts = served_facts(client, srv.base)
                    served = measure_served(client, srv.base, facts["model"], items, **serve_kw)
            except ServerStartError as e:  # one line, as advise says it: the log has the engine's own words
                first = str(e).splitlines()[0][:200]
                raise EvalError(f"vLLM server did not start ({first}); see its log {out_dir / 'serve.log'}, or "
                                "allow more time with --ready-timeout") from None
            launched = {"argv": srv.argv, "speculative_config": plan.spec}  # srv's: its port if it moved
            facts.update(dtype=facts["dtype"] or dtype, k=k, max_model_len=facts["max_model_len"] or max_model_len,
                         draft_dir=facts["draft_dir"] or plan.prepared.path)
        config = {"target": str(target_path), "draft": str(draft_dir), "prompts": str(prompts), "k": k,
                  "url": url, "launched": launched, "max_tokens": max_tokens, "dtype": dtype,
                  "ignore_eos": ignore_eos, "aux_layer_ids": decoder.aux_ids, "chat_template_kwargs": kwargs,
                  "trained_max_length": trained_len, "served": facts}
        report = build_check_report(items, served, offline, k=k, offline_prompt_ids=ids, config=config, alpha=alpha,
                                    margin=margin)
        short = report["comparison"]["shortfall"]
        if log and short:
            log("served falls short of offline: testing the causes (offline reruns)")
        same_ids = all(r["same_prompt_ids"] is not False for r in report["records"])
        # reruns decode what the server was sent, so a template difference does not hide the others
        base_ids = ids if same_ids else [r["prompt_token_ids"] for r in served]

        def rerun(prompt_ids=None, **kw):
            variant = decoder.decode(prompt_ids or base_ids, k=k, max_new_tokens=max_tokens, eos_ids=eos, **kw)
            return explains(served, offline, variant, k, alpha=alpha, margin=margin)

        # The server's own prompt ids decoded offline: when that alone reproduces served, the template is the
        # cause and every other variation (decoded on the same ids) would "reproduce" it too, so none is tried
        base = rerun(base_ids) if short and not same_ids else None
        vary = short and not (base and base[0])

        def dtype_rerun(other: str):
            alt = OfflineDecoder(target_path, draft_dir, dtype=other, device="cpu")
            try:
                variant = alt.decode(base_ids, k=k, max_new_tokens=max_tokens, eos_ids=eos)
            finally:
                alt.close()
            return explains(served, offline, variant, k, alpha=alpha, margin=margin)

        renderings = {}
        if not same_ids:  # what the server may have done instead: no kwargs, the tokenizer's own template
            if kwargs:
                renderings["without the trained chat_template_kwargs"] = decoder.render(items, {}, template)
            if template is not None:
                renderings["with the tokenizer's own template (not data.chat_template)"] = \
                    decoder.render(items, kwargs, None)
        report["causes"] = [
            template_cause(served, ids, decoder.tokenizer, trained_kwargs=kwargs, renderings=renderings,
                           rerun=(lambda got: base) if base else None),
            layer_cause(decoder.aux_ids, served_layer_ids(facts.get("draft_dir")), num_layers=decoder.num_layers,
                        first=decoder.family.first_layer_id, rerun=(lambda aux: rerun(aux_ids=aux)) if vary else None),
            d2t_cause(decoder.draft, facts.get("draft_dir"), rerun=(lambda: rerun(lose_d2t=True)) if vary else None),
            dtype_cause(facts.get("dtype"), dtype, report["records"], rerun=dtype_rerun if vary else None),
        ]
        report["warnings"] = [w for w in (context_warning(facts.get("max_model_len"), trained_len, [len(i) for i in ids]),
                                          depth_warning(k, decoder.proposer)) if w] + decoder.notes
    finally:
        decoder.close()
    return report


def cmd_check(args: argparse.Namespace) -> int:
    from draftsmith.eval.check import format_check, write_check
    from draftsmith.eval.cli import template_kwargs_arg

    extra = list(args.extra or [])
    extra = extra[1:] if extra[:1] == ["--"] else extra
    if args.url and extra:
        raise EvalError(f"server arguments {extra} given with --url: check starts no server then; drop one")
    report = run_check(target=args.target, draft=args.draft, prompts=args.prompts, k=args.k, url=args.url,
                       limit=args.limit, max_tokens=args.max_tokens, dtype=args.dtype, max_model_len=args.max_model_len,
                       alpha=args.alpha, margin=args.margin, ignore_eos=args.ignore_eos,
                       chat_template_kwargs=template_kwargs_arg(args.chat_template_kwargs), ready_s=args.ready_timeout,
                       extra=tuple(extra), out=Path(args.out), progress=not args.quiet,
                       transformers_backend=args.transformers_backend)
    paths = write_check(report, Path(args.out), plot=not args.no_plot)
    print(format_check(report))
    print("report: " + "  ".join(str(p) for p in paths.values()))
    if report["verdict"] == "ok":
        return 0
    named = [c for c in report["causes"] if c["status"] in ("confirmed", "found")]
    short = [str(r["position"]) for r in report["comparison"]["positions"] if r["shortfall"]]
    t = report["comparison"]["tau"]
    why = ("; ".join(f"{c['cause']} ({c['status']})" for c in named) if named
           else "none of the tested causes (template, layer ids, d2t, dtype) explains it")
    print(f"draftsmith check: served acceptance falls short of offline beyond the sample's noise at position(s) "
          f"{', '.join(short)} (tau {t['served']:.3f} served vs {t['offline']:.3f} offline); likely cause: {why}",
          file=sys.stderr)
    return 1


def register(subparsers) -> None:
    """Add ``check`` to the ``draftsmith`` sub-command parser."""
    from draftsmith.serve.preflight import FLAG

    c = subparsers.add_parser("check", help="served vs offline acceptance side by side, per position, category and "
                                            "prompt length; names the cause when served falls short")
    c.add_argument("--target", default=None, help="HF checkpoint dir or `smollm2` (default: the checkpoint's target)")
    c.add_argument("--draft", required=True, metavar="CKPT", help="run dir, checkpoint dir or exported draft dir")
    c.add_argument("--prompts", required=True, metavar="SET|FILE",
                   help="a shipped set (mt_bench, gsm8k, humaneval, mixed) or a JSONL of prompts (first turn)")
    c.add_argument("-k", dest="k", type=int, default=None,
                   help="K drafted tokens per step (default: the family's serving K; with --url the server's)")
    c.add_argument("--url", default=None, help="a running vLLM server with this draft (default: start one)")
    c.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N prompts")
    c.add_argument("--max-tokens", type=int, default=64, help="tokens per answer on both sides (default 64)")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype of the offline target and of a server check starts (default float32: token-exact)")
    c.add_argument("--max-model-len", type=int, default=None, help="--max-model-len of a server check starts")
    c.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate of the shortfall test")
    c.add_argument("--margin", type=float, default=0.01,
                   help="acceptance gap (absolute) below which a difference is not a finding (default 0.01)")
    c.add_argument("--ignore-eos", action="store_true", help="always generate --max-tokens tokens")
    c.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help="template kwargs for both sides (default: offline renders with the checkpoint's, the "
                        "server with its own defaults)")
    c.add_argument("--ready-timeout", type=float, default=600.0, help="seconds to wait for a started server")
    c.add_argument(FLAG, dest="transformers_backend", action="store_true",
                   help="start the server with vLLM's --model-impl transformers (its Transformers backend: a target "
                        "whose vLLM class lacks EAGLE-3 support, Gemma 3, Mixtral, ...)")
    c.add_argument("--out", default="runs/check", help="directory for check.json, check.png, serve.log")
    c.add_argument("--no-plot", action="store_true", help="skip check.png")
    c.add_argument("--quiet", action="store_true", help="no per-prompt progress lines")
    c.add_argument("extra", nargs=argparse.REMAINDER, help="after --: passed to the server check starts")
    c.set_defaults(func=cmd_check)
