"""Engine-free evaluation: real speculative decoding with the hf target and a trained draft.

Both sides keep KV caches. The target (:class:`HFTarget`) verifies K drafted tokens in one forward
and is cropped back to the accepted prefix (``DynamicCache.crop``). Drafts propose as vLLM 0.32
serves them:

- EAGLE-3 (:class:`~draftsmith.drafts.eagle3.infer.Eagle3Proposer`, chain): keeps its own cache of target slots, drafts a chain of
  K tokens on top of it, and after verification drops the chain slots and refills the newly
  accepted positions with the target's real aux states (vLLM's EAGLE proposer).
- P-EAGLE (:class:`~draftsmith.drafts.peagle.infer.PEagleProposer`, parallel): one draft forward per round over the target slots
  plus K-1 mask slots drafts K tokens (vLLM's ``parallel_drafting``); the target slots stay cached,
  the mask slots are recomputed every round. 1 <= K <= num_depths; eval's default K is num_depths.
- block families (:class:`~draftsmith.drafts.block_infer.BlockProposer`, block): the committed context's K/V stay cached; one draft
  forward over [newest token, MASK x K] drafts K tokens (vLLM's ``dflash``); default K = block_size - 1.

Greedy output is token-identical to plain greedy decoding of the target; plain decoding runs side
by side so tokens/s is a ratio. With a temperature each drafted token is sampled from the draft's
softmax at that temperature (vLLM's ``draft_sample_method="probabilistic"``; the parallel depths
independently) and verified by rejection sampling.

Drafts load through the family registry (drafts/__init__.py: the family is read from config.json);
every family brings its ``Proposer`` (drafts/<family>/infer.py, the proposer protocol of
drafts/proposer.py), and :mod:`draftsmith.eval.speculative` verifies for all of them.
The trainer's ``train.spec_eval_every`` hook (:func:`trainer_spec_eval`) uses the same proposers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from collections.abc import Iterator, Mapping
from typing import Any, Callable, Optional, Sequence

import torch

from draftsmith.drafts import FAMILIES, DraftError, family_of_config, get_family, layer_count_fixup
from draftsmith.drafts.family import lookup
from draftsmith.eval import EvalError
from draftsmith.eval.prompts import EvalPrompt, describe_prompts, load_prompts, render_prompt
from draftsmith.eval.report import acceptance_stats, build_report
from draftsmith.eval.speculative import DecodeState, Proposal, generate_plain, generate_speculative
from draftsmith.targets.contract import engine_default_aux_layer_ids
from draftsmith.weights import read_tensors



class HFTarget:
    """A transformers causal LM with a ``DynamicCache`` behind the ``TargetRunner`` protocol (batch 1).

    Aux states use the vLLM layer-id convention: id i < L is ``hidden_states[i]``, id L (the last
    layer before the final norm) is captured by a pre-hook on the final norm.
    """

    def __init__(self, model: Any, aux_layer_ids: Sequence[int]):
        from draftsmith.targets.contract import validate_layer_ids
        from draftsmith.targets.hf import final_norm

        self.model = model
        self.num_layers = int(model.config.get_text_config().num_hidden_layers)
        self.aux_ids = validate_layer_ids(list(aux_layer_ids), self.num_layers)
        self._norm = final_norm(model)
        self.device = next(model.parameters()).device
        self.cache = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Mistral, Gemma 2/3, GPT-OSS) drop states past the window as they update; a
        # rejected draft is then cropped off a window that no longer holds what came before it (transformers
        # raises). Recording keeps those states until crop() restricts the layer back to its window.
        for layer in getattr(self.cache, "layers", ()):
            if hasattr(layer, "activate_past_recording"):
                layer.activate_past_recording()

    @property
    def length(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    @torch.no_grad()
    def forward(self, ids: Sequence[int], *, aux: bool, last_only: bool = False):
        """Append ids; logits (T, V) fp32 ((1, V) with last_only), aux (T, n_aux, H) or None."""
        captured: dict[str, torch.Tensor] = {}
        hook = None
        if aux and self.num_layers in self.aux_ids:
            hook = self._norm.register_forward_pre_hook(lambda _m, args: captured.__setitem__("pre_norm", args[0]))
        try:
            out = self.model(input_ids=torch.tensor([list(ids)], device=self.device), past_key_values=self.cache,
                             use_cache=True, output_hidden_states=aux, logits_to_keep=1 if last_only else 0)
        finally:
            if hook is not None:
                hook.remove()
        logits = out.logits[0].float()
        if not aux:
            return logits, None
        states = out.hidden_states  # L + 1 of (1, T, H); [L] is after the final norm
        picked = [captured["pre_norm"] if i == self.num_layers else states[i] for i in self.aux_ids]
        return logits, torch.stack(picked, dim=2)[0]  # n x (1, T, H) -> (T, n, H)

    def crop(self, length: int) -> None:
        extra = self.length - length
        # a negative count removes that many positions from the end; -0 (all accepted) only lets recording
        # sliding-window layers fall back to their window (full-attention layers: a no-op)
        self.cache.crop(-max(extra, 0))


class _Proposers(Mapping):
    """Family name -> its offline proposer class, read from the drafts registry (each family's api
    ``Proposer``), so a registered family is evaluable with no edit here."""

    def __getitem__(self, name: str) -> Any:
        return get_family(name).Proposer

    def __iter__(self) -> Iterator[str]:
        return iter(FAMILIES)

    def __len__(self) -> int:
        return len(FAMILIES)


# Offline proposer per draft family (the family's inference loop, drafts/<family>/infer.py; verification is
# shared). Each has ``kind``, ``max_k`` (None = any), ``default_k`` (eval without -k), ``trained_k`` (the
# trainer hook's K) and ``k_knob`` (what bounds K).
PROPOSERS: Mapping[str, Any] = _Proposers()


def proposer_for(draft: Any) -> Any:
    """The offline proposer of a draft model, by its family's exact model class."""
    for family in FAMILIES.values():
        if type(draft) is family.Model:
            return family.Proposer(draft)
    raise EvalError(f"{type(draft).__name__}: no offline proposer; evaluable families: {', '.join(PROPOSERS)}")


