"""draftsmith.eval.costmodel against hand-computed values, and the whole fit on a synthetic engine
whose costs are known (every number here is worked out in the comments)."""

import pytest

from draftsmith.eval import EvalError
from draftsmith.eval.costmodel import (CostModel, Method, acceptance, fit_batch, fit_line, plain_step_s, predict,
                                       predict_all, probe_fit, recommend, set_speedup, spec_step_s)


def test_fit_line_and_probe_fit():
    assert fit_line([0, 1, 2], [1, 3, 5]) == pytest.approx((1.0, 2.0))
    assert fit_line([3, 3], [1, 2]) == (1.5, 0.0)  # one distinct x: flat line through the mean
    # minima 10, 12, 14 at x = 0, 1, 2 (the disturbed 11 and 100 s are ignored): slope 2, intercept 10
    a, b = probe_fit({1: [10, 11, 100], 2: [12], 3: [14, 14]})
    assert (a, b) == pytest.approx((10.0, 2.0))
    assert probe_fit({1: [2.0], 2: [1.0]})[1] == 0.0  # noise that makes tokens look free is clipped
    with pytest.raises(EvalError, match="at least two"):
        probe_fit({1: [1.0]})


def test_step_times_from_whole_request_walls():
    # 4 requests, 104 tokens: 100 decode tokens in 1.1 - 0.1 = 1.0 s -> 10 ms a step; at batch 2, 50 steps
    assert plain_step_s(1.1, 0.1, 104, 4) == pytest.approx(0.01)
    assert plain_step_s(1.1, 0.1, 104, 4, batch=2) == pytest.approx(0.02)
    # 40 accepted: 100 decode tokens in 60 steps, 50 with a draft (f = 5/6): 1.0 s / 60 a step
    assert spec_step_s(1.1, 0.1, 104, 4, accepted=40, drafts=50) == pytest.approx((1 / 60, 50 / 60))
    assert spec_step_s(1.1, 0.1, 104, 4, accepted=40, drafts=50, batch=2) == pytest.approx((2 / 60, 50 / 60))
    with pytest.raises(EvalError, match="nothing was drafted"):
        spec_step_s(1.1, 0.1, 104, 4, accepted=0, drafts=0)
    with pytest.raises(EvalError, match="raise --max-tokens"):
        plain_step_s(0.1, 0.1, 4, 4)
    assert acceptance([30, 15], 50) == [0.6, 0.3]


def test_predict_by_hand():
    model = CostModel(t_plain=0.01, c1=0.1)
    ngram = Method("ngram", "ngram", c0=1.2, f=0.5, u=[0.6, 0.3], kmax=2)
    # E = 1 + 0.5 (0.6 + 0.3) = 1.45; T = 0.01 x 1.2 + 0.5 (0.01 x 0.1 x 2) = 12 + 1 = 13 ms
    r = predict(model, ngram, 2)
    assert (r["tokens_per_step"], r["step_s"]) == pytest.approx((1.45, 0.013))
    assert (r["tokens_per_s"], r["speedup"]) == pytest.approx((1.45 / 0.013, 1.45 / 0.013 / 100))
    chain = Method("eagle3", "draft", c0=1.1, draft_s=0.002, u=[0.5, 0.25], kmax=2)
    # K=1: E 1.5, step 0.01 (1.1 + 0.1) + 1 x 2 ms = 14 ms; K=2: E 1.75, step 13 ms + 2 x 2 ms = 17 ms
    assert predict(model, chain, 1)["tokens_per_s"] == pytest.approx(1.5 / 0.014)
    assert predict(model, chain, 2)["tokens_per_s"] == pytest.approx(1.75 / 0.017)
    one = Method("peagle", "draft", c0=1.1, draft_s=0.002, one_forward=True, u=[0.5, 0.25], kmax=2)
    assert predict(model, one, 2)["step_s"] == pytest.approx(0.015)  # one forward drafts both
    # batch 4, 20 ms a plain step: T = 24 ms + 0.5 x 4 ms; four sequences advance together
    assert predict(CostModel(t_plain=0.02, c1=0.1, batch=4), ngram, 2)["tokens_per_s"] == pytest.approx(4 * 1.45 / 0.026)
    with pytest.raises(EvalError, match="K <= 2"):
        predict(model, ngram, 3)

    rows = predict_all(model, [ngram, chain])
    assert [r["name"] for r in rows] == ["none", "ngram K=1", "ngram K=2", "eagle3 K=1", "eagle3 K=2"]
    assert recommend(rows)["name"] == "ngram K=2"  # 111.5 tok/s; none 100, ngram K=1 104, eagle3 107.1 / 102.9
    assert recommend([rows[0], {**rows[0], "name": "tie"}])["name"] == "none"  # ties keep no speculation
    # on the set: 0.1 s first-token pass + 100 decode tokens; plain 1.1 s, ngram K=2 0.1 + 100 x 13/1.45 ms
    assert set_speedup(rows[2], model, wall_first=0.1, tokens=104, requests=4) == pytest.approx(1.1 / (0.1 + 1.3 / 1.45))


