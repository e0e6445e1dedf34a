"""draftsmith.eval.speedup without a server: configurations, best K per kind, the one-line summary,
prompt rendering, and the refusals that must come before any (slow) server start."""

import pytest

from draftsmith.data.formats import DataError
from draftsmith.eval import EvalError
from draftsmith.eval.prompts import EvalPrompt, render_prompt
from draftsmith.eval.speedup import (best_by_kind, configurations, describe_prompt_set, measure, one_line,
                                     outputs_identical, render_prompts, tokens_per_step)
from fixtures import make_tokenizer


def result(label, k, tps, tau=1.0, kind=None):
    kind = kind or ("none" if label == "none" else "ngram" if label == "ngram" else "draft")
    return {"name": "none" if kind == "none" else f"{label} K={k}", "kind": kind, "label": label, "k": k,
            "tokens_per_s": tps, "tau": tau, "outputs": [[1, 2]]}


RESULTS = [result("none", 0, 22.1), result("ngram", 1, 24.0, 1.5), result("eagle3", 1, 24.0, 1.29),
           result("ngram", 3, 26.4, 2.31), result("eagle3", 3, 23.0, 2.0), result("ngram", 5, 25.0, 2.5)]


def test_configurations_baseline_first_then_per_k_ngram_and_each_draft():
    names = [c["name"] for c in configurations(["eagle3", "peagle"], [1, 3])]
    assert names == ["none", "ngram K=1", "eagle3 K=1", "peagle K=1", "ngram K=3", "eagle3 K=3", "peagle K=3"]
    assert [c["name"] for c in configurations(["d"], [2], ngram=False)] == ["none", "d K=2"]
    # the demo's check: ngram at its own K, the draft at others, in K order
    assert [c["name"] for c in configurations(["d"], [1, 2], ngram_ks=[3])] == ["none", "d K=1", "d K=2", "ngram K=3"]
    # a block draft at its own K list, a chain at -k's
    names = [c["name"] for c in configurations(["e3", "df"], [1, 3], draft_ks={"df": [3, 15]})]
    assert names == ["none", "ngram K=1", "e3 K=1", "ngram K=3", "e3 K=3", "df K=3", "df K=15"]
    with pytest.raises(EvalError, match="draft 'df': K 0 must be an integer >= 1"):
        configurations(["df"], [1], draft_ks={"df": [0]})


def test_suffix_runs_beside_ngram_at_ngrams_k():
    names = [c["name"] for c in configurations(["d"], [1, 2], ngram_ks=[3], suffix=True)]
    assert names == ["none", "d K=1", "d K=2", "ngram K=3", "suffix K=3"]
    assert [c["kind"] for c in configurations([], [2], suffix=True)] == ["none", "ngram", "suffix"]
    assert [c["name"] for c in configurations(["d"], [2], ngram=False, suffix=True)] == ["none", "d K=2"]
    with pytest.raises(EvalError, match="label 'suffix' is reserved for a baseline"):
        configurations(["suffix"], [1])


def test_baseline_specs_are_what_vllm_reads():
    from draftsmith.eval.baselines import spec

    assert spec("ngram", 3) == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
                                "prompt_lookup_max": 4}
    assert spec("suffix", 4) == {"method": "suffix", "num_speculative_tokens": 4}
    # a measurement that decodes a prompt twice must not let the global response tree replay the first answer
    assert spec("suffix", 4, repeats=True)["suffix_decoding_max_cached_requests"] == 0
    assert "suffix_decoding_max_cached_requests" not in spec("ngram", 4, repeats=True)
    with pytest.raises(ValueError, match="baseline kind 'eagle3': expected one of"):
        spec("eagle3", 1)
    # every key is a field of the installed vLLM's SpeculativeConfig
    vllm_spec = pytest.importorskip("vllm.config.speculative")
    fields = set(vllm_spec.SpeculativeConfig.__dataclass_fields__)
    assert set(spec("suffix", 4, repeats=True)) <= fields and set(spec("ngram", 3)) <= fields


@pytest.mark.parametrize("labels, ks, msg", [
    (["d"], [], r"ks: \[\] must be one or more integers >= 1"),
    (["d"], [0, 3], r"ks: \[0, 3\] must be"),
    (["ngram"], [1], "label 'ngram' is reserved for a baseline; name the draft otherwise"),
])
def test_configurations_refuse_bad_input_in_one_line(labels, ks, msg):
    with pytest.raises(EvalError, match=msg):
        configurations(labels, ks)


