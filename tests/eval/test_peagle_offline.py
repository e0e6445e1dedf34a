"""P-EAGLE (parallel) drafts in offline eval: one draft forward per round, exact against propose()
over the whole prefix, lossless greedy, exact tau for a constructed draft, K rules, the CLI, the hook."""

import json

import pytest
import torch

from draftsmith.cli import EXIT_BAD_INPUT, main
from draftsmith.eval import EvalError
from draftsmith.drafts.peagle.infer import PEagleProposer
from draftsmith.eval.offline import (PROPOSERS, HFTarget, check_k, held_out_tau, load_draft,
                                     proposer_for)
from draftsmith.eval.report import acceptance_stats
from draftsmith.eval.speculative import DecodeState, Proposal, generate_plain, generate_speculative
from eval_helpers import AUX_IDS, save_vllm_layout
from test_eval_cli import save_checkpoint_layout
from test_offline import PEAGLE, always_agree


def reference(draft, state):
    """PEagleDraft.propose over the whole committed prefix: slot t = (aux_t, token_{t+1})."""
    n = state.aux.shape[0]
    return draft.propose(state.aux[None], torch.tensor([state.tokens[1 : n + 1]]), state.k)


class CheckedProposer(PEagleProposer):
    """Every cached proposal equals the full recompute over the same prefix (and the cache=False proposer)."""

    def propose(self, state):
        got = super().propose(state)
        ref = reference(self.draft, state)
        assert got.tokens.tolist() == ref.token_ids[0].tolist()
        assert PEagleProposer(self.draft, cache=False).propose(state).tokens.tolist() == got.tokens.tolist()
        assert [len(c) for c in self.caches] == [state.aux.shape[0]] * len(self.caches)  # depth-0 slots only
        self.rounds = getattr(self, "rounds", 0) + 1
        return got


def test_registered_as_the_parallel_proposer(tiny, tiny_peagle):
    p = proposer_for(tiny_peagle)
    assert PROPOSERS["peagle"] is PEagleProposer and type(p) is PEagleProposer and p.kind == "parallel"
    assert p.max_k == p.default_k == p.trained_k == 4
    e = proposer_for(tiny.draft)  # a PEagleDraft is an Eagle3Draft subclass: the exact class decides
    assert type(e) is PROPOSERS["eagle3"] and (e.max_k, e.default_k, e.trained_k) == (None, 3, 3)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_greedy_speculative_equals_plain_and_propose_over_the_prefix(tiny, tiny_peagle, k):
    target = HFTarget(tiny.model, AUX_IDS)
    proposer = CheckedProposer(tiny_peagle)
    accepted = []
    for ids in tiny.prompts[:4]:
        plain = generate_plain(target, ids, max_new_tokens=24).tokens
        spec = generate_speculative(target, proposer, ids, k=k, max_new_tokens=24)
        assert spec.tokens == plain
        accepted += spec.accepted
    assert proposer.rounds == len(accepted)
    # both paths ran: rounds accepting several drafts (several new depth-0 slots) and rejections
    assert max(accepted) >= min(k, 2) and min(accepted) == 0
    assert acceptance_stats(accepted, k)["tau"] > 1.2  # the on-policy parallel draft really helps


def test_proposal_is_the_first_k_depths_of_one_forward(tiny, tiny_peagle):
    ids = tiny.prompts[0]
    target = HFTarget(tiny.model, AUX_IDS)
    target.reset()
    _, aux = target.forward(ids, aux=True)
    state = DecodeState(ids + [17], aux, len(ids), 4)
    full = PEagleProposer(tiny_peagle).propose(state).tokens
    state.k = 2
    assert PEagleProposer(tiny_peagle).propose(state).tokens.tolist() == full[:2].tolist()
    state.k = 5
    with pytest.raises(ValueError, match="num_depths=4"):
        PEagleProposer(tiny_peagle).propose(state)


def always_agree_peagle():
    """test_offline's always-agree target and draft, the draft a P-EAGLE one (fp32 eval)."""
    model, draft = always_agree(**PEAGLE)
    return model, draft.eval().requires_grad_(False)