def synthetic(t_plain, beta, overhead, draft_s, u, f, k, one_forward=False, *, tokens=404, requests=4, first=0.2):
    """What a server would measure on an engine that costs exactly what the model says: the accepted
    counts follow u and f; every step costs t_plain + overhead, a drafted one also beta K + n_fwd draft_s."""
    # tokens - requests = S + A with A = D * sum(u) and D = f S  ->  S = (N - R) / (1 + f sum(u))
    steps = (tokens - requests) / (1 + f * sum(u))
    drafts = f * steps
    wall = first + steps * (t_plain + overhead) + drafts * (beta * k + (1 if one_forward else k) * draft_s)
    return {"wall_first": first, "wall_full": wall, "tokens": tokens, "requests": requests, "drafts": drafts,
            "accepted": drafts * sum(u), "per_position": [drafts * x for x in u]}


def test_fit_batch_recovers_a_synthetic_engine():
    t_plain, beta, overhead = 0.010, 0.001, 0.002  # 10 ms a step, 1 ms a drafted token, 2 ms per spec step
    plain = {"wall_first": 0.2, "wall_full": 0.2 + 400 * t_plain, "tokens": 404, "requests": 4,
             "probes": {j: [0.005 + t_plain + beta * (j - 1)] * 3 for j in range(1, 5)}}
    ngram = {**synthetic(t_plain, beta, overhead, 0.0, [0.6, 0.3, 0.1], 0.5, 3), "kind": "ngram", "label": "ngram", "k": 3}
    draft = {**synthetic(t_plain, beta, overhead, 0.003, [0.7, 0.4, 0.2], 1.0, 3), "kind": "draft", "label": "d",
             "k": 3, "one_forward": False}
    model, methods, notes = fit_batch(plain, [ngram, draft])
    assert notes == [] and model.t_plain == pytest.approx(t_plain) and model.c1 == pytest.approx(0.1)
    ng, d = methods
    assert (ng.c0, ng.f, *ng.u) == pytest.approx((1.2, 0.5, 0.6, 0.3, 0.1))
    assert (d.c0, d.draft_s, d.f) == pytest.approx((1.2, 0.003, 1.0))
    # predictions at every K equal the synthetic engine's true speed: b E / T with its own costs
    for k in (1, 2, 3):
        true_ng = (1 + 0.5 * sum([0.6, 0.3, 0.1][:k])) / (t_plain + overhead + 0.5 * beta * k)
        true_d = (1 + sum([0.7, 0.4, 0.2][:k])) / (t_plain + beta * k + overhead + k * 0.003)
        assert predict(model, ng, k)["tokens_per_s"] == pytest.approx(true_ng)
        assert predict(model, d, k)["tokens_per_s"] == pytest.approx(true_d)
    dead = {**ngram, "drafts": 0, "accepted": 0, "per_position": [0, 0, 0]}
    assert fit_batch(plain, [dead])[2] == ["ngram K=3: drafted nothing at batch 1; left out"]


def test_a_step_faster_than_a_plain_step_floors_c0_and_says_so():
    # the ngram pass ran while the machine was much faster than during the plain pass: its mean step (0.5 ms)
    # is below the plain step (10 ms) by more than a step: c0 = 1 + (0.5 - 10 - 0.5 x 1 x 2) / 10 = -0.05, which
    # predicts a negative step time; it is taken as 1 (no overhead: a speculative step runs the target at least
    # once) with a note, and every prediction stays positive
    t_plain, beta = 0.010, 0.001
    plain = {"wall_first": 0.2, "wall_full": 0.2 + 400 * t_plain, "tokens": 404, "requests": 4,
             "probes": {j: [0.005 + t_plain + beta * (j - 1)] * 3 for j in range(1, 5)}}
    fast = {**synthetic(0.0005, 0.0, 0.0, 0.0, [0.6, 0.3], 0.5, 2), "kind": "ngram", "label": "ngram", "k": 2}
    model, (ng,), notes = fit_batch(plain, [fast])
    assert ng.c0 == 1.0 and len(notes) == 1 and "taken as 1" in notes[0] and "ngram K=2" in notes[0]
    for k in (1, 2):
        row = predict(model, ng, k)
        assert row["step_s"] >= model.t_plain and row["tokens_per_s"] > 0
        assert set_speedup(row, model, wall_first=0.2, tokens=404, requests=4) > 0
