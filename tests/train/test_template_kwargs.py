"""Chat-template kwargs travel from `draftsmith regenerate` to training, the checkpoint, eval and
`serve vllm`: data regenerated with `{"enable_thinking": false}` is rendered, evaluated and served
with it (a mismatch between regeneration and serving is what halves acceptance)."""

from __future__ import annotations

import json

import pytest

from draftsmith.config import ConfigError, build_config
from draftsmith.data.regenerate import RegenSettings, regenerate
from draftsmith.data.template import render
from draftsmith.serve.resolve import resolve_draft
from draftsmith.serve.vllm import plan_vllm
from draftsmith.train.loop import train
from fixtures import CHATML_TEMPLATE, make_tiny_llama, make_tokenizer, write_jsonl

# ChatML that writes a marker into the generation prompt and every assistant header unless thinking is off.
THINKING = CHATML_TEMPLATE.replace(
    "'<|im_start|>' + message['role'] + '\n'",
    "'<|im_start|>' + message['role'] + '\n' + ('' if message['role'] != 'assistant' or enable_thinking is "
    "defined and not enable_thinking else 'think ')")
KW = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("kw")
    tok = make_tokenizer("chatml")
    tok.chat_template = THINKING
    target = make_tiny_llama(root / "target", tok, num_layers=4)
    data = write_jsonl(root / "chats.jsonl", [
        {"messages": [{"role": "user", "content": f"Tell me about the cat number {i}."}]} for i in range(10)])
    regen = root / "regen"
    regenerate([str(data)], regen, str(target), RegenSettings(engine="hf", max_new_tokens=6, chat_template_kwargs=KW),
               dtype="float32", progress=False, log=lambda s: None)
    return target, regen, root


def test_render_passes_the_kwargs_to_the_template(tiny):
    target, _, _ = tiny
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(target)
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]
    on, mask_on = render(msgs, tok, None)
    off, mask_off = render(msgs, tok, None, template_kwargs=KW)
    assert "think" in tok.decode(on) and "think" not in tok.decode(off)
    # the assistant span is found either way: the loss covers the reply and its end of turn
    assert tok.decode([t for t, m in zip(off, mask_off) if m]) == "Hello there<|im_end|>\n"
    assert "Hello there<|im_end|>" in tok.decode([t for t, m in zip(on, mask_on) if m])


def config(target, regen, out, **data):
    return build_config({"target": {"path": str(target), "aux_layer_ids": [1, 2, 3]},
                         "data": {"sources": [str(regen)], "max_length": 48, "eval_size": 2, "draft_vocab_size": 64,
                                  **data},
                         "draft": {"ttt_steps": 2}, "train": {"max_steps": 2, "batch_size": 2},
                         "output": {"dir": str(out), "tensorboard": False}})


def test_training_takes_the_kwargs_of_its_regenerated_data_and_serve_uses_them(tiny, tmp_path):
    target, regen, _ = tiny
    result = train(config(target, regen, tmp_path / "run"), progress=False)
    meta = json.loads((result.checkpoint / "meta.json").read_text())
    assert meta["chat_template_kwargs"] == KW
    plan = plan_vllm(str(target), resolve_draft(str(result.checkpoint)), k=2, dry_run=True)
    i = plan.argv.index("--default-chat-template-kwargs")
    assert json.loads(plan.argv[i + 1]) == KW
    assert any("enable_thinking" in n for n in plan.notes)
    # the same kwargs given explicitly are fine; others contradict the data and are refused by name
    train(config(target, regen, tmp_path / "same", chat_template_kwargs=KW), progress=False)
    with pytest.raises(ConfigError, match=r"data.chat_template_kwargs.*regenerated with \{\"enable_thinking\": false\}"):
        train(config(target, regen, tmp_path / "other", chat_template_kwargs={"enable_thinking": True}), progress=False)


def test_eval_renders_prompts_with_the_checkpoint_kwargs(tiny, tmp_path):
    target, regen, root = tiny
    from draftsmith.eval.offline import run_eval

    result = train(config(target, regen, tmp_path / "run"), progress=False)
    prompts = write_jsonl(root / "prompts.jsonl", [{"id": "a", "category": "c", "turns": ["Tell me about the cat."]}])
    report = run_eval(target=None, draft=str(result.checkpoint), prompts=str(prompts), k=2, max_new_tokens=4,
                      progress=False)
    assert report["config"]["chat_template_kwargs"] == KW
    override = run_eval(target=None, draft=str(result.checkpoint), prompts=str(prompts), k=2, max_new_tokens=4,
                        progress=False, chat_template_kwargs={})
    assert override["config"]["chat_template_kwargs"] == {}