def check_k(proposer: Any, k: Optional[int], family: str) -> int:
    """-k resolved for this proposer: its ``default_k`` when None, else within 1..max_k."""
    if k is None:
        return proposer.default_k
    if proposer.max_k is not None and not 1 <= k <= proposer.max_k:
        raise EvalError(f"-k {k}: this {get_family(family).display} draft drafts {proposer.max_k} tokens per "
                        f"forward ({proposer.k_knob}); pass -k between 1 and {proposer.max_k} or omit -k")
    return k


# ---------------------------------------------------------------------------------- loading
def resolve_draft_dir(path: str | Path) -> Path:
    """A run dir, ``checkpoints/`` root, checkpoint dir, ``model/``, ``model/consolidated/`` or a
    vLLM export dir -> the directory holding ``config.json`` + ``model.safetensors``."""
    from draftsmith.serve.resolve import SAFETENSORS, candidates  # the same places `serve` looks

    p = Path(path)
    if not p.exists():
        raise EvalError(f"--draft: '{p}' does not exist; pass a run dir, a checkpoint dir or a consolidated draft dir")
    for c in candidates(p):
        if (c / "config.json").is_file() and (c / SAFETENSORS).is_file():
            return c
    raise EvalError(f"--draft: no config.json + model.safetensors in '{p}' (or its model/consolidated/); "
                    "pass a draftsmith checkpoint or an exported draft dir")


