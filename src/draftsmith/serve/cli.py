"""CLI for serving: ``serve vllm``, ``serve sglang``, ``export``, ``doctor``.

``register(subparsers)`` adds the subcommands to the ``draftsmith`` parser. Handlers return an exit
code: 0 ok, 1 ``doctor`` found problems, 2 bad input or a missing engine/library (one line on stderr
with the fix), otherwise the server's own exit code. ``python -m draftsmith.serve.cli ...`` runs them
standalone.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path
from typing import Optional, Sequence

EXIT_BAD_INPUT = 2


def _fail(e: Exception) -> int:
    print(f"draftsmith: error: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _target(spec: str, dry_run: bool) -> str:
    """``smollm2`` -> its materialised path (not materialised by a dry run); anything else untouched.

    A hub id ``org/name`` stays an id (the engine serves it under that name) but is checked against the
    local HF cache first, and fetched there when missing and the network is on: with HF_HUB_OFFLINE set, a
    missing id is one line naming the ``hf download`` command, not an engine traceback minutes later.
    """
    if spec != "smollm2":
        from draftsmith import hub

        if not dry_run and hub.is_hub_id(spec):
            from .resolve import ServeError

            try:
                hub.model_dir(spec)
            except hub.HubError as e:
                raise ServeError(f"--target: {e}") from None
        return spec
    from draftsmith.models import SMOLLM2_NAME, default_cache_dir, resolve_target

    return str(default_cache_dir() / SMOLLM2_NAME) if dry_run else resolve_target(spec)


def _extra(args: argparse.Namespace) -> list[str]:
    extra = list(getattr(args, "extra", None) or [])
    return extra[1:] if extra[:1] == ["--"] else extra


def _add_flags(parser: argparse.ArgumentParser) -> None:
    """The serve flags the registered families declare (drafts: ``Family.serve_flags``)."""
    from draftsmith.drafts import serve_flags

    for f in serve_flags():
        parser.add_argument(f.flag, dest=f.dest, action="store_true", help=f.help)


def _flags(args: argparse.Namespace) -> dict:
    """{dest: value} of every family's serve flag, for vllm_config through plan_vllm / export_draft."""
    from draftsmith.drafts import serve_flags

    return {f.dest: getattr(args, f.dest, False) for f in serve_flags()}


def cmd_serve_vllm(args: argparse.Namespace) -> int:
    from .resolve import ServeError, reject_unservable, resolve_draft
    from .vllm import VLLM_INSTALL_HINT, launch, plan_vllm, require_module

    try:
        draft = resolve_draft(args.draft)  # reads only
        reject_unservable(draft.config, args.draft)  # no engine serves it: say so before asking to install one
        if not args.print_only:
            require_module("vllm", VLLM_INSTALL_HINT)  # before writing anything
        plan = plan_vllm(_target(args.target, args.print_only), draft, method=args.method,
                         k=args.num_speculative_tokens, dry_run=args.print_only, **_flags(args),
                         export_dir=Path(args.export_dir) if args.export_dir else None, host=args.host,
                         port=args.port, dtype=args.dtype, max_model_len=args.max_model_len, extra=_extra(args),
                         transformers_backend=args.transformers_backend)
    except ServeError as e:
        return _fail(e)
    for note in plan.notes:
        print(f"draftsmith: {note}", file=sys.stderr)
    if args.print_only:
        print(plan.command())
        return 0
    print("draftsmith: " + plan.command(), file=sys.stderr, flush=True)
    return launch(plan.argv, env={**os.environ, **plan.env})


