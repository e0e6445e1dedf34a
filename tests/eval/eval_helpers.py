"""Helpers for the evaluation tests: drafts shaped for a target, on-policy fitting (seconds on CPU)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from draftsmith.drafts.eagle3.config import Eagle3Config
from draftsmith.drafts.eagle3.model import Eagle3Draft
from draftsmith.drafts.peagle.config import PEagleConfig
from draftsmith.drafts.peagle.model import PEagleDraft
from draftsmith.eval.offline import HFTarget
from draftsmith.targets import Batch, Features
from draftsmith.drafts.eagle_supervision import eagle3_supervision

AUX_IDS = [1, 2, 3]
QUESTIONS = ["Tell me a joke about cats.", "What is the capital of France?", "How many legs does a spider have?",
             "Write a haiku about the sea.", "Explain recursion.", "hello, one two three?"]


def draft_for(model, draft_ids=None, seed=0, num_aux=len(AUX_IDS), **peagle) -> Eagle3Draft:
    """A random EAGLE-3 draft shaped for a transformers Llama ``model``; embeddings and lm_head rows
    copied from the target; pruned to ``draft_ids`` (sorted target ids) when given. With P-EAGLE
    keywords (``mask_token_id``, ``num_depths``, ``num_draft_layers``) a PEagleDraft instead."""
    c = model.config
    v = c.vocab_size
    ids = torch.arange(v) if draft_ids is None else torch.as_tensor(draft_ids).sort().values
    torch.manual_seed(seed)
    shape = dict(hidden_size=c.hidden_size, target_hidden_size=c.hidden_size,
                 num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                 head_dim=c.head_dim, intermediate_size=c.intermediate_size, vocab_size=v,
                 draft_vocab_size=len(ids), num_aux=num_aux)
    d = PEagleDraft(PEagleConfig(**shape, **peagle)) if peagle else Eagle3Draft(Eagle3Config(**shape, ttt_steps=3))
    if len(ids) < v:
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[ids] = True
        d.set_vocab_map(ids - torch.arange(len(ids)), t2d)
    d.load_target_embeddings(model.get_input_embeddings().weight.detach())
    d.init_from_target(model.get_output_embeddings().weight.detach(), ids)
    return d


def train_on_policy(model, draft, sequences, steps=150, lr=1e-2, aux_ids=AUX_IDS):
    """Fit the draft to the target on the target's own greedy continuations (its family's loss:
    EAGLE-3 TTT, P-EAGLE parallel with COD)."""
    runner = HFTarget(model, aux_ids)
    feats = []
    for seq in sequences:
        runner.reset()
        logits, aux = runner.forward(seq, aux=True)
        ids = torch.tensor([seq])
        batch = Batch(ids, torch.ones_like(ids), torch.ones_like(ids))
        draft_ids = draft.draft_to_target(torch.arange(draft.cfg.draft_vocab_size)) if draft.cfg.pruned else None
        feats.append(eagle3_supervision(batch, Features(aux[None], logits[None]), draft_ids))
    opt = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=lr)
    draft.train()
    for step in range(steps):
        s = feats[step % len(feats)]
        out = draft.supervised(s)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    return draft.eval().requires_grad_(False)


def save_vllm_layout(draft, path, aux_ids=AUX_IDS):
    """Save ``draft`` as vLLM loads it: `model.` stripped, no t2d, architecture renamed (the serve
    export does the same from a checkpoint; written here so these tests do not depend on it)."""
    path.mkdir(parents=True)
    state = {(k if k in ("lm_head.weight", "d2t") else k.removeprefix("model.")): v.contiguous()
             for k, v in draft.state_dict().items() if k != "t2d"}
    save_file(state, str(path / "model.safetensors"))
    cfg = draft.export_config(aux_ids)
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (path / "config.json").write_text(json.dumps(cfg))
    return path
