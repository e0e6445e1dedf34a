"""Engine-free speculative decoding: lossless greedy, exact tau for constructed drafts, cache rollback."""

import pytest
import torch

from draftsmith.drafts.eagle3.infer import Eagle3Proposer
from draftsmith.drafts.peagle.infer import PEagleProposer
from draftsmith.eval.offline import HFTarget
from draftsmith.eval.report import acceptance_stats
from draftsmith.eval.speculative import Proposal, generate_plain, generate_speculative, verify_greedy
from eval_helpers import AUX_IDS, draft_for
from fixtures import tiny_llama_config


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_plain_greedy(tiny, k):
    target = HFTarget(tiny.model, AUX_IDS)
    proposer = Eagle3Proposer(tiny.draft)
    accepted = []
    for ids in tiny.prompts:
        plain = generate_plain(target, ids, max_new_tokens=30).tokens
        spec = generate_speculative(target, proposer, ids, k=k, max_new_tokens=30)
        assert spec.tokens == plain
        accepted += spec.accepted
    # both verification paths ran: multi-token acceptance (cache refilled over several slots) and rejection
    assert max(accepted) >= min(k, 2) and min(accepted) == 0
    assert acceptance_stats(accepted, k)["tau"] > 1.3  # the on-policy draft really helps


def test_plain_baseline_equals_transformers_generate(tiny):
    ids = tiny.prompts[0]
    ref = tiny.model.generate(torch.tensor([ids]), max_new_tokens=20, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, len(ids):].tolist()
    assert generate_plain(HFTarget(tiny.model, AUX_IDS), ids, max_new_tokens=20).tokens == ref


class CheckedProposer(Eagle3Proposer):
    """Every cached proposal must equal a from-scratch proposer's on the same state (rollback is exact)."""

    def propose(self, state):
        got = super().propose(state)
        fresh = Eagle3Proposer(self.draft).propose(state)
        assert got.tokens.tolist() == fresh.tokens.tolist()
        self.rounds = getattr(self, "rounds", 0) + 1
        return got


def test_draft_cache_rollback_equals_recompute(tiny):
    p = CheckedProposer(tiny.draft)
    out = generate_speculative(HFTarget(tiny.model, AUX_IDS), p, tiny.prompts[1], k=4, max_new_tokens=24)
    assert p.rounds == len(out.accepted) and 0 < sum(out.accepted)


class OracleProposer:
    """Proposes the known greedy continuation with one token corrupted at a chosen position."""

    kind = "chain"

    def __init__(self, reference, prompt_len, wrong_at):
        self.ref, self.n, self.wrong_at, self.expected = reference, prompt_len, wrong_at, []

    def reset(self):
        self.round = 0

    def propose(self, state):
        start = len(state.tokens) - self.n  # index of the next token in the reference
        toks = (self.ref + [0] * 10)[start : start + state.k]
        w = self.wrong_at[self.round % len(self.wrong_at)]
        if w < state.k:
            toks[w] = (toks[w] + 1) % 384
        self.expected.append(min(w, state.k))
        self.round += 1
        return Proposal(torch.tensor(toks))

    def commit(self, state, a):
        pass


def test_target_cache_crop_keeps_exactly_the_accepted_prefix(tiny):
    ids = tiny.prompts[2]
    target = HFTarget(tiny.model, AUX_IDS)
    ref = generate_plain(target, ids, max_new_tokens=40).tokens
    oracle = OracleProposer(ref, len(ids), wrong_at=[0, 3, 1, 9, 2, 4])
    out = generate_speculative(target, oracle, ids, k=4, max_new_tokens=32)
    assert out.tokens == ref[:32]
    assert out.accepted == oracle.expected  # accepted exactly up to the corrupted position
    assert target.length == len(ids) + sum(a + 1 for a in out.accepted)  # cache = committed tokens - 1


def test_verify_greedy_hand_example():
    logits = torch.full((4, 6), -1.0)
    for i, t in enumerate([2, 5, 1, 4]):
        logits[i, t] = 1.0  # target argmax per position: 2, 5, 1, 4
    assert verify_greedy(torch.tensor([2, 5, 3]), logits) == (2, [2, 5, 1])
    assert verify_greedy(torch.tensor([0, 5, 1]), logits) == (0, [2])
    assert verify_greedy(torch.tensor([2, 5, 1]), logits) == (3, [2, 5, 1, 4])


def always_agree(x=7, vocab=64, hidden=64, **peagle):
    """Target and draft that both always say token x (the construction in the brief). With P-EAGLE
    knobs (``peagle``) the draft is a P-EAGLE one whose mask_hidden carries the same ~100 in dim 0,
    so its mask slots look like real ones."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab, num_layers=4, hidden=hidden)).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.01)
        model.model.embed_tokens.weight[:, 0] = 100.0  # the residual stream is dominated by dim 0
        model.lm_head.weight[x] = 0
        model.lm_head.weight[x, 0] = 10.0  # final normed state ~ e_0 -> logit of x ~ 10 * sqrt(H)
    draft = draft_for(model, seed=1, **peagle)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                p.normal_(0.0, 0.01)
        draft.model.fc.weight[0, 0] = 1.0  # h[0] = aux_0[0] ~ 100
        if peagle:
            draft.mask_hidden.zero_()
            draft.mask_hidden[0, 0, 0] = 100.0
        draft.lm_head.weight[x] = 0
        draft.lm_head.weight[x, 0] = 10.0
    return model, draft


PEAGLE = {"mask_token_id": 63, "num_depths": 4, "num_draft_layers": 2}


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("family", ["eagle3", "peagle"])
def test_always_agree_draft_gives_tau_k_plus_1(k, family):
    model, draft = always_agree(**(PEAGLE if family == "peagle" else {}))
    target = HFTarget(model, AUX_IDS)
    proposer = PEagleProposer(draft) if family == "peagle" else Eagle3Proposer(draft)
    out = generate_speculative(target, proposer, [3, 9, 11, 2, 5], k=k, max_new_tokens=25)
    assert out.tokens == [7] * 25 == generate_plain(target, [3, 9, 11, 2, 5], max_new_tokens=25).tokens
    s = acceptance_stats(out.accepted, k)
    assert s["tau"] == k + 1 and s["acceptance_per_position"] == [1.0] * k
    assert len(out.accepted) == -(-24 // (k + 1))  # 1 token from the prefill, then k+1 per round


def test_random_draft_gives_tau_close_to_one(tiny):
    target = HFTarget(tiny.model, AUX_IDS)
    proposer = Eagle3Proposer(draft_for(tiny.model, seed=5).eval())
    accepted = []
    for ids in tiny.prompts:
        out = generate_speculative(target, proposer, ids, k=3, max_new_tokens=24)
        assert out.tokens == generate_plain(target, ids, max_new_tokens=24).tokens
        accepted += out.accepted
    assert 1.0 <= acceptance_stats(accepted, 3)["tau"] < 1.1


def test_eos_stops_generation_like_plain(tiny):
    target = HFTarget(tiny.model, AUX_IDS)
    ids = tiny.prompts[0]
    ref = generate_plain(target, ids, max_new_tokens=30).tokens
    eos = ref[7]  # pretend the 8th generated token ends the turn
    plain = generate_plain(target, ids, max_new_tokens=30, eos_ids=[eos]).tokens
    spec = generate_speculative(target, Eagle3Proposer(tiny.draft), ids, k=3, max_new_tokens=30, eos_ids=[eos])
    assert spec.tokens == plain == ref[: ref.index(eos) + 1]
