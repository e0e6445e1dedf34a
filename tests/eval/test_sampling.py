"""Rejection sampling leaves the output distributed as the target's (empirical TV bounds, fixed seeds)."""

import pytest
import torch

from draftsmith.eval.offline import HFTarget, proposer_for
from draftsmith.eval.report import acceptance_stats
from draftsmith.eval.speculative import Proposal, generate_speculative, verify_sampling
from eval_helpers import AUX_IDS, draft_for
from fixtures import tiny_llama_config


def tv(a, b):
    return 0.5 * float((a - b).abs().sum())


def empirical(samples, v):
    return torch.bincount(torch.tensor(samples), minlength=v).double() / len(samples)


def test_verify_sampling_first_token_is_target_distributed():
    g = torch.Generator().manual_seed(0)
    V, K, N = 5, 2, 20000
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(K, V, generator=g) * 2, -1)
    firsts, accepted = [], []
    for _ in range(N):
        d = torch.stack([torch.multinomial(q[i], 1, generator=g)[0] for i in range(K)])
        a, toks = verify_sampling(d, q, p, g)
        firsts.append(toks[0])
        accepted.append(a)
    assert tv(empirical(firsts, V), p[0].double()) < 0.015
    # P(first draft accepted) = sum_x min(p0(x), q1(x)) = 1 - TV(p0, q1)
    rate = sum(a > 0 for a in accepted) / N
    assert rate == pytest.approx(1 - tv(p[0], q[0]), abs=0.015)


class BigramTarget:
    """A toy target whose next-token logits depend on the last token only: table (V, V)."""

    def __init__(self, table):
        self.table, self.n = table, 0

    def reset(self):
        self.n = 0

    def forward(self, ids, *, aux, last_only=False):
        self.n += len(ids)
        logits = self.table[torch.tensor(list(ids))]
        return (logits[-1:] if last_only else logits), (torch.zeros(len(ids), 1, 1) if aux else None)

    def crop(self, length):
        self.n = length


class BigramProposer:
    """A toy chain draft: samples each token from its own bigram table at the state's temperature."""

    kind = "chain"

    def __init__(self, table):
        self.table = table

    def reset(self):
        pass

    def propose(self, state):
        prev, toks, qs = state.tokens[-1], [], []
        for _ in range(state.k):
            q = torch.softmax(self.table[prev] / state.temperature, -1)
            prev = int(torch.multinomial(q, 1, generator=state.generator))
            toks.append(prev)
            qs.append(q)
        return Proposal(torch.tensor(toks), torch.stack(qs))

    def commit(self, state, a):
        pass


def test_toy_target_marginals_and_joint_match_exact_distribution():
    V, K, N, T, start = 6, 3, 4000, 0.8, 2
    g = torch.Generator().manual_seed(1)
    p_tab, q_tab = torch.randn(V, V, generator=g) * 2, torch.randn(V, V, generator=g) * 2
    P, Q = torch.softmax(p_tab / T, -1).double(), torch.softmax(q_tab / T, -1).double()
    target, proposer = BigramTarget(p_tab), BigramProposer(q_tab)
    outs, accepted = [], []
    for i in range(N):
        gen = generate_speculative(target, proposer, [start], k=K, max_new_tokens=4, temperature=T,
                                   generator=torch.Generator().manual_seed(100 + i))
        outs.append(gen.tokens)
        accepted += gen.accepted[:1]  # the first round starts from a target-distributed x_0
    dist, draft_dist = P[start], P[start]
    for j in range(4):
        assert tv(empirical([o[j] for o in outs], V), dist) < 0.04, f"position {j}"
        if j:
            assert tv(dist, draft_dist) > 0.2  # the test has power: the draft's chain is far off
        dist, draft_dist = dist @ P, (draft_dist @ Q if j else dist @ Q)
    joint = (P[start][:, None] * P).flatten()  # (x_0, x_1)
    assert tv(empirical([o[0] * V + o[1] for o in outs], V * V), joint) < 0.06
    expected_rate = float((P[start][:, None] * torch.minimum(P, Q)).sum())  # E_x0[1 - TV(P[x0], Q[x0])]
    assert sum(a > 0 for a in accepted) / N == pytest.approx(expected_rate, abs=0.03)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["eagle3", "peagle"])
def test_hf_target_with_pruned_draft_samples_target_distribution(family):
    """Vocab-8 Llama target, an EAGLE-3 (chain) or P-EAGLE (parallel, 2 depths) draft over 6 of its
    tokens (q is zero on the other 2)."""
    from transformers import LlamaForCausalLM

    V, K, N, T = 8, 2, 1200, 1.0
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(V, num_layers=3, hidden=64)).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    peagle = dict(mask_token_id=4, num_depths=2, num_draft_layers=2) if family == "peagle" else {}
    draft = draft_for(model, draft_ids=[0, 1, 2, 3, 5, 6], seed=3, **peagle).eval()
    target, prompt = HFTarget(model, AUX_IDS), [1, 5, 2, 7]

    def probs(ids):
        target.reset()
        return torch.softmax(target.forward(ids, aux=False)[0][-1].double() / T, -1)

    p0 = probs(prompt)
    p1 = torch.stack([probs(prompt + [a]) for a in range(V)])  # (V, V): row a = p(x_1 | x_0 = a)
    second = p0 @ p1
    third = sum(p0[a] * p1[a, b] * probs(prompt + [a, b]) for a in range(V) for b in range(V))
    outs, accepted = [], []
    proposer = proposer_for(draft)
    assert type(proposer).__name__ == {"eagle3": "Eagle3Proposer", "peagle": "PEagleProposer"}[family]
    for i in range(N):
        gen = generate_speculative(target, proposer, prompt, k=K, max_new_tokens=3, temperature=T,
                                   generator=torch.Generator().manual_seed(i))
        outs.append(gen.tokens)
        accepted += gen.accepted
    assert tv(empirical([o[0] for o in outs], V), p0) < 0.07
    assert tv(empirical([o[1] for o in outs], V), second) < 0.07
    assert tv(empirical([o[2] for o in outs], V), third) < 0.07
    assert 0.1 < acceptance_stats(accepted, K)["acceptance_per_position"][0] < 0.95  # both branches ran
