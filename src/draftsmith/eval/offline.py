"""Engine-free evaluation: real speculative decoding with the hf target and a trained draft.

Both sides keep KV caches. The target (:class:`HFTarget`) verifies K drafted tokens in one forward
and is cropped back to the accepted prefix (``DynamicCache.crop``). Drafts propose as vLLM 0.32
serves them:

- EAGLE-3 (:class:`Eagle3Proposer`, chain): keeps its own cache of target slots, drafts a chain of
  K tokens on top of it, and after verification drops the chain slots and refills the newly
  accepted positions with the target's real aux states (vLLM's EAGLE proposer).
- P-EAGLE (:class:`PEagleProposer`, parallel): one draft forward per round over the target slots
  plus K-1 mask slots drafts K tokens (vLLM's ``parallel_drafting``); the target slots stay cached,
  the mask slots are recomputed every round. 1 <= K <= num_depths; eval's default K is num_depths.
- DFlash family (:class:`BlockProposer`, block): the committed context's K/V stay cached; one draft
  forward over [newest token, MASK x K] drafts K tokens (vLLM's ``dflash``); default K = block_size - 1.

Greedy output is token-identical to plain greedy decoding of the target; plain decoding runs side
by side so tokens/s is a ratio. With a temperature each drafted token is sampled from the draft's
softmax at that temperature (vLLM's ``draft_sample_method="probabilistic"``; the parallel depths
independently) and verified by rejection sampling.

Drafts load through the family registry (drafts/__init__.py: the family is read from config.json);
a family is evaluable once it has a ``Proposer`` in :data:`PROPOSERS` (see
:mod:`draftsmith.eval.speculative`; verification is shared).
The trainer's ``train.spec_eval_every`` hook (:func:`trainer_spec_eval`) uses the same proposers.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from draftsmith.drafts import DraftError, family_of_config, get_family, layer_count_fixup
from draftsmith.drafts.eagle3 import Eagle3Draft
from draftsmith.drafts.eagle3_infer import DraftKVCache, extend, next_hidden
from draftsmith.drafts.peagle import PEagleDraft
from draftsmith.eval import EvalError
from draftsmith.eval.prompts import EvalPrompt, describe_prompts, load_prompts, render_prompt
from draftsmith.eval.report import acceptance_stats, build_report
from draftsmith.eval.speculative import DecodeState, Proposal, generate_plain, generate_speculative
from draftsmith.targets.contract import engine_default_aux_layer_ids
from draftsmith.weights import read_tensors

EAGLE3_ARCHS = ("LlamaEagle3DraftModel", "LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Qwen3ForCausalLM")
BLOCK_FAMILIES = ("dflash", "jetspec", "domino")  # borrow the target's lm_head
EAGLE_FAMILIES = ("eagle3", "peagle")  # read eagle_config.eagle_aux_hidden_state_layer_ids
FAMILY_NAMES = {"peagle": "P-EAGLE (parallel)", "dflash": "DFlash (block)", "jetspec": "JetSpec (block)",
                "domino": "Domino (block)"}


class HFTarget:
    """A transformers causal LM with a ``DynamicCache`` behind the ``TargetRunner`` protocol (batch 1).

    Aux states use the vLLM layer-id convention: id i < L is ``hidden_states[i]``, id L (the last
    layer before the final norm) is captured by a pre-hook on the final norm.
    """

    def __init__(self, model: Any, aux_layer_ids: Sequence[int]):
        from draftsmith.targets.contract import validate_layer_ids
        from draftsmith.targets.hf import _final_norm

        self.model = model
        self.num_layers = int(model.config.get_text_config().num_hidden_layers)
        self.aux_ids = validate_layer_ids(list(aux_layer_ids), self.num_layers)
        self._norm = _final_norm(model)
        self.device = next(model.parameters()).device
        self.cache = None

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

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
        if extra > 0:
            self.cache.crop(-extra)  # a negative count removes that many positions from the end


def choose(logits: torch.Tensor, target_ids: torch.Tensor, vocab_size: int, state: DecodeState):
    """(R, Vd) draft logits -> (R,) target ids, q (R, V) over the target vocab or None when greedy.

    Greedy: argmax. Sampling: each row from softmax(logits / T) on its own, q zero outside the draft
    vocab; vLLM's ``draft_sample_method="probabilistic"`` does the same (llm_base_proposer.py
    ``compute_probs_and_sample_next_token``: temperature only, no top-k/top-p, probs over the target
    vocab because ``compute_logits`` puts -inf outside the draft vocab). vLLM's default
    ``draft_sample_method="greedy"`` instead drafts the argmax and treats q as one-hot.
    """
    if state.temperature <= 0:
        return target_ids[logits.argmax(-1)].cpu(), None
    q_draft = torch.softmax(logits.float() / state.temperature, -1)  # (R, Vd)
    j = torch.multinomial(q_draft, 1, generator=state.generator)[:, 0]  # (R,)
    q = torch.zeros(logits.shape[0], vocab_size, dtype=torch.float32, device=q_draft.device)
    q[:, target_ids] = q_draft
    return target_ids[j].cpu(), q


class Eagle3Proposer:
    """Chain proposer for an EAGLE-3 draft (see :mod:`draftsmith.drafts.eagle3_infer`)."""

    kind = "chain"

    def __init__(self, draft: Eagle3Draft):
        self.draft = draft
        vd = draft.cfg.draft_vocab_size
        self.target_ids = draft.draft_to_target(torch.arange(vd, device=draft.lm_head.weight.device))  # (Vd,)
        self.reset()

    def reset(self) -> None:
        self.cache = DraftKVCache()
        self.filled = 0  # target slots in the cache: slot t = (aux_t, token_{t+1})

    @property
    def default_k(self) -> int:
        """K when ``draftsmith eval`` gets no -k: 3, vLLM's usual num_speculative_tokens for EAGLE-3."""
        return 3

    @property
    def trained_k(self) -> int:
        """K of the trainer's real-tau hook: the TTT steps the chain was trained for."""
        return self.draft.cfg.ttt_steps

    max_k = None  # a chain can be unrolled to any K

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        d = self.draft
        self.cache.crop(self.filled)  # drop last round's chain slots
        n = state.aux.shape[0]
        dev = d.lm_head.weight.device
        # Target slots filled..n-1 read (aux_t, token_{t+1}); tokens[n] is the newest committed token.
        aux = state.aux[self.filled : n].to(dev)[None]  # (1, T, n_aux, Ht)
        ids = torch.tensor([state.tokens[self.filled + 1 : n + 1]], device=dev)  # (1, T)
        pos = torch.arange(self.filled, n, device=dev)[None]
        step = extend(d, self.cache, d.combine(aux), ids, pos)
        self.filled = n
        tokens, qs = [], []
        for j in range(state.k):
            picked, q = choose(step.logits[0, -1:], self.target_ids, d.cfg.vocab_size, state)  # (1,), (1, V)
            tok = int(picked[0])
            tokens.append(tok)
            qs.append(None if q is None else q[0])
            if j + 1 < state.k:  # chain step j+1 at position n-1+j+1 reads the state that drafted tok
                h = next_hidden(d, step)[:, -1:]
                step = extend(d, self.cache, h, torch.tensor([[tok]], device=dev), torch.tensor([[n + j]], device=dev))
        q = torch.stack(qs) if state.temperature > 0 else None
        return Proposal(torch.tensor(tokens), q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        self.cache.crop(self.filled)  # chain slots were computed from drafted states: refill lazily


class PEagleProposer:
    """Parallel proposer for a P-EAGLE draft: one draft forward per round drafts the first K depths,
    as vLLM 0.32's parallel-drafting eagle3 proposer does (drafts/peagle.py ``PEagleDraft.propose``).

    Target slot t = (aux_t, token_{t+1}) for every processed position, the last one carrying the
    newest committed token, then K-1 (mask_hidden, mask_token_id) slots; rows n-1..n+K-2 give d_1..d_K.
    A mask slot at depth d sees only earlier slots, so K < num_depths drafts exactly the first K
    depths. The depth-0 slots are committed context and stay in per-layer KV caches across rounds
    (``cache=True``; vLLM keeps them the same way); only the new ones and the K-1 mask slots run each
    round. ``cache=False`` recomputes the whole prefix every round (the reference).
    Sampling: the K depths' distributions are independent (no depth sees another's token).
    """

    kind = "parallel"

    def __init__(self, draft: PEagleDraft, cache: bool = True):
        self.draft, self.use_cache = draft, cache
        self.target_ids = draft.draft_to_target(torch.arange(draft.cfg.draft_vocab_size,
                                                             device=draft.lm_head.weight.device))  # (Vd,)
        self.reset()

    @property
    def max_k(self) -> int:
        """The depths it was trained for; deeper mask slots were never supervised."""
        return self.draft.cfg.num_depths

    default_k = trained_k = max_k  # vLLM serves it with num_speculative_tokens = num_depths

    def reset(self) -> None:
        self.caches = self.draft.new_cache()
        self.filled = 0  # depth-0 slots in the caches

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        d, k = self.draft, state.k
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k={k}: this P-EAGLE draft drafts num_depths={self.max_k} tokens per forward; "
                             f"use 1 <= k <= {self.max_k}")
        n = state.aux.shape[0]  # processed positions; tokens[n] is the newest committed token
        dev = d.lm_head.weight.device
        start = self.filled if self.use_cache else 0
        aux = state.aux[start:n].to(dev)[None]  # (1, T, n_aux, Ht)
        ids = torch.tensor([state.tokens[start + 1 : n + 1]], device=dev)  # (1, T): token_{t+1}
        if self.use_cache:
            out = d.propose_cached(self.caches, aux, ids, k)
            self.filled = n
        else:
            out = d.propose(aux, ids, k)
        tokens, q = choose(out.logits[0], self.target_ids, d.cfg.vocab_size, state)  # (K,), (K, V) | None
        return Proposal(tokens, q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        pass  # only committed depth-0 slots are cached; the mask slots were dropped in propose


class BlockProposer:
    """Block proposer for the DFlash family (DFlash, JetSpec, Domino), as vLLM 0.32's ``dflash``
    method runs a draft (``qwen3_dflash.py``, ``v1/spec_decode/dflash.py``):

    - context: the target's states at every committed position t < n go through fc + hidden_norm and
      each layer's k/v projections ONCE (``precompute_and_store_context_kv``) and stay cached; they are
      appended as positions are committed and never recomputed (committed positions never change);
    - block: [newest committed token, MASK x K] at positions n..n+K, one draft forward in which the
      block sees the whole cached context and itself (bidirectional, or causal for JetSpec); rows
      1..K give d_1..d_K through the target's lm_head (Domino: rows 0..K-1 plus its GRU walk).
    1 <= K <= the tokens one block drafts (block_size - 1; Domino with shift_label: block_size).
    """

    kind = "block"

    def __init__(self, draft: Any):
        self.draft = draft
        self.target_ids = torch.arange(draft.cfg.vocab_size)  # the full target vocab
        self.reset()

    @property
    def max_k(self) -> int:
        return self.draft.max_k

    default_k = trained_k = max_k  # vLLM serves it with num_speculative_tokens = block_size - 1

    def reset(self) -> None:
        self.kvs = None  # per layer (k, v), each (1, h_kv, filled, d)
        self.filled = 0

    @torch.no_grad()
    def propose(self, state: DecodeState) -> Proposal:
        d, k = self.draft, state.k
        if not 1 <= k <= self.max_k:
            raise ValueError(f"k={k}: this block draft drafts {self.max_k} tokens per forward; use 1 <= k <= {self.max_k}")
        if state.temperature > 0 and hasattr(d, "set_progress"):
            raise EvalError("Domino drafts are evaluated greedily (its GRU walks its own argmax); pass --temperature 0")
        n = state.aux.shape[0]  # committed positions with target states; tokens[n] is the anchor
        dev = d.fc.weight.device
        if n > self.filled:
            pos = torch.arange(self.filled, n, device=dev)[None]
            new = d.context_kv(d.context(state.aux[self.filled : n].to(dev)[None]), pos)
            self.kvs = new if self.kvs is None else [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2))
                                                     for (k0, v0), (k1, v1) in zip(self.kvs, new)]
            self.filled = n
        logits = d.propose(self.kvs, int(state.tokens[n]), n, k)  # (K, V)
        tokens, q = choose(logits, self.target_ids.to(logits.device), d.cfg.vocab_size, state)
        return Proposal(tokens, q)

    def commit(self, state: DecodeState, num_accepted: int) -> None:
        pass  # only committed context is cached; the block is recomputed every round


