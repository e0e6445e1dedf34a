"""Render a conversation with the tokenizer's own chat template and mark the assistant tokens.

``loss_mask`` is 1 exactly on each assistant turn's tokens: its content plus the end-of-turn text
the template writes to close it (``<|im_end|>\\n`` in ChatML, ``<|eot_id|>`` in Llama-3); it is 0 on
system/user turns and on the assistant header (the generation prompt).

Assistant spans are found in the rendered *text*, then mapped to tokens through offsets:

- prefix rendering (exact for templates whose renders of a prefix are prefixes of the full render):
  span i = [len(text(messages[:i], add_generation_prompt=True)), len(text(messages[:i+1])));
- fallback (templates that rewrite history, e.g. Qwen3 dropping old reasoning): find the content
  after the previous span, then extend over the template's end-of-turn text when it follows.

A token belongs to a span when its character offsets overlap it.
"""

from __future__ import annotations

from typing import Any, Optional

from draftsmith.data.formats import DataError

_PROBE_USER, _PROBE_REPLY = "Hi", "XqZ-probe-reply"


def _template_for(tokenizer: Any, chat_template: Optional[str]) -> str:
    template = chat_template if chat_template is not None else getattr(tokenizer, "chat_template", None)
    if not template:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise DataError(
            f"tokenizer {name!r} has no chat template; set data.chat_template (a Jinja string) "
            "or use a tokenizer that ships one",
            kind="no chat template",
        )
    return template


def _text(tokenizer: Any, template: str, messages: list[dict], generation_prompt: bool,
          kwargs: Optional[dict] = None) -> str:
    return tokenizer.apply_chat_template(
        messages, chat_template=template, tokenize=False, add_generation_prompt=generation_prompt, **(kwargs or {})
    )


def _end_of_turn(tokenizer: Any, template: str, kwargs: Optional[dict] = None) -> str:
    """The text the template writes right after an assistant turn's content (e.g. ``<|im_end|>\\n``)."""
    probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_REPLY}]
    try:
        full = _text(tokenizer, template, probe, False, kwargs)
    except Exception:  # a template with unusual requirements: fall back to content-only spans
        return ""
    at = full.rfind(_PROBE_REPLY)
    return full[at + len(_PROBE_REPLY):] if at >= 0 else ""


def _content_candidates(content: str) -> list[str]:
    """Strings that may stand for an assistant turn's content in a render, most faithful first."""
    candidates = [content.strip()]
    if "</think>" in content:
        candidates.append(content.split("</think>")[-1].strip())
    return [c for c in candidates if c]


def assistant_spans(
    messages: list[dict], tokenizer: Any, template: str, full: str, limit: Optional[int] = None,
    kwargs: Optional[dict] = None,
) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of each assistant turn (content + end-of-turn) in ``full``.

    Turns starting at or after character ``limit`` (the end of the kept tokens) are skipped, so
    truncated long conversations do not pay for rendering every prefix.
    """
    limit = len(full) if limit is None else limit
    spans: list[tuple[int, int]] = []
    cursor = 0  # everything before this belongs to earlier turns
    eot: Optional[str] = None
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        span = None
        if i > 0:
            try:
                start_text = _text(tokenizer, template, messages[:i], True, kwargs)
                end_text = _text(tokenizer, template, messages[: i + 1], False, kwargs)
            except Exception:
                start_text = end_text = None
            if (
                start_text is not None
                and full.startswith(end_text)
                and end_text.startswith(start_text)
                and cursor <= len(start_text) < len(end_text)
            ):
                span = (len(start_text), len(end_text))
        if span is None:
            # Templates may trim content (Llama-3 does `| trim`) or drop the reasoning of earlier
            # turns (Qwen3 keeps only the text after `</think>`): try the stripped text, then that.
            at, content = -1, ""
            for candidate in _content_candidates(message["content"]):
                at = full.find(candidate, cursor)
                if at >= 0:
                    content = candidate
                    break
            if at < 0:
                continue  # the template dropped this turn's content: nothing to supervise
            end = at + len(content)
            if eot is None:
                eot = _end_of_turn(tokenizer, template, kwargs)
            if eot and full.startswith(eot, end):
                end += len(eot)
            span = (at, end)
        if span[0] >= limit:
            break
        spans.append(span)
        cursor = span[1]
    return spans


def render(
    messages: list[dict],
    tokenizer: Any,
    max_length: Optional[int],
    chat_template: Optional[str] = None,
    template_kwargs: Optional[dict] = None,
) -> tuple[list[int], list[int]]:
    """Tokenize ``messages`` with the chat template; return ``(input_ids, loss_mask)``.

    The text is rendered once (``tokenize=False``) and tokenized with ``add_special_tokens=False``
    (the template already writes BOS where it wants one). ``chat_template`` overrides the
    tokenizer's own template; ``template_kwargs`` (e.g. ``{"enable_thinking": False}``) go to the
    template as they did when the data was regenerated. Both lists are truncated to ``max_length``
    tokens when it is set.
    """
    template = _template_for(tokenizer, chat_template)
    full = _text(tokenizer, template, messages, False, template_kwargs)
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    input_ids = list(enc["input_ids"])
    offsets = enc["offset_mapping"]
    if max_length is not None:
        input_ids, offsets = input_ids[:max_length], offsets[:max_length]
    limit = max((end for _, end in offsets), default=0)  # characters covered by the kept tokens
    spans = assistant_spans(messages, tokenizer, template, full, limit, template_kwargs)

    # Spans are sorted and disjoint, so one forward sweep labels every token: token [a, b) is
    # supervised iff a < span_end and b > span_start for some span.
    loss_mask = [0] * len(input_ids)
    k = 0
    for t, (a, b) in enumerate(offsets):
        while k < len(spans) and spans[k][1] <= a:
            k += 1
        if k < len(spans) and b > a and a < spans[k][1] and b > spans[k][0]:
            loss_mask[t] = 1
    return input_ids, loss_mask