def load_draft(path: str | Path, target_embeddings: Optional[torch.Tensor] = None,
               target_lm_head: Optional[torch.Tensor] = None, *, default_layer_ids: Optional[list[int]] = None,
               notes: Optional[list[str]] = None):
    """Load a draft for inference through the family registry -> (family, model fp32 eval, layer ids, draft dir).

    The family comes from config.json (drafts.family_of_config); it must be registered and have a
    proposer here. ``target_embeddings`` (V, H) fills the draft's embeddings when it was saved without;
    block drafts also borrow ``target_lm_head`` (V, H) (None: the embeddings, a tied target).
    The draft is read as the engines serve it: a config that declares more layers than the weights
    hold (NeMo AutoModel's) takes the layers held, and an EAGLE-family config without aux layer ids
    reads ``default_layer_ids`` (the target's engine default; None: refused). Each such reading is
    appended to ``notes``.
    """
    d = resolve_draft_dir(path)
    config = json.loads((d / "config.json").read_text())
    family = family_of_config(config)
    fam = get_family(family)
    arch = (config.get("architectures") or ["?"])[0]
    if fam.eval_archs and arch not in fam.eval_archs:
        evaluable = "; ".join(f"{f.display}" + (f" ({', '.join(f.eval_archs)})" if f.eval_archs else "")
                              for f in FAMILIES.values())
        raise EvalError(f"{d / 'config.json'}: architecture {arch} drafts are not evaluable offline; these are: "
                        f"{evaluable}; benchmark it on a server with bench-server")
    variant = fam.refuses(config) if fam.refuses else None  # e.g. DFlash 2 keys under a DFlash config
    if variant:
        raise EvalError(f"{d / 'config.json'}: " + variant.format(source=d))
    state = read_tensors(d / "model.safetensors")  # a corrupt file is its own one-line error
    notes = [] if notes is None else notes
    fix = layer_count_fixup(config, state)
    if fix is not None:
        config = {**config, "num_hidden_layers": fix[1]}
        notes.append(f"{d / 'config.json'}: num_hidden_layers {fix[0]} read as {fix[1]}, the layers its weights "
                     "hold (as draftsmith serve does)")
    if fam.reads_default_layer_ids and not lookup(config, fam.layer_ids_key) and default_layer_ids:
        section, _, name = fam.layer_ids_key.rpartition(".")  # "eagle_config.<ids>"; a top-level key has no section
        ids = {name: list(default_layer_ids)}
        config = {**config, section: {**(config.get(section) or {}), **ids}} if section else {**config, **ids}
        notes.append(f"{d / 'config.json'}: no {name}; reading {list(default_layer_ids)}, "
                     "the target's engine default (2, L//2, L-3), as vLLM and SGLang do")
    try:
        layer_ids = fam.layer_ids_from_export(config)
        if fam.borrows_lm_head:
            model = fam.load_exported(config, state, target_embeddings, target_lm_head)
        else:
            model = fam.load_exported(config, state, target_embeddings)
    except (DraftError, ValueError) as e:
        raise EvalError(f"{d}: {e}") from None
    return family, model, layer_ids, d


def family_of_dir(draft_dir: Path) -> str:
    """The family of the draft whose config.json is in ``draft_dir``."""
    return family_of_config(json.loads((Path(draft_dir) / "config.json").read_text()))


def draft_meta(draft_dir: Path) -> dict:
    """The checkpoint's meta.json (walking up from the draft dir), or {} (a vLLM export, a bare dir)."""
    from draftsmith.layout import find_meta

    return find_meta(draft_dir)


def target_from_draft(draft_dir: Path) -> Optional[str]:
    """The target recorded in the checkpoint's meta.json (walking up from the draft dir), if any."""
    return draft_meta(draft_dir).get("target")


