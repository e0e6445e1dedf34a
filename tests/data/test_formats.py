import pytest

from draftsmith.data.formats import DataError, normalize_conversation


def test_openai_messages_pass_through_and_parts_are_joined():
    row = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hi."},
        ]
    }
    assert normalize_conversation(row) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": "Hi."},
    ]


def test_sharegpt_roles_map_and_leading_assistant_is_dropped():
    row = {
        "id": "x",
        "conversations": [
            {"from": "gpt", "value": "Greeting nobody asked for."},
            {"from": "human", "value": "Q1"},
            {"from": "chatgpt", "value": "A1"},
            {"from": "user", "value": "Q2"},
            {"from": "bard", "value": "A2"},
            {"from": "human", "value": "Q3"},
            {"from": "bing", "value": "A3"},
        ],
    }
    assert normalize_conversation(row) == [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Q3"},
        {"role": "assistant", "content": "A3"},
    ]


def test_role_content_inside_conversations_and_system_from():
    row = {"conversations": [{"from": "system", "value": "S"}, {"role": "user", "content": "U"},
                             {"role": "assistant", "content": "A"}]}
    assert [m["role"] for m in normalize_conversation(row)] == ["system", "user", "assistant"]


def test_consecutive_turns_are_not_merged():
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"},
                        {"role": "assistant", "content": "c"}]}
    assert len(normalize_conversation(row)) == 3


@pytest.mark.parametrize(
    "row, kind",
    [
        ({"messages": "hello"}, "messages not a list"),
        ({"text": "hello"}, "no messages key"),
        ({"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}, "unknown role"),
        ({"conversations": [{"from": "human", "value": 3}, {"from": "gpt", "value": "y"}]}, "non-string content"),
        ({"messages": [{"role": "user", "content": "q"}]}, "no assistant message"),
        ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]}, "no assistant message"),
        # The only assistant turn leads the conversation, so it is dropped: nothing left to train on.
        ({"conversations": [{"from": "gpt", "value": "hi"}, {"from": "human", "value": "q"}]}, "no assistant message"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]},
                       {"role": "assistant", "content": "a"}]}, "non-text content part"),
    ],
)
def test_malformed_rows_raise_with_a_kind(row, kind):
    with pytest.raises(DataError) as err:
        normalize_conversation(row)
    assert err.value.kind == kind
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    "row, expected",
    [
        ({"prompt": "q", "response": "a"}, [("user", "q"), ("assistant", "a")]),
        ({"prompt": "q", "completion": "a", "system": "be brief"}, [("system", "be brief"), ("user", "q"), ("assistant", "a")]),
        # Alpaca: the input joins the instruction after a blank line; an empty input adds nothing
        ({"instruction": "Sum these.", "input": "1 2", "output": "3"}, [("user", "Sum these.\n\n1 2"), ("assistant", "3")]),
        ({"instruction": "Say hi.", "input": "", "output": "hi"}, [("user", "Say hi."), ("assistant", "hi")]),
        # Dolly: instruction / context / response
        ({"instruction": "Who?", "context": "Ada wrote it.", "response": "Ada"}, [("user", "Who?\n\nAda wrote it."), ("assistant", "Ada")]),
        # messages win over the prompt column (UltraChat rows carry both)
        ({"prompt": "q", "messages": [{"role": "user", "content": "m"}, {"role": "assistant", "content": "n"}]},
         [("user", "m"), ("assistant", "n")]),
    ],
)
def test_single_turn_column_layouts(row, expected):
    assert [(m["role"], m["content"]) for m in normalize_conversation(row)] == expected


def test_a_prompt_without_its_answer_is_a_prompt_to_regenerate():
    assert normalize_conversation({"prompt": "q"}, require_assistant=False) == [{"role": "user", "content": "q"}]
    with pytest.raises(DataError) as err:
        normalize_conversation({"instruction": "q", "output": None})
    assert err.value.kind == "no assistant message" and "row.instruction/output" in str(err.value)
    with pytest.raises(DataError) as err:
        normalize_conversation({"prompt": "q", "response": 7})
    assert err.value.kind == "non-string content"
