"""Shared tiny target and trained draft for the evaluation tests (built in code, seconds on CPU)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from draftsmith.eval.offline import HFTarget
from draftsmith.eval.speculative import generate_plain
from eval_helpers import AUX_IDS, QUESTIONS, draft_for, train_on_policy
from fixtures import make_tiny_llama, make_tokenizer


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and do not stall when other jobs share the CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    """Tiny chatml Llama target (4 layers, hidden 64) + a draft trained on-policy for a few seconds."""
    from transformers import AutoModelForCausalLM

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("eval_tiny")
    tok = make_tokenizer("chatml")
    path = make_tiny_llama(root / "target", tok, num_layers=4, hidden=64)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    prompts = [list(tok.encode(tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                        add_generation_prompt=True), add_special_tokens=False))
               for q in QUESTIONS]
    runner = HFTarget(model, AUX_IDS)
    sequences = [p + generate_plain(runner, p, max_new_tokens=40).tokens for p in prompts]
    # Draft vocab: every token the target emitted plus a spread of others (a pruned map with gaps).
    used = sorted({t for s in sequences for t in s} | set(range(0, model.config.vocab_size, 3)))
    draft = train_on_policy(model, draft_for(model, used), sequences)
    torch.set_num_threads(before)
    return SimpleNamespace(tok=tok, path=path, model=model, prompts=prompts, draft=draft, root=root,
                           sequences=sequences, draft_ids=used)


@pytest.fixture(scope="session")
def tiny_peagle(tiny):
    """A P-EAGLE draft (2 layers, 4 depths, the same pruned vocab) trained on-policy on ``tiny``'s target."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)  # COD draws from the global RNG
    mask = tiny.model.config.vocab_size - 1  # a token the chat text never contains
    draft = draft_for(tiny.model, tiny.draft_ids, seed=2, mask_token_id=mask, num_depths=4, num_draft_layers=2)
    draft = train_on_policy(tiny.model, draft, tiny.sequences)
    torch.set_num_threads(before)
    return draft