def eos_ids_of(tokenizer: Any, model: Any = None) -> list[int]:
    """EOS ids from the tokenizer and the model's generation config (an int or a list there)."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    gen = getattr(model, "generation_config", None)
    extra = getattr(gen, "eos_token_id", None)
    ids.update([extra] if isinstance(extra, int) else list(extra or []))
    return sorted(ids)


# ---------------------------------------------------------------------------------- evaluation
def evaluate(target, proposer, tokenizer, prompts: Sequence[EvalPrompt], *, k: int, max_new_tokens: int,
             temperature: float = 0.0, plain: bool = True, seed: int = 0, eos_ids: Sequence[int] = (),
             log: Optional[Callable[[str], None]] = None, template_kwargs: Optional[dict] = None) -> list[dict]:
    """Speculative (and plain, side by side) generation for every prompt turn -> one record per turn.
    Prompts are rendered with ``template_kwargs`` (those the draft's data was made with)."""
    records = []
    if prompts:  # warm-up (allocator, first-call overheads) so the first timed prompt is not penalised
        ids = render_prompt(tokenizer, prompts[0].context + [{"role": "user", "content": prompts[0].turns[0]}],
                            template_kwargs)
        generate_speculative(target, proposer, ids, k=k, max_new_tokens=2, temperature=0.0)
        generate_plain(target, ids, max_new_tokens=2)
    for n, p in enumerate(prompts):
        messages = list(p.context)
        for turn, question in enumerate(p.turns):
            messages.append({"role": "user", "content": question})
            ids = render_prompt(tokenizer, messages, template_kwargs)
            # sampling draws on the target's device (a CPU generator cannot sample CUDA probabilities)
            dev = getattr(target, "device", "cpu")
            g = torch.Generator(device=dev).manual_seed(seed + 1000 * n + turn)
            base = generate_plain(target, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                  eos_ids=eos_ids, generator=g) if plain else None
            g = torch.Generator(device=dev).manual_seed(seed + 1000 * n + turn)
            spec = generate_speculative(target, proposer, ids, k=k, max_new_tokens=max_new_tokens,
                                        temperature=temperature, eos_ids=eos_ids, generator=g)
            text = tokenizer.decode(spec.tokens, skip_special_tokens=True)
            records.append({
                "id": p.id, "category": p.category, "turn": turn, "prompt_tokens": len(ids),
                "token_ids": spec.tokens, "text": text, "accepted": spec.accepted, "spec_s": spec.wall_s,
                "plain_s": base.wall_s if base else None, "plain_tokens": len(base.tokens) if base else None,
                "matches_plain": (base.tokens == spec.tokens) if base and temperature <= 0 else None,
            })
            messages.append({"role": "assistant", "content": text})
            if log:
                s = acceptance_stats(spec.accepted, k)
                log(f"[{n + 1}/{len(prompts)}] {p.id} turn {turn}: {len(spec.tokens)} tokens, tau {s['tau']:.2f}"
                    + ("" if records[-1]["matches_plain"] in (None, True) else "  MISMATCH vs plain"))
    return records


def run_eval(*, target: Optional[str], draft: str, prompts: str, k: Optional[int] = None, temperature: float = 0.0,
             max_new_tokens: int = 128, multi_turn: bool = False, limit: Optional[int] = None,
             dtype: str = "float32", plain: bool = True, seed: int = 0, ignore_eos: bool = False,
             progress: bool = True, chat_template_kwargs: Optional[dict] = None, device: str = "auto") -> dict:
    """Open the hf target, load the draft and prompts, evaluate; return the report dict (report.py).
    ``k`` None: the proposer's ``default_k`` (3 for EAGLE-3, num_depths for P-EAGLE).
    ``chat_template_kwargs`` None: the ones the draft was trained with (its meta.json).
    ``device`` (``--device``: auto, cpu, cuda, cuda:N): where the target and the draft run."""
    from draftsmith import distributed
    from draftsmith.targets.hf import HFEngine

    if (k is not None and k < 1) or max_new_tokens < 1 or temperature < 0:
        raise EvalError(f"-k {k} / --max-new-tokens {max_new_tokens} / --temperature {temperature}: "
                        "k and max-new-tokens must be >= 1 and the temperature >= 0")
    placed = distributed.local_device(device, "--device")  # a bad --device fails before anything loads
    items = load_prompts(prompts, multi_turn=multi_turn, limit=limit)
    draft_dir = resolve_draft_dir(draft)
    if progress:  # stdout: stderr stays for progress lines and the one-line errors
        print(describe_prompts(items, prompts), flush=True)
    target = target or target_from_draft(draft_dir)
    if chat_template_kwargs is None:
        chat_template_kwargs = draft_meta(draft_dir).get("chat_template_kwargs") or {}
    if not target:
        raise EvalError(f"--target is required: {draft_dir} records no target in a meta.json")
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    engine = HFEngine(target, dtype=dtype, device=str(placed))
    try:
        model, info = engine.model, engine.info()
        notes: list[str] = []
        family, model_draft, aux_ids, _ = load_draft(
            draft_dir, engine.embeddings(), engine.lm_head_weight() if get_family(family_of_dir(draft_dir)).borrows_lm_head else None,
            default_layer_ids=engine_default_aux_layer_ids(info.num_layers), notes=notes)
        if progress:
            for note in notes:
                print(f"note: {note}", file=sys.stderr, flush=True)
        model_draft = model_draft.to(engine.device)  # loaded on the CPU; proposers read their device off its weights
        c = model_draft.cfg
        if c.vocab_size != info.vocab_size or c.target_hidden_size != info.hidden_size:
            raise EvalError(f"--draft {draft_dir}: built for vocab {c.vocab_size} / hidden {c.target_hidden_size} "
                            f"but target {target} has vocab {info.vocab_size} / hidden {info.hidden_size}; "
                            "pass the target the draft was trained for")
        proposer = get_family(family).Proposer(model_draft)
        k = check_k(proposer, k, family)
        log = (lambda s: print(s, file=sys.stderr, flush=True)) if progress else None
        records = evaluate(HFTarget(model, aux_ids), proposer, engine.tokenizer, items, k=k,
                           max_new_tokens=max_new_tokens, temperature=temperature, plain=plain, seed=seed,
                           eos_ids=() if ignore_eos else eos_ids_of(engine.tokenizer, model), log=log,
                           template_kwargs=chat_template_kwargs)
    finally:
        engine.close()
    config = {"target": str(target), "draft": str(draft_dir), "prompts": str(prompts), "k": k,
              "temperature": temperature, "max_new_tokens": max_new_tokens, "multi_turn": multi_turn,
              "dtype": dtype, "device": str(placed), "seed": seed, "ignore_eos": ignore_eos, "aux_layer_ids": aux_ids,
              "chat_template_kwargs": chat_template_kwargs,
              "wall_s": time.perf_counter() - t0}
    report = build_report(records, k=k, mode="offline", config=config)
    if getattr(c, "pruned", False):  # EAGLE-3 / P-EAGLE over a draft vocab: how much of the answers it holds
        report["draft_vocab_coverage"] = answer_coverage(records, model_draft.t2d)
    return report


def answer_coverage(records: Sequence[dict], t2d: torch.Tensor) -> Optional[float]:
    """Share of the target's answer tokens (every record's ``token_ids``) whose id the draft vocab holds;
    ``t2d`` (V,) bool marks target ids in the draft vocab. None when nothing was generated."""
    ids = [int(t) for r in records for t in r["token_ids"]]
    if not ids:
        return None
    return float(t2d.detach().cpu()[torch.tensor(ids, dtype=torch.long)].double().mean())


# ---------------------------------------------------------------------------------- training hook
@torch.no_grad()
def held_out_tau(model: Any, draft: Any, aux_ids: Sequence[int], prompts: Sequence[Sequence[int]], *,
                 k: Optional[int] = None, max_new_tokens: int = 32, eos_ids: Sequence[int] = ()) -> dict:
    """Real greedy tau of ``draft`` (any family in :data:`PROPOSERS`) on prompt token ids, with ``k``
    drafted tokens (None: the proposer's ``trained_k``) -> acceptance_stats plus ``k`` (what the
    trainer logs next to simulated tau)."""
    was_training = draft.training
    draft.eval()
    try:
        target, proposer = HFTarget(model, aux_ids), proposer_for(draft)
        k = proposer.trained_k if k is None else k
        accepted: list[int] = []
        for ids in prompts:
            accepted += generate_speculative(target, proposer, list(ids), k=k, max_new_tokens=max_new_tokens,
                                             eos_ids=eos_ids).accepted
    finally:
        draft.train(was_training)
    return {**acceptance_stats(accepted, k), "k": k}


def trainer_spec_eval(trainer: Any, simulated: Optional[float] = None, max_new_tokens: int = 32) -> dict:
    """The Trainer's ``train.spec_eval_every`` hook: real tau on the first ``train.spec_eval_prompts``
    held-out conversations (each cut before its first assistant token), K = the family's ``trained_k``
    (``draft.ttt_steps`` for EAGLE-3, ``draft.num_depths`` for P-EAGLE),
    logged as ``spec/real_tau`` next to ``spec/simulated_tau``. Needs the hf engine; skipped otherwise."""
    model = getattr(trainer.engine, "model", None)
    starts = [(ex, ex.loss_mask.index(1) if 1 in ex.loss_mask else 0) for ex in trainer.eval_set]
    prompts = [ex.input_ids[:s] for ex, s in starts if s > 0][: trainer.cfg.train.spec_eval_prompts]
    if model is None or not prompts:
        print(f"spec eval skipped at step {trainer.step}: needs the hf engine and held-out data (data.eval_size > 0)",
              file=sys.stderr)
        return {}
    stats = held_out_tau(model, trainer.draft, trainer.aux_ids, prompts, max_new_tokens=max_new_tokens,
                         eos_ids=eos_ids_of(trainer.tokenizer, model))
    k = stats["k"]
    out = {"real_tau": stats["tau"], "real_acceptance_per_position": stats["acceptance_per_position"],
           "real_conditional_acceptance": stats["conditional_acceptance_per_position"]}
    if trainer.writer is not None:
        trainer.writer.add_scalar("spec/real_tau", stats["tau"], trainer.step)
        if simulated is not None:
            trainer.writer.add_scalar("spec/simulated_tau", simulated, trainer.step)
    sim = f", simulated tau {simulated:.3f}" if simulated is not None else ""
    print(f"step {trainer.step}: real tau {stats['tau']:.3f} (K={k}, {len(prompts)} held-out prompts{sim})",
          file=sys.stderr, flush=True)
    return out
