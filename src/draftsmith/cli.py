"""The ``draftsmith`` command line. Each handler is a thin adapter that imports lazily, so
``draftsmith --help`` starts instantly and never imports torch-heavy engines."""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

EXIT_BAD_INPUT = 2
# --device of the commands that place a co-located hf target (cache, regenerate, eval, serve-target);
# checked as train.device is (draftsmith.distributed.resolve_device), before the target loads
DEVICE_HELP = ("where the hf engine runs the target: auto (the local rank's GPU when there is one, else cpu), "
               "cpu, cuda, cuda:N")


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors that mean bad input (config, data, checkpoint, target): one line, exit 2."""
    from draftsmith.config import ConfigError
    from draftsmith.data.formats import DataError
    from draftsmith.distributed import DistError
    from draftsmith.drafts import DraftError
    from draftsmith.eval import EvalError
    from draftsmith.serve.resolve import ServeError
    from draftsmith.targets.contract import TargetError
    from draftsmith.train.checkpoint import CheckpointError

    return (ConfigError, DataError, DraftError, TargetError, CheckpointError, EvalError, ServeError, DistError)


def exec_torchrun(nproc: int, argv: Sequence[str]) -> int:
    """``draftsmith train --nproc N ...`` = ``torchrun --nproc-per-node N -m draftsmith train ...``:
    this process becomes torchrun (torch's own launcher), which starts N ranks of the same command."""
    import os

    if nproc < 1:
        print(f"draftsmith: error: --nproc {nproc}: expected >= 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    if os.environ.get("WORLD_SIZE"):  # already a rank of a torchrun job: do not nest another
        print("draftsmith: error: --nproc inside a torchrun job; drop --nproc (torchrun sets the ranks)", file=sys.stderr)
        return EXIT_BAD_INPUT
    rest, skip = [], False
    for a in argv:  # drop --nproc N / --nproc=N, keep everything else in order
        if skip:
            skip = False
        elif a == "--nproc":
            skip = True
        elif not a.startswith("--nproc="):
            rest.append(a)
    # --standalone: a local rendezvous on a free port (several jobs on one machine do not collide)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "draftsmith", *rest]
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached


def cmd_train(args: argparse.Namespace) -> int:
    from draftsmith.config import load_config
    from draftsmith.train.loop import train

    if args.nproc is not None:
        return exec_torchrun(args.nproc, args.argv)

    cfg = load_config(args.config, args.set + ([f"target.engine={args.engine}"] if args.engine else []))
    from draftsmith.distributed import ranks_from_env
    from draftsmith.recipe import read_recipe

    mapping = read_recipe(args.config) if args.config else None  # an AutoModel recipe: say how it was read
    if mapping is not None and ranks_from_env().main:
        print(mapping.text())
    result = train(cfg, resume=args.resume, progress=not args.no_progress, announce=print)
    if not ranks_from_env().main:  # rank 0 reports for the whole job
        return 0
    ev = result.eval
    print(f"trained {result.step} steps ({result.tokens} tokens, {result.tokens_per_s:.0f} tok/s, {result.wall_s:.0f} s)")
    if ev:
        from draftsmith.drafts import get_family

        cov = ev.get("draft_vocab_coverage")  # share of held-out loss tokens the draft vocab holds
        print(f"held-out: loss {ev['loss']:.4f}  {get_family(cfg.draft.type).describe(ev)}"
              + (f"  draft-vocab coverage {cov:.3f}" if cov is not None else ""))
    print(f"checkpoint: {result.checkpoint}")
    if result.best is not None:  # train.keep_best / early_stop_patience
        print(result.best.line())
    return 0


def cmd_cache(args: argparse.Namespace) -> int:
    from draftsmith import ranked
    from draftsmith.cache.build import build_cache
    from draftsmith.config import load_config
    from draftsmith.distributed import ranks_from_env, shutdown

    cfg = load_config(args.config, args.set)
    ranks = ranks_from_env()
    ranked.start(ranks)  # under torchrun the ranks split the shards; nothing for one process
    try:
        with quiet_engines(args.out, ranks.main):
            build_cache(cfg, args.out, args.engine, batch_size=args.batch_size, shard_rows=args.shard_rows,
                        progress=not args.no_progress, device=args.device)
    finally:
        shutdown()
    if ranks.main:
        print(f"train from it with: --set target.engine=cache --set target.cache_dir={args.out}")
    return 0


def quiet_engines(out_dir: str, main: bool):
    """What the engines print goes to ``out_dir/engine.log`` (``engine.rank<r>.log`` on other ranks),
    the path said once; the command's own lines and bar stay on the terminal (:mod:`draftsmith.console`)."""
    from pathlib import Path

    from draftsmith import console

    path = Path(out_dir) / console.engine_log_name()
    if main:
        print(f"engine logs (vLLM, transformers, warnings): {path}", flush=True)
    return console.engine_logs(path)


def cmd_demo(args: argparse.Namespace) -> int:
    from draftsmith.train.demo import run_demo

    run_demo(minutes=args.minutes, output=args.output, rows=args.rows, progress=not args.no_progress,
             check=not args.no_check)
    return 0


def cmd_regenerate(args: argparse.Namespace) -> int:
    import importlib.util
    import json

    from draftsmith import ranked
    from draftsmith.data.regenerate import RegenError, RegenSettings, regenerate
    from draftsmith.distributed import ranks_from_env, shutdown

    engine = args.engine or ("url" if args.url else "vllm" if importlib.util.find_spec("vllm") else "hf")
    try:
        kwargs = json.loads(args.chat_template_kwargs) if args.chat_template_kwargs else {}
    except ValueError as e:
        raise RegenError(f"--chat-template-kwargs {args.chat_template_kwargs!r}: not JSON ({e}); "
                         'e.g. \'{"enable_thinking": false}\'') from None
    settings = RegenSettings(engine=engine, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                             top_p=args.top_p, seed=args.seed, chat_template_kwargs=kwargs, system=args.system,
                             max_turns=args.max_turns, max_rows=args.max_rows, shard_size=args.shard_size,
                             max_prompt_tokens=args.max_prompt_tokens)
    ranks = ranks_from_env()
    ranked.start(ranks)  # under torchrun the ranks split the shards; nothing for one process
    try:
        with quiet_engines(args.out, ranks.main):
            r = regenerate(args.data, args.out, args.target, settings, url=args.url, model=args.model,
                           concurrency=args.concurrency, dtype=args.dtype, progress=not args.no_progress,
                           device=args.device)
    finally:
        shutdown()
    if not ranks.main:
        return 0  # rank 0 prints the summary
    c = r.manifest["counts"]
    print(f"regenerated {c['conversations']} conversations ({c['assistant_turns']} assistant turns) in {r.shards} "
          f"shard(s), {r.shards_done_before} reused; {r.new_tokens} new tokens in {r.wall_s:.0f} s "
          f"({r.new_tokens / max(r.wall_s, 1e-9):.0f} tok/s)")
    if set(c.get("categories", {})) - {"uncategorized"}:  # a built-in corpus or builtin:mix: what the dir holds
        print("categories: " + ", ".join(f"{k} {v}" for k, v in c["categories"].items()))
    print(f"output: {r.out} (use it as data.sources: [{r.out}])")
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

    t = sub.add_parser("train", help="train a draft from a YAML run config (or a NeMo AutoModel recipe as it is)")
    t.add_argument("config", nargs="?", default=None, help="YAML run config (see examples/) or an AutoModel EAGLE-3 / "
                                                          "P-EAGLE / DFlash-family recipe; defaults apply when omitted")
    t.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    t.add_argument("--resume", nargs="?", const="__output__", default=None, metavar="CKPT",
                   help="resume from CKPT (a checkpoint dir or run dir); bare --resume uses LATEST under output.dir")
    t.add_argument("--engine", choices=CHOICES["target.engine"], default=None,
                   help="how the target runs (overrides target.engine)")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--nproc", type=int, default=None, metavar="N",
                   help="run N ranks on this machine: execs `torchrun --nproc-per-node N -m draftsmith train ...` "
                        "(train.batch_size is per rank; multi-node: call torchrun yourself, see docs/guides/distributed.md)")
    t.set_defaults(func=cmd_train)

    c = sub.add_parser("cache", help="run the target once over a config's data and store its features "
                                     "(train many epochs from them with target.engine: cache)")
    c.add_argument("config", help="YAML run config (the one you will train with)")
    c.add_argument("--out", required=True, metavar="DIR", help="cache directory (rerun with the same DIR to resume)")
    c.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config value (repeatable)")
    c.add_argument("--engine", choices=["hf", "vllm", "sglang"], default=None,
                   help="engine that runs the target (default target.engine; hf when that is cache)")
    c.add_argument("--device", default=None, help=DEVICE_HELP + " (default train.device)")
    c.add_argument("--batch-size", type=int, default=None, help="rows per target forward (default train.batch_size)")
    c.add_argument("--shard-rows", type=int, default=256, help="rows per shard file (default 256)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_cache)

    d = sub.add_parser("demo", help="train an EAGLE-3 draft for the embedded SmolLM2 target on its own answers to "
                                    "ShareGPT prompts, from a feature cache, and check it on vLLM")
    d.add_argument("--minutes", type=float, default=14.0,
                   help="budget for training, eval and the vLLM check (default 14); the first run adds the one-time "
                        "regeneration and feature cache (~6 min)")
    d.add_argument("--output", default="runs/demo", help="output directory (default runs/demo)")
    d.add_argument("--rows", type=int, default=320, help="ShareGPT prompts the target answers (default 320)")
    d.add_argument("--no-check", action="store_true", help="skip the real check on vLLM at the end")
    d.add_argument("--no-progress", action="store_true", help="no progress bars")
    d.set_defaults(func=cmd_demo)

    r = sub.add_parser("regenerate", help="replace every assistant turn of the data with the target's own answer",
                       description="Answer every user turn with the target, turn by turn (turn n sees the "
                                   "regenerated turns before it). Writes shard-NNNNNN.jsonl + manifest.json; "
                                   "rerunning the same command resumes.")
    r.add_argument("--target", default="smollm2", help="HF checkpoint dir, hub id org/name (local HF cache) or `smollm2` (default)")
    r.add_argument("--data", nargs="+", required=True, metavar="SOURCE", help="data sources, as data.sources takes them")
    r.add_argument("--out", required=True, help="output dir (rerun the same command to resume)")
    r.add_argument("--engine", choices=["vllm", "hf", "url"], default=None,
                   help="vllm (default where installed), hf (slow), url (an OpenAI-compatible server; implied by --url)")
    r.add_argument("--url", default=None, help="base URL of a running OpenAI-compatible server")
    r.add_argument("--model", default=None, help="model name for --url (default: the server's first model)")
    r.add_argument("--concurrency", type=int, default=32, help="requests in flight with --url (default 32)")
    r.add_argument("--max-new-tokens", type=int, default=1024, help="tokens per regenerated answer at most (default 1024)")
    r.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    r.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling with --temperature > 0 (default 1.0: off)")
    r.add_argument("--seed", type=int, default=0, help="sampling seed and --max-rows subset seed")
    r.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                   help='e.g. \'{"enable_thinking": false}\'; kept in the manifest and used by train, eval and serve')
    r.add_argument("--system", choices=["keep", "drop"], default="keep", help="the conversations' system prompts")
    r.add_argument("--max-turns", type=int, default=None, help="answer at most N user turns per conversation")
    r.add_argument("--max-rows", type=int, default=None, help="seeded random subset of the conversations")
    r.add_argument("--shard-size", type=int, default=1000, help="conversations per shard (default 1000)")
    r.add_argument("--max-prompt-tokens", type=int, default=3072,
                   help="a turn whose prompt is longer ends its conversation (default 3072)")
    r.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"],
                   help="dtype the vllm/hf engine runs the target in (default bfloat16)")
    r.add_argument("--device", default="auto", help=DEVICE_HELP + " (--engine hf; vllm places the target itself)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.set_defaults(func=cmd_regenerate)

    g = sub.add_parser("target", help="materialise a built-in target and print its path (e.g. `smollm2`)")
    g.add_argument("name", help="the built-in target: smollm2")
    g.set_defaults(func=cmd_target)

    from draftsmith.eval.advise_cli import register as register_advise
    from draftsmith.eval.cli import register as register_eval
    from draftsmith.remote.cli import register as register_remote
    from draftsmith.serve.cli import register as register_serve

    from draftsmith.recipe import register as register_recipe

    register_recipe(sub)
    register_eval(sub)
    register_advise(sub)
    register_serve(sub)
    register_remote(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    code = run_command(argv)
    dist = sys.modules.get("draftsmith.distributed")  # imported by every command that joins a process group
    if dist is not None and dist.left_hanging():
        # its group is stuck in torch's teardown (distributed.shutdown): end now, the outputs are written
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run_command(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # train --nproc re-launches the same command under torchrun
    try:
        if getattr(args, "resume", None) == "__output__":
            from draftsmith.config import load_config

            args.resume = load_config(args.config, args.set).output.dir  # --engine does not move output.dir
        return int(args.func(args) or 0)
    except _user_errors() as e:
        import os

        rank = os.environ.get("RANK") if os.environ.get("WORLD_SIZE", "1") != "1" else None
        print(f"draftsmith: error{f' (rank {rank})' if rank else ''}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("draftsmith: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