class Corrupting(PEagleProposer):
    """The always-agree draft's proposal with one token wrong at a chosen depth per round."""

    def __init__(self, draft, wrong_at):
        super().__init__(draft)
        self.wrong_at, self.expected, self.round = wrong_at, [], 0

    def propose(self, state):
        prop = super().propose(state)
        assert prop.tokens.tolist() == [7] * state.k  # the draft's outputs are known
        w = self.wrong_at[self.round % len(self.wrong_at)]
        toks = prop.tokens.clone()
        if w < state.k:
            toks[w] = 8
        self.expected.append(min(w, state.k))
        self.round += 1
        return Proposal(toks)


def test_accepted_counts_stop_at_the_corrupted_depth():
    model, draft = always_agree_peagle()
    target = HFTarget(model, AUX_IDS)
    p = Corrupting(draft, wrong_at=[0, 3, 1, 9, 2])
    out = generate_speculative(target, p, [3, 9, 11], k=4, max_new_tokens=30)
    assert out.tokens == [7] * 30 and out.accepted == p.expected
    assert p.filled == target.length - (out.accepted[-1] + 1)  # the last round's commits are not drafted on yet


def test_sampling_q_is_each_depths_softmax_over_the_target_vocab(tiny, tiny_peagle):
    ids = tiny.prompts[1]
    target = HFTarget(tiny.model, AUX_IDS)
    target.reset()
    _, aux = target.forward(ids, aux=True)
    T = 0.7
    state = DecodeState(ids + [5], aux, len(ids), 3, temperature=T, generator=torch.Generator().manual_seed(0))
    logits = reference(tiny_peagle, state).logits[0]  # (3, Vd)
    expected = torch.zeros(3, tiny.model.config.vocab_size)
    expected[:, torch.as_tensor(tiny.draft_ids)] = torch.softmax(logits / T, -1)
    counts = torch.zeros(3, tiny.model.config.vocab_size)
    proposer, n = PEagleProposer(tiny_peagle), 1500
    for _ in range(n):
        prop = proposer.propose(state)
        proposer.reset()
        torch.testing.assert_close(prop.q, expected, atol=1e-6, rtol=1e-5)
        counts[torch.arange(3), prop.tokens] += 1
    # each depth is sampled from its own q: compare on 4 bins (its top-3 tokens and the rest), where
    # n = 1500 samples give a bin standard deviation <= 0.013
    top = expected.topk(3, -1).indices  # (3, 3)
    for d in range(3):
        emp, exp = (counts[d] / n)[top[d]], expected[d, top[d]]
        assert 0.5 * float((emp - exp).abs().sum() + (emp.sum() - exp.sum()).abs()) < 0.05, d
    assert (expected[0] - expected[2]).abs().sum() > 0.05  # the depths' distributions really differ
    # and a sampled generation runs through rejection sampling, reproducibly for a seed
    outs = [generate_speculative(target, PEagleProposer(tiny_peagle), ids, k=3, max_new_tokens=12, temperature=T,
                                 generator=torch.Generator().manual_seed(3)).tokens for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) == 12


def test_k_rules():
    model, draft = always_agree_peagle()
    p = PEagleProposer(draft)
    assert check_k(p, None, "peagle") == 4 and check_k(p, 2, "peagle") == 2
    with pytest.raises(EvalError, match=r"-k 5: this P-EAGLE \(parallel\) draft drafts 4 tokens per forward \(num_depths=4\)") as err:
        check_k(p, 5, "peagle")
    assert "pass -k between 1 and 4" in str(err.value)


def test_hook_uses_the_peagle_proposer_with_k_num_depths(tiny, tiny_peagle):
    stats = held_out_tau(tiny.model, tiny_peagle, AUX_IDS, tiny.prompts[:2], max_new_tokens=16)
    assert stats["k"] == 4 and len(stats["acceptance_per_position"]) == 4
    target, accepted = HFTarget(tiny.model, AUX_IDS), []
    for ids in tiny.prompts[:2]:
        accepted += generate_speculative(target, PEagleProposer(tiny_peagle), ids, k=4, max_new_tokens=16).accepted
    assert stats["tau"] == acceptance_stats(accepted, 4)["tau"] > 1.0