# Offline proposer per draft family (the family's inference loop; verification is shared). Each has
# ``kind``, ``max_k`` (None = any), ``default_k`` (eval without -k) and ``trained_k`` (the trainer hook's K).
PROPOSERS: dict[str, Callable[[Any], Any]] = {"eagle3": Eagle3Proposer, "peagle": PEagleProposer,
                                              "dflash": BlockProposer, "jetspec": BlockProposer,
                                              "domino": BlockProposer}


def proposer_for(draft: Any) -> Any:
    """The offline proposer of a draft model, by its family's exact model class."""
    for name, make in PROPOSERS.items():
        if type(draft) is get_family(name).Model:
            return make(draft)
    raise EvalError(f"{type(draft).__name__}: no offline proposer; evaluable families: {', '.join(PROPOSERS)}")


def check_k(proposer: Any, k: Optional[int], family: str) -> int:
    """-k resolved for this proposer: its ``default_k`` when None, else within 1..max_k."""
    if k is None:
        return proposer.default_k
    if proposer.max_k is not None and not 1 <= k <= proposer.max_k:
        cfg = proposer.draft.cfg
        knob = f"block_size={cfg.block_size}" if family in BLOCK_FAMILIES else f"num_depths={proposer.max_k}"
        raise EvalError(f"-k {k}: this {FAMILY_NAMES.get(family, family)} draft drafts {proposer.max_k} tokens per "
                        f"forward ({knob}); pass -k between 1 and {proposer.max_k} or omit -k")
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
    arch = (config.get("architectures") or ["?"])[0]
    if family not in PROPOSERS or (family == "eagle3" and arch not in EAGLE3_ARCHS):
        kind = FAMILY_NAMES.get(family, f"architecture {arch}")
        raise EvalError(f"{d / 'config.json'}: {kind} drafts are not evaluable offline; EAGLE-3 chain drafts "
                        f"({', '.join(EAGLE3_ARCHS)}), P-EAGLE and the DFlash family are; benchmark it on a "
                        "server with bench-server")
    state = read_tensors(d / "model.safetensors")  # a corrupt file is its own one-line error
    notes = [] if notes is None else notes
    fix = layer_count_fixup(config, state)
    if fix is not None:
        config = {**config, "num_hidden_layers": fix[1]}
        notes.append(f"{d / 'config.json'}: num_hidden_layers {fix[0]} read as {fix[1]}, the layers its weights "
                     "hold (as draftsmith serve does)")
    eagle = config.get("eagle_config") or {}
    if family in EAGLE_FAMILIES and not eagle.get("eagle_aux_hidden_state_layer_ids") and default_layer_ids:
        config = {**config, "eagle_config": {**eagle, "eagle_aux_hidden_state_layer_ids": list(default_layer_ids)}}
        notes.append(f"{d / 'config.json'}: no eagle_aux_hidden_state_layer_ids; reading {list(default_layer_ids)}, "
                     "the target's engine default (2, L//2, L-3), as vLLM and SGLang do")
    try:
        module = get_family(family)
        layer_ids = module.layer_ids_from_export(config)
        if family in BLOCK_FAMILIES:
            model = module.load_exported(config, state, target_embeddings, target_lm_head)
        else:
            model = module.load_exported(config, state, target_embeddings)
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
            g = torch.Generator().manual_seed(seed + 1000 * n + turn)
            base = generate_plain(target, ids, max_new_tokens=max_new_tokens, temperature=temperature,
                                  eos_ids=eos_ids, generator=g) if plain else None
            g = torch.Generator().manual_seed(seed + 1000 * n + turn)
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
             progress: bool = True, chat_template_kwargs: Optional[dict] = None) -> dict:
    """Open the hf target, load the draft and prompts, evaluate; return the report dict (report.py).
    ``k`` None: the proposer's ``default_k`` (3 for EAGLE-3, num_depths for P-EAGLE).
    ``chat_template_kwargs`` None: the ones the draft was trained with (its meta.json)."""
    from draftsmith.targets.hf import HFEngine

    if (k is not None and k < 1) or max_new_tokens < 1 or temperature < 0:
        raise EvalError(f"-k {k} / --max-new-tokens {max_new_tokens} / --temperature {temperature}: "
                        "k and max-new-tokens must be >= 1 and the temperature >= 0")
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
    engine = HFEngine(target, dtype=dtype)
    try:
        model, info = engine.model, engine.info()
        notes: list[str] = []
        family, model_draft, aux_ids, _ = load_draft(
            draft_dir, engine.embeddings(), engine.lm_head_weight() if family_of_dir(draft_dir) in BLOCK_FAMILIES else None,
            default_layer_ids=engine_default_aux_layer_ids(info.num_layers), notes=notes)
        if progress:
            for note in notes:
                print(f"note: {note}", file=sys.stderr, flush=True)
        c = model_draft.cfg
        if c.vocab_size != info.vocab_size or c.target_hidden_size != info.hidden_size:
            raise EvalError(f"--draft {draft_dir}: built for vocab {c.vocab_size} / hidden {c.target_hidden_size} "
                            f"but target {target} has vocab {info.vocab_size} / hidden {info.hidden_size}; "
                            "pass the target the draft was trained for")
        proposer = PROPOSERS[family](model_draft)
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
              "dtype": dtype, "seed": seed, "ignore_eos": ignore_eos, "aux_layer_ids": aux_ids,
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
