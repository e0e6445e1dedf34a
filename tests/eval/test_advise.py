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
             "measured": {"speedup": 0.7, "tokens_per_s": 14.0, "plain_tokens_per_s": 20.0, "tau": 1.5,
                          "speedup_rounds": [0.72, 0.7, 0.65]}}
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
    assert ("best speculative: ngram K=1, predicted 0.750x, measured 0.700x (14.0 vs 20.0 tok/s without speculation, "
            "timed in alternation, 3 rounds 0.65x-0.72x;") in text
    assert "prediction +7.1%" in text and text.endswith("serve it: vllm serve T")
    report["data"] = {"mine": "0.50 passes over 291 conversations: ..."}
    assert format_report(report).endswith("serve it: vllm serve T\ndata (mine): 0.50 passes over 291 conversations: ...")


def test_advise_quotes_the_data_rule_for_drafts_whose_checkpoint_records_their_data(tmp_path):
    """A checkpoint's meta.json (2 + 30/60 passes over 60 conversations) gives a line; an export without
    one, and a hub draft, give none."""
    import json

    from draftsmith.eval.advise_cli import data_rules
    from draftsmith.serve.resolve import Draft

    ckpt = tmp_path / "epoch_2_step_9"
    (ckpt / "model" / "consolidated").mkdir(parents=True)
    (ckpt / "meta.json").write_text(json.dumps({"data_order": {"train conversations": 60}, "data_epoch": 2,
                                                "row_pos": 30}))
    (tmp_path / "export").mkdir()
    rules = data_rules({"mine": Draft("c", ckpt / "model" / "consolidated"), "exported": Draft("e", tmp_path / "export"),
                        "hub": Draft("org/name")})
    assert list(rules) == ["mine"] and rules["mine"].startswith("2.50 passes over 60 conversations")
    assert "regenerate about 120 conversations" in rules["mine"]


def test_paired_passes_alternate_with_the_other_server_paused(monkeypatch):
    """vLLM's idle worker spins for 1 s after its last request, so a pass of one server runs with the
    other paused (and itself running); plain and speculative alternate pass by pass, the order
    flipped every round, the walls per round are each server's own, and both run again at the end."""
    from draftsmith.eval import advise

    monkeypatch.setattr(advise, "settled_counters", lambda client, base: {})
    monkeypatch.setattr(advise, "counter_diff", lambda a, b: {"drafts": 0, "accepted": 0, "per_position": {}})
    events = []

    class Fake:
        client = base = None
        prompts = [[1, 2], [3, 4], [5, 6]]

        def __init__(self, name, step_s):
            self.name, self.step_s, self.paused, self.other = name, step_s, False, None

        def pause(self):
            self.paused = True

        def resume(self):
            self.paused = False

        def timed(self, jobs, n, b):
            assert not self.paused and self.other.paused, self.name
            events.append((self.name, n))
            return [[7] * n for _ in jobs], self.step_s * n * len(jobs)

    plain, spec = Fake("plain", 0.010), Fake("spec", 0.004)
    plain.other, spec.other = spec, plain
    walls, outs, _ = advise._paired(plain, spec, 1, 8, 2)
    assert outs == [[7] * 8] * 3
    assert events[::3] == [("plain", 1), ("spec", 1), ("plain", 8), ("spec", 8),  # round 0: plain first
                           ("spec", 1), ("plain", 1), ("spec", 8), ("plain", 8)]  # round 1: flipped
    assert not plain.paused and not spec.paused
    expected = {"plain_first": 3 * 0.010, "first": 3 * 0.004, "plain_full": 3 * 0.080, "full": 3 * 0.032}
    assert walls.keys() == expected.keys()
    for key, per_pass in expected.items():
        assert walls[key] == pytest.approx([per_pass] * 2), key
    assert advise.paired_ratio(walls, "full") == pytest.approx(0.4)


def test_paired_ratio_is_the_median_of_per_round_ratios():
    """One disturbed pass (round 2's speculative one, 3x slow) leaves the ratio at the undisturbed
    rounds' 0.5, where summed walls would read (0.5 + 0.5 + 3 + 0.5 + 0.5) / 5 = 1.0."""
    from draftsmith.eval import advise

    walls = {"plain_full": [1.0, 1.1, 1.0, 0.9, 1.0], "full": [0.5, 0.55, 3.0, 0.45, 0.5],
             "plain_first": [0.2, 0.2, 0.4], "first": [0.1, 0.3, 0.2]}
    assert advise.paired_ratio(walls, "full") == pytest.approx(0.5)
    assert advise.paired_ratio(walls, "first") == pytest.approx(0.5)  # ratios 0.5, 1.5, 0.5