def cmd_serve_sglang(args: argparse.Namespace) -> int:
    from .resolve import ServeError, check_family_weights, resolve_draft, servable_config
    from .sglang import SGLANG_INSTALL_HINT, prepare_sglang, reject_for_sglang, sglang_argv
    from .vllm import launch, require_module

    try:
        draft = resolve_draft(args.draft)  # reads only
        if not draft.is_hub:  # weights that contradict config.json are named first (the config is then no guide)
            check_family_weights(draft)
        reject_for_sglang(draft.config, args.draft)  # a draft SGLang cannot serve fails before the install hint
        fam = draft.described
        own = fam.sglang_algorithm is not None  # served with an algorithm of its own (DFlash's DFLASH)
        if not args.print_only:
            require_module("sglang", SGLANG_INSTALL_HINT + (f"; {fam.display} drafts need {fam.sglang_release}"
                                                            if own and fam.sglang_release else ""))
        target = _target(args.target, args.print_only)
        export_dir = Path(args.export_dir) if args.export_dir else None
        if own:  # the layout vLLM loads (DFlash's z-lab layout), which SGLang's algorithm loads too
            from .sglang_algorithm import sglang_algorithm_argv
            from .vllm import prepare_vllm, vllm_config

            prepared = prepare_vllm(draft, dry_run=args.print_only, export_dir=export_dir)
            k = args.num_steps if args.num_steps is not None else (
                args.num_draft_tokens - 1 if args.num_draft_tokens is not None else None)
            served = vllm_config(servable_config(draft)[0])
            argv = sglang_algorithm_argv(target, prepared.path, served, k=k, host=args.host, port=args.port,
                                         dtype=args.dtype, context_length=args.context_length, extra=_extra(args))
        else:
            prepared, token_map = prepare_sglang(draft, dry_run=args.print_only, export_dir=export_dir)
            served = draft.config
            argv = sglang_argv(target, prepared.path, num_steps=3 if args.num_steps is None else args.num_steps,
                               topk=args.eagle_topk, num_draft_tokens=args.num_draft_tokens, token_map=token_map,
                               host=args.host, port=args.port, dtype=args.dtype, context_length=args.context_length,
                               extra=_extra(args))
    except ServeError as e:
        return _fail(e)
    from .limits import context_warnings, k_warnings

    k = 3 if args.num_steps is None else args.num_steps  # a chain's K (block drafts: bounded, no warning)
    notes = [*k_warnings(served, k), *context_warnings(draft, target, args.context_length, "--context-length")]
    print(f"draftsmith: {prepared.describe(args.print_only)}", file=sys.stderr)
    for note in prepared.fixups:
        print(f"draftsmith: fixup: {note}", file=sys.stderr)
    for note in notes:
        print(f"draftsmith: {note}", file=sys.stderr)
    if args.print_only:
        print(shlex.join(argv))
        return 0
    print("draftsmith: " + shlex.join(argv), file=sys.stderr, flush=True)
    return launch(argv)


def cmd_export(args: argparse.Namespace) -> int:
    from .export import export_draft
    from .resolve import ServeError, reject_unservable, resolve_draft, servable_config

    try:
        draft = resolve_draft(args.ckpt)
        reject_unservable(draft.config, args.ckpt)  # named with the user's path, before anything is written
        fixups = [] if draft.is_hub else servable_config(draft)[1]
        out = export_draft(args.ckpt, args.out, to=args.to, target=args.target,
                           num_speculative_tokens=args.num_speculative_tokens, **_flags(args))
    except ServeError as e:
        return _fail(e)
    for note in fixups:
        print(f"draftsmith: fixup: {note}", file=sys.stderr)
    print(out)
    if args.to == "speculators":
        print(f"serve it with: vllm serve {shlex.quote(str(out))}", file=sys.stderr)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import diagnose
    from .resolve import ServeError, resolve_draft

    try:
        problems, notes = diagnose(resolve_draft(args.ckpt), target=args.target, engine=args.engine, k=args.k,
                                   max_model_len=args.max_model_len, transformers_backend=args.transformers_backend)
    except (ServeError, OSError, KeyError) as e:
        return _fail(e if isinstance(e, ServeError) else ServeError(f"doctor: cannot read the target or draft ({e})"))
    for n in notes:
        print(f"draftsmith doctor: {n}", file=sys.stderr)
    for p in problems:
        print(f"PROBLEM {p}")
    print(f"draftsmith doctor: {'clean' if not problems else f'{len(problems)} problem(s)'} for {args.engine}",
          file=sys.stderr)
    return 0 if not problems else 1


def _common_serve(p: argparse.ArgumentParser, port: int) -> None:
    p.add_argument("--target", required=True, help="target model dir, hub id, or `smollm2`")
    p.add_argument("--draft", required=True,
                   help="epoch_* dir, its model/ or model/consolidated/, consolidated/, a HF dir, or a hub id")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=port, help=f"port the server listens on (default {port})")
    p.add_argument("--dtype", default=None, help="e.g. float32 (CPU), bfloat16; default: the engine's auto")
    p.add_argument("--export-dir", default=None, help="where the engine-ready copy goes (default <draft>/<engine>_export)")
    p.add_argument("--print-only", action="store_true", help="print the exact command and write nothing")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="after --: passed to the server unchanged")


