"""`draftsmith serve-target`: the subcommand that runs a target for remote trainers."""

from __future__ import annotations

import argparse


def cmd_serve_target(args: argparse.Namespace) -> int:
    from draftsmith.remote.server import run

    return run(args)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """serve-target options (shared by the CLI and `python -m draftsmith.remote.server`)."""
    p.add_argument("--target", required=True, help="HF checkpoint dir or `smollm2`")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "sglang", "cache"],
                   help="how the target runs here (cache: serve an offline feature cache, see --cache-dir)")
    p.add_argument("--cache-dir", default=None, help="with --engine cache: the DIR `draftsmith cache` wrote")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto",
                   help="where the hf engine runs the target: auto (cuda when present, else cpu), cpu, cuda, "
                        "cuda:N (vllm and sglang place the target themselves)")
    p.add_argument("--aux-layer-ids", type=int, nargs="+", default=None, help="default layer ids (vLLM convention)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=8001, help="0 picks a free port (printed on the READY line)")
    p.add_argument("--auth-token-file", default=None, help="file holding the bearer token clients must send")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback bind without a token")
    p.add_argument("--max-body-mb", type=int, default=1024, help="largest request body accepted")
    p.add_argument("--num-threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--data-plane-timeout-s", type=float, default=120.0,
                   help="how long a data-plane handshake waits for its client, and each channel transfer")


def register(subparsers) -> None:
    """Add `serve-target` to the `draftsmith` subcommands (errors are ServeTargetError, a TargetError)."""
    p = subparsers.add_parser(
        "serve-target",
        help="serve the target's features over HTTP for trainers using target.engine: remote",
        description="Run the target (hf, vllm or sglang engine) and serve /health, /info, /embeddings, "
                    "/vocab-map, /features, /disconnect. Prints `READY host:port` when it accepts requests.",
    )
    add_arguments(p)
    p.set_defaults(func=cmd_serve_target)
