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
