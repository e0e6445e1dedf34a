"""Prompt files: MT-bench style turns, OpenAI / ShareGPT conversations, rendering, one-line errors."""

import json
from pathlib import Path

import pytest

from draftsmith.data.formats import DataError
from draftsmith.eval.prompts import load_prompts, render_prompt
from fixtures import make_tokenizer, write_jsonl

SHARED = Path("/work/shared/data/mt_bench.jsonl")


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


@pytest.mark.skipif(not SHARED.is_file(), reason="shared MT-bench file not present")
def test_shared_mt_bench_file_loads():
    prompts = load_prompts(SHARED)
    assert len(prompts) == 80 and all(len(p.turns) == 1 for p in prompts)
    assert len({p.category for p in prompts}) == 8
