"""Evaluation prompt sets: files -> :class:`EvalPrompt` -> token ids through the target's chat template.

Accepted rows (``.jsonl``, one per line, or ``.json`` holding a list of rows):

- ``{"id", "category", "turns": [str, ...]}`` (MT-bench style, e.g. ../shared/data): the user turns
  asked in order; only the first is used unless ``multi_turn`` (then each later turn follows the
  target's own answer to the previous one, as MT-bench does);
- OpenAI ``{"messages": [...]}`` or ShareGPT ``{"conversations": [...]}``: everything before the
  LAST user turn is kept as context and that turn is the prompt (later assistant text is dropped).

``id`` defaults to ``<file stem>-<row index>``, ``category`` to ``"default"``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from draftsmith.data.formats import ROLE_ALIASES, DataError, _content_text

__all__ = ["EvalPrompt", "load_prompts", "parse_prompt_row", "render_prompt"]


@dataclass
class EvalPrompt:
    """One prompt: ``context`` messages, then the user ``turns`` asked one after the other."""

    id: str
    category: str
    turns: list[str]
    context: list[dict] = field(default_factory=list)


def parse_prompt_row(row: Any, default_id: str, multi_turn: bool = False) -> EvalPrompt:
    """One parsed JSON row -> :class:`EvalPrompt`; raises DataError naming ``default_id`` when malformed."""
    if not isinstance(row, dict):
        raise DataError(f"{default_id}: expected a JSON object, got {type(row).__name__}")
    pid = str(row.get("id", row.get("question_id", default_id)))
    category = str(row.get("category") or "default")
    if "turns" in row:
        turns = row["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) for t in turns):
            raise DataError(f"{default_id}: 'turns' must be a non-empty list of strings (the user turns)")
        return EvalPrompt(pid, category, list(turns) if multi_turn else turns[:1])
    key = "messages" if "messages" in row else "conversations" if "conversations" in row else None
    if key is None or not isinstance(row[key], list):
        raise DataError(f"{default_id}: expected 'turns' (list of str), 'messages' (OpenAI) or 'conversations' "
                        f"(ShareGPT); got keys {sorted(row)[:6]}")
    messages = []
    for i, turn in enumerate(row[key]):
        where = f"{default_id}.{key}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{where}: expected an object with role/content or from/value")
        raw_role = turn.get("role", turn.get("from"))
        role = ROLE_ALIASES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise DataError(f"{where}: unknown role {raw_role!r}; expected one of {sorted(ROLE_ALIASES)}")
        messages.append({"role": role, "content": _content_text(turn.get("content", turn.get("value")), where)})
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DataError(f"{default_id}.{key}: no user turn to use as the prompt")
    last = users[-1]
    return EvalPrompt(pid, category, [messages[last]["content"]], context=messages[:last])


def load_prompts(path: str | Path, *, multi_turn: bool = False, limit: Optional[int] = None) -> list[EvalPrompt]:
    """Read a prompt file (``.jsonl`` or ``.json`` list); ``limit`` keeps the first N prompts."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"--prompts: file '{path}' not found; pass a .jsonl of {{id, category, turns}} rows "
                        "or OpenAI/ShareGPT conversations")
    text = path.read_text()
    rows: list[tuple[str, Any]] = []
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: invalid JSON ({e.msg} at line {e.lineno}); fix the file") from None
        rows = [(f"{path.name}[{i}]", r) for i, r in enumerate(data)]
    else:
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"{path.name}:{n}", json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{n}: invalid JSON ({e.msg}); one JSON object per line") from None
    prompts = []
    for i, (where, row) in enumerate(rows):
        p = parse_prompt_row(row, where, multi_turn)
        if not isinstance(row, dict) or ("id" not in row and "question_id" not in row):
            p.id = f"{path.stem}-{i}"
        prompts.append(p)
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise DataError(f"{path}: no prompts found; the file is empty")
    return prompts


def render_prompt(tokenizer: Any, messages: list[dict]) -> list[int]:
    """Messages -> token ids with the tokenizer's chat template and the assistant generation prompt.

    The template writes any BOS itself, so the text is encoded without extra special tokens (what
    vLLM's chat endpoint does too).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                        "use a chat model as the target (or a tokenizer that ships a template)")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))