def test_best_by_kind_keeps_the_fastest_k_per_label():
    best = best_by_kind(RESULTS)
    assert list(best) == ["none", "ngram", "eagle3"]
    assert (best["ngram"]["k"], best["eagle3"]["k"], best["none"]["k"]) == (3, 1, 0)


def test_one_line_reads_as_a_sentence():
    line = one_line(RESULTS, prompts=describe_prompt_set("mt_bench", 6))
    assert line == ("real speed on 6 held-out MT-Bench prompts (vLLM, batch 1): no speculation 22.1 tok/s | "
                    "ngram K=3 26.4 tok/s (1.19x, tau 2.31) | eagle3 K=1 24.0 tok/s (1.09x, tau 1.29)")
    # an explicit baseline (e.g. measured earlier) replaces the "none" result
    other = one_line(RESULTS[1:2], baseline=result("none", 0, 12.0), prompts="3 prompts from p.jsonl")
    assert other.endswith("no speculation 12.0 tok/s | ngram K=1 24.0 tok/s (2.00x, tau 1.50)")
    with pytest.raises(EvalError, match="no baseline without speculation among the results"):
        one_line(RESULTS[1:])


def test_tokens_per_step_counts_every_forward_not_only_the_drafted_ones():
    # 9 mixed prompts, 2026-12-07: ngram K=3 drafted on 213 steps and accepted 387 tokens of 995, so
    # vLLM's tau is 1 + 387/213 = 2.82, yet the 995 tokens took 995 - 387 = 608 forwards: 1.64 a forward
    assert tokens_per_step(995, 387) == pytest.approx(995 / 608)
    assert 1 + 387 / 213 == pytest.approx(2.82, abs=0.005)
    # a chain draft that drafts on every forward: the two figures agree (600 tokens, 300 forwards, 300 accepted)
    assert tokens_per_step(600, 300) == 2.0 == 1 + 300 / 300
    assert tokens_per_step(10, 0) == 1.0 and tokens_per_step(0, 0) == 1.0


def test_one_line_gives_tokens_per_step_where_measured():
    rows = [result("none", 0, 20.0), {**result("ngram", 5, 30.0, 3.5), "tokens_per_step": 1.78},
            {**result("eagle3", 3, 25.0, 1.77), "tokens_per_step": 1.77}]
    assert one_line(rows, prompts="9 prompts").endswith(
        "ngram K=5 30.0 tok/s (1.50x, tau 3.50, 1.78 tokens/step) | eagle3 K=3 25.0 tok/s (1.25x, tau 1.77, "
        "1.77 tokens/step)")


def test_describe_prompt_set_names_shipped_sets_and_files():
    assert describe_prompt_set("mixed", 9) == "9 held-out mixed (chat, math, code, long) prompts"
    assert describe_prompt_set("my/p.jsonl", 2) == "2 prompts from my/p.jsonl"


def test_outputs_identical():
    assert outputs_identical(RESULTS)
    assert not outputs_identical(RESULTS + [{**RESULTS[0], "outputs": [[1, 3]]}])


def test_render_prompts_use_the_chat_template_and_pass_template_kwargs():
    tok = make_tokenizer("chatml")
    p = EvalPrompt("a", "c", ["Hello there", "ignored second turn"], context=[{"role": "system", "content": "Be brief."}])
    ids = render_prompts(tok, [p, "Hi"])
    assert ids[0] == render_prompt(tok, [{"role": "system", "content": "Be brief."},
                                         {"role": "user", "content": "Hello there"}])
    assert ids[1] == render_prompt(tok, [{"role": "user", "content": "Hi"}])
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!!{% endif %}"
    assert tok.decode(render_prompts(tok, ["ab"], {"shout": True})[0]) == "ab!!"
    assert tok.decode(render_prompts(tok, ["ab"])[0]) == "ab"
    with pytest.raises(EvalError, match="chat_template_kwargs: expected a JSON object, got list"):
        render_prompts(tok, ["ab"], ["shout"])
    with pytest.raises(DataError, match="chat_template_kwargs: tokenize cannot be overridden"):
        render_prompts(tok, ["ab"], {"tokenize": True})