def _own_methods() -> str:
    """"eagle3 for EAGLE-3, ..." from the registry (the --method help)."""
    from draftsmith.drafts import FAMILIES

    return ", ".join(f"{f.vllm_method} for {f.short}" for f in FAMILIES.values() if f.vllm_method)


def register(subparsers) -> None:
    """Add ``serve`` (``vllm``/``sglang``), ``export`` and ``doctor`` to a ``add_subparsers()`` object."""
    from draftsmith.drafts import vllm_methods

    from .preflight import FLAG, FLAG_HELP

    s = subparsers.add_parser("serve", help="serve a trained draft with vLLM or SGLang")
    engines = s.add_subparsers(dest="engine", required=True, metavar="ENGINE")
    v = engines.add_parser("vllm", help="python -m vllm.entrypoints.openai.api_server with the draft")
    _common_serve(v, 8000)
    v.add_argument("-k", "--num-speculative-tokens", dest="num_speculative_tokens", type=int, default=None,
                   help="K (default: block_size-1 for DFlash, num_depths for P-EAGLE; required for EAGLE-3)")
    v.add_argument("--method", default=None, choices=vllm_methods(),
                   help="speculative method (default: the draft family's own: " + _own_methods() + ")")
    _add_flags(v)
    v.add_argument("--max-model-len", type=int, default=None, help="vLLM's --max-model-len (default: the target's)")
    v.add_argument(FLAG, dest="transformers_backend", action="store_true", help=FLAG_HELP)
    v.set_defaults(func=cmd_serve_vllm)

    g = engines.add_parser("sglang", help="python -m sglang.launch_server with the draft (EAGLE-3; DFlash where the "
                                          "installed SGLang has DFLASH)")
    _common_serve(g, 30000)
    g.add_argument("--num-steps", type=int, default=None,
                   help="K: --speculative-num-steps of an EAGLE-3 chain (default 3); a DFlash draft's K, at most "
                        "block_size - 1 (default block_size - 1)")
    g.add_argument("--eagle-topk", type=int, default=1, help="--speculative-eagle-topk (default 1: a chain)")
    g.add_argument("--num-draft-tokens", type=int, default=None,
                   help="--speculative-num-draft-tokens (default num_steps + 1 for topk 1)")
    g.add_argument("--context-length", type=int, default=None, help="SGLang's --context-length (default: the target's)")
    g.set_defaults(func=cmd_serve_sglang)

    e = subparsers.add_parser("export", help="write a standalone engine-ready copy of a draft")
    e.add_argument("--to", required=True, choices=["vllm", "sglang", "speculators"],
                   help="the layout: vllm, sglang, or speculators (a self-contained `vllm serve OUT` directory)")
    e.add_argument("ckpt", help="the draft: a run dir, epoch_* dir, model/consolidated/ or a HF draft dir")
    e.add_argument("out", help="directory to write (replaced atomically)")
    e.add_argument("--target", default=None, help="the target recorded in a speculators export (required there)")
    e.add_argument("--num-speculative-tokens", type=int, default=None, help="K recorded in a speculators export")
    _add_flags(e)
    e.set_defaults(func=cmd_export)

    d = subparsers.add_parser("doctor", help="check a draft for problems that break serving")
    d.add_argument("ckpt", help="the draft: a run dir, epoch_* dir, model/consolidated/, a HF draft dir or a hub id")
    d.add_argument("--target", default=None, help="target dir or `smollm2` (default: the checkpoint's meta.json)")
    d.add_argument("--engine", default="vllm", choices=["vllm", "sglang"], help="the engine it will be served on (default vllm)")
    d.add_argument("-k", "--num-speculative-tokens", dest="k", type=int, default=None,
                   help="the K it will be served with: past what the draft drafts is a problem, past its trained "
                        "depth a warning")
    d.add_argument("--max-model-len", type=int, default=None,
                   help="the serving context: longer than the draft's training max_length is a warning")
    d.add_argument(FLAG, dest="transformers_backend", action="store_true",
                   help="the draft will be served with serve vllm --transformers-backend (vLLM's --model-impl "
                        "transformers): check the target's architecture for that")
    d.set_defaults(func=cmd_doctor)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="draftsmith")
    register(p.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = p.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
