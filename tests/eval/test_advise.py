"""``draftsmith advise`` bad input: one line, exit 2, before any server starts (fast, no vLLM run),
and the pieces of its output that need no engine."""

import importlib.util
import sys

import pytest
import torch

from draftsmith.cli import main
from draftsmith.eval import EvalError
from draftsmith.eval.advise import serve_command, suffix_support, time_server
from eval_helpers import save_vllm_layout, draft_for
from fixtures import make_tiny_llama, make_tokenizer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("advise") / "target", make_tokenizer("chatml"), num_layers=2)


def one_line_error(capsys, needle):
    err = capsys.readouterr().err.strip()
    assert err.startswith("draftsmith: error:") and "\n" not in err and needle in err, err
    return err


def test_no_vllm_is_a_one_line_error(target, capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    assert main(["advise", "--target", str(target), "--prompts", "mt_bench"]) == 2
    one_line_error(capsys, "pip install vllm")


def test_unknown_prompt_set_is_a_one_line_error(target, capsys):
    assert main(["advise", "--target", str(target), "--prompts", "no_such_set"]) == 2
    one_line_error(capsys, "'no_such_set' not found")


def test_draft_for_another_target_is_a_one_line_error(target, tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    other = LlamaForCausalLM(LlamaConfig(vocab_size=384, hidden_size=96, intermediate_size=128, num_hidden_layers=4,
                                         num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=256))
    draft = save_vllm_layout(draft_for(other), tmp_path / "draft")
    assert main(["advise", "--target", str(target), "--draft", str(draft), "--prompts", "mt_bench"]) == 2
    one_line_error(capsys, "another target")


def test_a_server_that_does_not_start_is_a_one_line_error(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
    with pytest.raises(EvalError, match="did not start") as e:
        time_server(argv, 1, tmp_path / "s.log", [[1, 2, 3]], [1], 4, ready_s=30)
    assert "\n" not in str(e.value) and str(tmp_path / "s.log") in str(e.value)


def test_serve_commands_and_suffix_note():
    t = "/m/target"
    assert serve_command(t, {"kind": "none", "k": 0}) == "vllm serve /m/target"
    assert serve_command(t, {"kind": "ngram", "k": 2}, dtype="float32") == (
        "vllm serve /m/target --dtype float32 --speculative-config '{\"method\": \"ngram\", "
        "\"num_speculative_tokens\": 2, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}'")
    assert serve_command(t, {"kind": "draft", "k": 1}, draft_source="runs/d") == (
        "draftsmith serve vllm --target /m/target --draft runs/d --num-speculative-tokens 1")
    ok, why = suffix_support()
    assert isinstance(ok, bool) and why  # either way the report says why


def test_format_report_puts_predicted_and_measured_side_by_side():
    from draftsmith.eval.advise_cli import format_report

    none = {"name": "none", "method": "none", "kind": "none", "k": 0, "tokens_per_step": 1.0, "step_s": 0.04,
            "tokens_per_s": 25.0, "speedup": 1.0, "set_speedup": 1.0,
            "measured": {"speedup": 1.0, "tokens_per_s": 20.0, "plain_tokens_per_s": 20.0, "tau": 1.0}}
    ngram = {"name": "ngram K=1", "method": "ngram", "kind": "ngram", "k": 1, "tokens_per_step": 1.1, "step_s": 0.06,
             "tokens_per_s": 18.3, "speedup": 0.73, "set_speedup": 0.75,
             "measured": {"speedup": 0.7, "tokens_per_s": 14.0, "plain_tokens_per_s": 20.0, "tau": 1.5}}
    report = {"target": "T", "n_prompts": 2, "max_tokens": 8, "dtype": "float32", "kmax": 1,
              "suffix": {"note": "no suffix"},
              "per_batch": [{"batch": 1, "t_plain_s": 0.04, "plain_tokens_per_s": 20.0, "c1": 0.05, "notes": [],
                             "methods": [{"name": "ngram", "c0": 1.4, "draft_s": 0.0, "one_forward": False, "f": 0.2,
                                          "u": [0.5]}],
                             "predictions": [none, ngram], "recommendation": none, "measured": none["measured"],
                             "command": "vllm serve T"}]}
    text = format_report(report)
    assert "| none | - | 1.000 | 40.00 | 25.0 | 1.000x <- |" in text
    assert "recommendation at batch 1: none, predicted 1.000x, measured 1.000x" in text
    # (0.75 - 0.7) / 0.7 = +7.1%
    assert "best speculative: ngram K=1, predicted 0.750x, measured 0.700x (14.0 vs 20.0 tok/s" in text
    assert "prediction +7.1%" in text and text.endswith("serve it: vllm serve T")


def test_paired_passes_alternate_and_start_once_the_other_server_settled(monkeypatch):
    """vLLM's idle worker spins for 1 s after its last request, so a pass of one server starts only
    once the other has been idle SETTLE_S; plain and speculative alternate pass by pass, the order
    flipped every round, and the summed walls are each server's own (fake servers on a fake clock)."""
    from draftsmith.eval import advise

    clock = [0.0]
    monkeypatch.setattr(advise, "time", type("T", (), {"perf_counter": staticmethod(lambda: clock[0]),
                                                       "sleep": staticmethod(lambda s: clock.__setitem__(0, clock[0] + s))}))
    monkeypatch.setattr(advise, "settled_counters", lambda client, base: {})
    monkeypatch.setattr(advise, "counter_diff", lambda a, b: {"drafts": 0, "accepted": 0, "per_position": {}})
    events = []

    class Fake:
        client = base = None
        prompts = [[1, 2], [3, 4], [5, 6]]
        wait_idle = advise.Served.wait_idle

        def __init__(self, name, step_s):
            self.name, self.step_s, self.idle_since = name, step_s, 0.0

        def timed(self, jobs, n, b):
            start = clock[0]
            clock[0] += self.step_s * n * len(jobs)
            self.idle_since = clock[0]
            events.append((self.name, n, start, clock[0]))
            return [[7] * n for _ in jobs], clock[0] - start

    plain, spec = Fake("plain", 0.010), Fake("spec", 0.004)
    tot, outs, _ = advise._paired(plain, spec, 1, 8, 2)
    assert outs == [[7] * 8] * 3
    passes = [(name, n) for i, (name, n, *_rest) in enumerate(events) if i % 3 == 0]
    assert passes == [("plain", 1), ("spec", 1), ("plain", 8), ("spec", 8),  # round 0: plain first
                      ("spec", 1), ("plain", 1), ("spec", 8), ("plain", 8)]  # round 1: flipped
    for i, (name, _, start, _end) in enumerate(events):
        other_end = max((e for n2, _, _, e in events[:i] if n2 != name), default=None)
        if other_end is not None:
            assert start >= other_end + advise.SETTLE_S - 1e-9, (i, events[i])  # the other one had settled
    assert tot == pytest.approx({"plain_first": 2 * 3 * 0.010, "first": 2 * 3 * 0.004,
                                 "plain_full": 2 * 3 * 0.080, "full": 2 * 3 * 0.032})