def test_missing_mask_hidden_is_a_one_line_error(tiny, tiny_peagle, tmp_path):
    d = save_vllm_layout(tiny_peagle, tmp_path / "pe")
    from safetensors.torch import load_file, save_file

    state = load_file(str(d / "model.safetensors"))
    save_file({k: v for k, v in state.items() if k != "mask_hidden"}, str(d / "model.safetensors"))
    with pytest.raises(EvalError, match="mask_hidden is missing") as err:
        load_draft(d, tiny.model.get_input_embeddings().weight)
    assert "\n" not in str(err.value) and str(d) in str(err.value)


@pytest.fixture()
def prompts_file(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({"id": f"q{i}", "category": "c", "turns": [q]}) + "\n"
                         for i, q in enumerate(["Tell me a joke about cats.", "Explain recursion."])))
    return p


def test_eval_cli_reports_k_columns_and_refuses_k_over_num_depths(tiny, tiny_peagle, tmp_path, prompts_file, capsys):
    run = save_checkpoint_layout(tiny_peagle, tmp_path / "run", tiny.path)
    out = tmp_path / "out"
    assert main(["eval", "--draft", str(run), "--prompts", str(prompts_file), "--max-new-tokens", "12",
                 "--out", str(out), "--quiet", "--ignore-eos", "--no-plot"]) == 0  # no -k: num_depths
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["k"] == 4 and len(rep["overall"]["acceptance_per_position"]) == 4
    assert rep["lossless"] == {"checked": 2, "mismatches": []}
    assert "lossless check vs plain greedy: 2/2 identical" in capsys.readouterr().out
    code = main(["eval", "--draft", str(run), "--prompts", str(prompts_file), "-k", "5", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_BAD_INPUT and "\n" not in err
    assert err.startswith("draftsmith: error: -k 5:") and "num_depths=4" in err and "between 1 and 4" in err


def test_cli_trained_peagle_runs_the_hook_and_evaluates(tmp_path, prompts_file, capsys):
    """`draftsmith train` with draft.type peagle (real-tau hook at K = num_depths), then `draftsmith eval`."""
    from fixtures import make_tiny_llama, make_tokenizer, write_jsonl

    target = make_tiny_llama(tmp_path / "target", make_tokenizer("chatml"), num_layers=4, hidden=64)
    rows = [{"messages": [{"role": "user", "content": f"Tell me about {i}."},
                          {"role": "assistant", "content": f"The number {i} is quick and lazy."}]} for i in range(8)]
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({
        "target": {"path": str(target), "aux_layer_ids": AUX_IDS},
        "data": {"sources": [str(write_jsonl(tmp_path / "chats.jsonl", rows))], "max_length": 64, "eval_size": 2,
                 "draft_vocab_size": 96},
        "draft": {"type": "peagle", "mask_token_id": 383, "num_draft_layers": 2, "num_depths": 4},
        "train": {"max_steps": 2, "batch_size": 2, "spec_eval_every": 1, "spec_eval_prompts": 2},
        "output": {"dir": str(tmp_path / "run"), "tensorboard": False},
    }))
    assert main(["train", str(cfg), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert err.count("real tau") == 2 and "(K=4, 2 held-out prompts, simulated tau" in err
    out = tmp_path / "out"
    assert main(["eval", "--draft", str(tmp_path / "run"), "--prompts", str(prompts_file), "--max-new-tokens", "8",
                 "-k", "3", "--out", str(out), "--quiet", "--ignore-eos", "--no-plot"]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["k"] == 3 and len(rep["overall"]["acceptance_per_position"]) == 3
    assert rep["lossless"] == {"checked": 2, "mismatches": []}
