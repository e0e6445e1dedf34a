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