def test_measure_refuses_prompts_that_overflow_the_context_before_starting_a_server(tmp_path):
    with pytest.raises(EvalError, match=r"prompts\[1\]: 2000 tokens \+ max_tokens 128 > max_model_len 2048"):
        measure("unused-target", {}, [3], [[1] * 10, [1] * 2000], 128, log_dir=tmp_path)
    with pytest.raises(EvalError, match="prompts: empty"):
        measure("unused-target", {}, [3], [], 128, log_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing started, no log written


def test_serve_prompt_sets_times_each_set_on_one_server_with_its_own_counter_diff(tmp_path):
    # A child process with vLLM's HTTP surface (fake_vllm_server.py: 2 drafts, n // 2 accepted and one
    # at position 0 per completion of n tokens), so the per-set arithmetic is checkable by hand.
    import socket
    import sys
    from pathlib import Path

    from draftsmith.eval.speedup import run_config, serve_prompt_sets
    from draftsmith.serve.process import free_port

    script = str(Path(__file__).with_name("fake_vllm_server.py"))
    port = free_port()
    sets = {"a": [[1, 2, 3, 4, 5, 6]], "b": [[5, 6], [7, 8, 9, 10, 11, 12]]}
    out = serve_prompt_sets("fake K=2", [sys.executable, script, str(port)], port, sets, 5, tmp_path / "a.log",
                            ready_s=60)
    assert list(out) == ["a", "b"]
    a, b = out["a"], out["b"]  # the warm-up request before "a" is in neither diff
    assert (a["drafts"], a["accepted"], a["draft_tokens"], a["tau"], a["per_position"]) == (2, 3, 4, 2.5, [0.5])
    assert (b["drafts"], b["accepted"], b["draft_tokens"], b["tau"], b["per_position"]) == (4, 4, 8, 2.0, [0.5])
    assert a["outputs"] == [[1, 2, 3, 4, 5]] and b["outputs"] == [[5, 6], [7, 8, 9, 10, 11]]
    assert (a["tokens"], b["tokens"]) == (5, 7) and a["name"] == b["name"] == "fake K=2"
    assert a["tokens_per_s"] > 0 and a["ready_s"] == b["ready_s"]
    # tokens / (tokens - accepted): 5 / 2 and 7 / 3 forwards
    assert (a["tokens_per_step"], b["tokens_per_step"]) == (pytest.approx(5 / 2), pytest.approx(7 / 3))
    with pytest.raises(OSError):  # the server is stopped on the way out
        socket.create_connection(("127.0.0.1", port), timeout=1)
    # run_config is the one-set case
    port = free_port()
    one = run_config("fake", [sys.executable, script, str(port)], port, sets["b"], 5, tmp_path / "b.log", ready_s=60)
    assert (one["drafts"], one["accepted"], one["tau"], one["outputs"]) == (4, 4, 2.0, b["outputs"])



def test_a_sigterm_while_a_server_is_up_stops_that_server(tmp_path):
    """serve_prompt_sets under SIGTERM (bench/serve_speedup.py killed mid-pass, the demo's check under a
    scheduler): the process exits 143 and the server it started is gone, not left serving on its port."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from deadline import wait_until

    # fake_vllm_server.py --hang: its first completion (the warm-up) writes the server's pid and never returns
    script = str(Path(__file__).with_name("fake_vllm_server.py"))
    pid_file = tmp_path / "server.pid"
    code = (f"from draftsmith.eval.speedup import serve_prompt_sets\n"
            f"from draftsmith.serve.process import free_port\n"
            f"port = free_port()\n"
            f"serve_prompt_sets('none', [{sys.executable!r}, {script!r}, str(port), '--hang', {str(pid_file)!r}], "
            f"port, {{'p': [[1, 2, 3]]}}, 4, {str(tmp_path / 's.log')!r}, ready_s=60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: pid_file.exists() or child.poll() is not None,
                   what="the warm-up request reaching the stand-in server")
        assert child.poll() is None, child.stderr.read()
        server = int(pid_file.read_text())
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 143
        # the server's group got SIGTERM (then SIGKILL after stop_s) on the way out
        wait_until(lambda: not os.path.exists(f"/proc/{server}") or "Z" in open(f"/proc/{server}/stat").read().split()[2],
                   seconds=120, what="the stand-in server exiting")
    finally:
        child.kill()
        if pid_file.exists():
            try:
                os.killpg(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
