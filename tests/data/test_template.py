import pytest

import fixtures
from draftsmith.data.formats import DataError
from draftsmith.data.template import render

CONV = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "The capital of France is Paris."},
    {"role": "user", "content": "Tell me a joke about cats."},
    {"role": "assistant", "content": "Why did the cat sit on the computer?"},
]


def expected_from_pieces(tok, pieces):
    """Tokenize hand-labelled text pieces one by one: (ids, mask) with each piece's label per token."""
    ids, mask = [], []
    for text, label in pieces:
        piece_ids = tok(text, add_special_tokens=False)["input_ids"]
        ids += piece_ids
        mask += [label] * len(piece_ids)
    return ids, mask


def test_chatml_mask_token_by_token():
    tok = fixtures.make_tokenizer("chatml")
    pieces = [
        ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0),
        ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n", 0),
        ("<|im_start|>assistant\n", 0),  # header / generation prompt: not supervised
        ("The capital of France is Paris.<|im_end|>\n", 1),  # content + end-of-turn + newline
        ("<|im_start|>user\nTell me a joke about cats.<|im_end|>\n", 0),
        ("<|im_start|>assistant\n", 0),
        ("Why did the cat sit on the computer?<|im_end|>\n", 1),
    ]
    ids, mask = render(CONV, tok, None)
    exp_ids, exp_mask = expected_from_pieces(tok, pieces)
    assert ids == exp_ids
    assert mask == exp_mask
    # The same labels written out literally (101 tokens): 43 zeros, 13 ones, 26 zeros, 19 ones.
    assert "".join(map(str, mask)) == "0" * 43 + "1" * 13 + "0" * 26 + "1" * 19
    supervised = [tok.convert_ids_to_tokens(i) for i, m in zip(ids, mask) if m]
    assert supervised[11:13] == ["<|im_end|>", "Ċ"]  # ChatML closes a turn with <|im_end|> and "\n"
    assert supervised[-2:] == ["<|im_end|>", "Ċ"]


def test_llama3_mask_token_by_token():
    tok = fixtures.make_tokenizer("llama3")
    pieces = [
        ("<|begin_of_text|>", 0),
        ("<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|>", 0),
        ("<|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|>", 0),
        ("<|start_header_id|>assistant<|end_header_id|>\n\n", 0),
        ("The capital of France is Paris.<|eot_id|>", 1),
        ("<|start_header_id|>user<|end_header_id|>\n\nTell me a joke about cats.<|eot_id|>", 0),
        ("<|start_header_id|>assistant<|end_header_id|>\n\n", 0),
        ("Why did the cat sit on the computer?<|eot_id|>", 1),
    ]
    ids, mask = render(CONV, tok, None)
    exp_ids, exp_mask = expected_from_pieces(tok, pieces)
    assert ids == exp_ids
    assert mask == exp_mask
    assert "".join(map(str, mask)) == "0" * 48 + "1" * 12 + "0" * 29 + "1" * 18
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>") and ids[1] != ids[0]  # one BOS only


def test_truncation_cuts_ids_and_mask_together():
    tok = fixtures.make_tokenizer("chatml")
    full_ids, full_mask = render(CONV, tok, None)
    ids, mask = render(CONV, tok, 50)
    assert ids == full_ids[:50] and mask == full_mask[:50]
    assert mask == [0] * 43 + [1] * 7


def test_template_that_rewrites_history_falls_back_to_content_search():
    # Qwen3-style: only the LAST assistant turn gets an (empty) think block, so rendering a prefix
    # that ends in an earlier assistant turn is not a prefix of the full render.
    qwen3_like = (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' }}"
        "{% if message['role'] == 'assistant' and loop.last %}{{ '<think>\n\n</think>\n\n' }}{% endif %}"
        "{% if message['role'] == 'assistant' %}{{ message['content'].split('</think>')[-1].lstrip('\n') }}"
        "{% else %}{{ message['content'] }}{% endif %}"
        "{{ '<|im_end|>\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    )
    tok = fixtures.make_tokenizer("chatml")
    conv = [dict(m) for m in CONV]
    conv[2]["content"] = "<think>\nthe user asks\n</think>\n\nThe capital of France is Paris."
    pieces = [
        ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", 0),
        ("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n", 0),
        ("<|im_start|>assistant\n", 0),
        ("The capital of France is Paris.<|im_end|>\n", 1),  # old reasoning dropped by the template
        ("<|im_start|>user\nTell me a joke about cats.<|im_end|>\n", 0),
        ("<|im_start|>assistant\n", 0),
        ("<think>\n\n</think>\n\nWhy did the cat sit on the computer?<|im_end|>\n", 1),
    ]
    ids, mask = render(conv, tok, None, chat_template=qwen3_like)
    exp_ids, exp_mask = expected_from_pieces(tok, pieces)
    assert ids == exp_ids and mask == exp_mask


def test_missing_chat_template_names_the_fix():
    tok = fixtures.make_tokenizer("chatml")
    tok.chat_template = None
    with pytest.raises(DataError, match="set data.chat_template"):
        render(CONV, tok, None)
    # An explicit template overrides the (missing) tokenizer one.
    ids, mask = render(CONV, tok, None, chat_template=fixtures.CHATML_TEMPLATE)
    assert sum(mask) == 32
