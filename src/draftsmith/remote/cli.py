"""`draftsmith serve-target`: the subcommand that runs a target for remote trainers."""

from __future__ import annotations

import argparse
import json


def cmd_serve_target(args: argparse.Namespace) -> int:
    from draftsmith.remote.server import run

    return run(args)


def engine_options(args: argparse.Namespace) -> dict:
    """The :func:`draftsmith.targets.open_engine` keywords the engine flags ask for, checked before any
    target loads: ``cache_dir`` (cache engine), ``device_map`` (hf), ``engine_kwargs`` with ``--tp-size``
    folded in (vllm, sglang).

    Raises :class:`~draftsmith.remote.server.ServeTargetError` naming the flag, the value and the fix.
    """
    from draftsmith.remote.server import ServeTargetError
    from draftsmith.targets import TP_KWARG, tp_engine_kwargs

    engine, tp, raw = args.engine, getattr(args, "tp_size", None), getattr(args, "engine_kwargs", None)
    device_map = getattr(args, "device_map", None)
    if (engine == "cache") != bool(getattr(args, "cache_dir", None)):
        raise ServeTargetError("--cache-dir is required with --engine cache and used only with it; "
                               "pass both (a DIR built by `draftsmith cache`) or neither")
    if device_map is not None and engine != "hf":
        raise ServeTargetError(f"--device-map with --engine {engine}: only the hf engine spreads the target over "
                               f"GPUs this way; drop --device-map (vllm/sglang shard it with --tp-size)")
    if device_map is not None:
        from draftsmith.targets.hf import check_device_map

        check_device_map(device_map)  # no GPU / no accelerate: one line now, before the target loads
    if tp is not None and tp < 1:
        raise ServeTargetError(f"--tp-size {tp}: expected an integer >= 1 (GPUs vllm/sglang shard the target over)")
    kwargs = None
    if raw is not None:
        try:
            kwargs = json.loads(raw)
        except ValueError:
            kwargs = None
        if not isinstance(kwargs, dict):
            raise ServeTargetError(f"--engine-kwargs {raw!r}: not a JSON object; pass one such as "
                                   "'{\"gpu_memory_utilization\": 0.8}' (quote it for the shell)")
    if engine not in TP_KWARG:
        given = [f for f, v in (("--tp-size", tp), ("--engine-kwargs", raw)) if v is not None]
        if given:  # the hf engine has no tensor parallelism of its own: it runs on the one --device
            how = ("the hf engine runs the target on one device (choose it with --device)" if engine == "hf"
                   else "the cache engine serves stored features and opens no target")
            raise ServeTargetError(f"{given[0]} with --engine {engine}: {how}; drop {' and '.join(given)}, "
                                   f"or shard the target with --engine vllm or sglang")
        if engine == "cache":
            return {"cache_dir": args.cache_dir}
        return {"device_map": device_map} if device_map is not None else {}
    key = TP_KWARG[engine]
    if tp is not None and key in (kwargs or {}) and kwargs[key] != tp:
        raise ServeTargetError(f"--tp-size {tp} but --engine-kwargs sets {key}={kwargs[key]!r}; "
                               f"give the degree once, with --tp-size")
    merged = tp_engine_kwargs(engine, tp, kwargs)
    return {"engine_kwargs": merged} if merged else {}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """serve-target options (shared by the CLI and `python -m draftsmith.remote.server`)."""
    p.add_argument("--target", required=True, help="HF checkpoint dir, hub id org/name (local HF cache) or `smollm2`")
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "sglang", "cache"],
                   help="how the target runs here (cache: serve an offline feature cache, see --cache-dir)")
    p.add_argument("--cache-dir", default=None, help="with --engine cache: the DIR `draftsmith cache` wrote")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="dtype the target runs in (default float32)")
    p.add_argument("--device", default="auto",
                   help="where the hf engine runs the target (the cache engine: where it returns features): auto "
                        "(the local GPU when there is one, else cpu), cpu, cuda, cuda:N (vllm and sglang place the "
                        "target themselves)")
    p.add_argument("--device-map", default=None, choices=["auto"],
                   help="hf: auto spreads the target's layers over the visible GPUs (accelerate; features are "
                        "gathered on the first); default: the whole target on --device")
    p.add_argument("--tp-size", type=int, default=None,
                   help="vllm/sglang: tensor-parallel degree, the GPUs the target is sharded over "
                        "(vLLM tensor_parallel_size, SGLang tp_size); default: the engine's (1)")
    p.add_argument("--engine-kwargs", default=None, metavar="JSON",
                   help="vllm/sglang: a JSON object of extra keyword arguments for the engine (vllm.LLM, "
                        "SGLang ServerArgs), e.g. '{\"gpu_memory_utilization\": 0.8}'; they override ours")
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
