"""The ``draftsmith`` command line. Each handler is a thin adapter that imports lazily, so
``draftsmith --help`` starts instantly and never imports torch-heavy engines."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

EXIT_BAD_INPUT = 2


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input (config, data, checkpoint, target): one line, exit 2."""
    from draftsmith.config import ConfigError
    from draftsmith.data.formats import DataError
    from draftsmith.drafts import DraftError
    from draftsmith.eval import EvalError
    from draftsmith.serve.resolve import ServeError
    from draftsmith.targets.contract import TargetError
    from draftsmith.train.checkpoint import CheckpointError

    return (ConfigError, DataError, DraftError, TargetError, CheckpointError, EvalError, ServeError)


def cmd_train(args: argparse.Namespace) -> int:
    from draftsmith.config import load_config
    from draftsmith.train.loop import train

    cfg = load_config(args.config, args.set + ([f"target.engine={args.engine}"] if args.engine else []))
    result = train(cfg, resume=args.resume, progress=not args.no_progress, announce=print)
    ev = result.eval
    print(f"trained {result.step} steps ({result.tokens} tokens, {result.tokens_per_s:.0f} tok/s, {result.wall_s:.0f} s)")
    if ev:
        from draftsmith.drafts import get_family

        print(f"held-out: loss {ev['loss']:.4f}  {get_family(cfg.draft.type).describe(ev)}")
    print(f"checkpoint: {result.checkpoint}")
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from draftsmith.cache.build import build_cache
    from draftsmith.config import load_config

    cfg = load_config(args.config, args.set)
    build_cache(cfg, args.out, args.engine, batch_size=args.batch_size, shard_rows=args.shard_rows,
                progress=not args.no_progress)
    print(f"train from it with: --set target.engine=cache --set target.cache_dir={args.out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from draftsmith.train.demo import run_demo

    run_demo(minutes=args.minutes, output=args.output, max_rows=args.max_rows, progress=not args.no_progress)
    return 0


def cmd_target(args: argparse.Namespace) -> int:
    from draftsmith.models import resolve_target

    print(resolve_target(args.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from draftsmith import __version__
    from draftsmith.config import CHOICES  # --engine accepts exactly what target.engine does

    p = argparse.ArgumentParser(prog="draftsmith", description="Train speculative-decoding drafts and serve them.")
    p.add_argument("--version", action="version", version=f"draftsmith {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train a draft from a YAML run config")
    t.add_argument("config", nargs="?", default=None, help="YAML run config (see examples/); defaults apply when omitted")
    t.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    t.add_argument("--resume", nargs="?", const="__output__", default=None, metavar="CKPT",
                   help="resume from CKPT (a checkpoint dir or run dir); bare --resume uses LATEST under output.dir")
    t.add_argument("--engine", choices=CHOICES["target.engine"], default=None,
                   help="how the target runs (overrides target.engine)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("cache", help="run the target once over a config's data and store its features "
                                     "(train many epochs from them with target.engine: cache)")
    c.add_argument("config", help="YAML run config (the one you will train with)")
    c.add_argument("--out", required=True, metavar="DIR", help="cache directory (rerun with the same DIR to resume)")
    c.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    c.add_argument("--engine", choices=["hf", "vllm", "sglang"], default=None,
                   help="engine that runs the target (default target.engine; hf when that is cache)")
    c.add_argument("--batch-size", type=int, default=None, help="rows per target forward (default train.batch_size)")
    c.add_argument("--shard-rows", type=int, default=256, help="rows per shard file (default 256)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_cache)

    d = sub.add_parser("demo", help="train an EAGLE-3 draft for the embedded SmolLM2 target on ShareGPT prompts")
    d.add_argument("--minutes", type=float, default=15.0, help="wall-clock budget for the whole demo (default 15)")
    d.add_argument("--output", default="runs/demo", help="output directory (default runs/demo)")
    d.add_argument("--max-rows", type=int, default=4000, help="ShareGPT conversations to sample (default 4000)")
    d.add_argument("--no-progress", action="store_true")
    d.set_defaults(func=cmd_demo)

    g = sub.add_parser("target", help="materialise a built-in target and print its path (e.g. `smollm2`)")
    g.add_argument("name")
    g.set_defaults(func=cmd_target)

    from draftsmith.eval.cli import register as register_eval
    from draftsmith.remote.cli import register as register_remote
    from draftsmith.serve.cli import register as register_serve

    register_eval(sub)
    register_serve(sub)
    register_remote(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "resume", None) == "__output__":
            from draftsmith.config import load_config

            args.resume = load_config(args.config, args.set).output.dir  # --engine does not move output.dir
        return int(args.func(args) or 0)
    except _user_errors() as e:
        print(f"draftsmith: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
