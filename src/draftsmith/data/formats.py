"""Chat row formats -> OpenAI-style messages.

Every source row ends up as ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
Accepted rows:

- ``{"messages": [{"role": ..., "content": ...}, ...]}`` where ``content`` is a string or a list of
  ``{"type": "text", "text": ...}`` parts (joined with no separator, the OpenAI convention);
- ShareGPT ``{"conversations": [{"from": "human"|"gpt"|..., "value": ...}, ...]}`` (role/content
  pairs inside ``conversations`` are accepted too);
- single-turn columns (:data:`PAIR_LAYOUTS`): ``prompt``/``response`` (or ``completion``),
  ``instruction``/``output`` (Alpaca, with an optional ``input``) or ``instruction``/``response`` (Dolly,
  with an optional ``context``), each with an optional ``system`` column.

A leading assistant turn is dropped (ShareGPT dumps often start with ``gpt`` greeting text that no
prompt asked for); nothing else is merged or reordered.
"""

from __future__ import annotations

from typing import Any, Optional


class DataError(ValueError):
    """Training data that cannot be read as conversations (a missing file, a bad row, role or key); the
    message names the file, row and key and what was expected. Fix: repair or drop what it names, or point
    ``data.sources`` elsewhere.

    ``kind`` is a short, row-independent category (e.g. ``"unknown role"``) used to tally bad rows
    in :class:`draftsmith.data.sources.DataReport`; it defaults to the message itself.
    """

    def __init__(self, message: str, *, kind: Optional[str] = None):
        super().__init__(message)
        self.kind = kind if kind is not None else message


# ShareGPT speaker names seen in the wild -> OpenAI roles.
ROLE_ALIASES: dict[str, str] = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bing": "assistant",
    "bard": "assistant",
}


def content_text(content: Any, where: str) -> str:
    """A message's content as one string (list-of-parts content is joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise DataError(
                    f"{where}.content[{j}]: expected a text part {{'type': 'text', 'text': str}}, "
                    f"got {type(part).__name__} {str(part)[:60]!r}; drop non-text parts from the data",
                    kind="non-text content part",
                )
        return "".join(parts)
    raise DataError(
        f"{where}.content: expected a string or a list of text parts, got {type(content).__name__}; "
        "fix the row or filter it out",
        kind="non-string content",
    )


# Single-turn column layouts (the prompt's column, its answer's columns), tried in order after
# messages/conversations: prompt/response (prompt/completion), Alpaca's instruction[/input]/output and
# Dolly's instruction[/context]/response. The extra input/context column joins the instruction after a
# blank line, as both datasets' own prompt templates place it.
PAIR_LAYOUTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("prompt", ("response", "completion")),
    ("instruction", ("output", "response")),
)
PAIR_EXTRAS = ("input", "context")


def pair_turns(row: dict) -> Optional[tuple[str, list[dict]]]:
    """``(where, turns)`` for a single-turn row in one of :data:`PAIR_LAYOUTS` (with an optional
    ``system`` column), else None. Turns are role/content dicts; a row without its answer column
    yields the user turn only (a prompt to regenerate an answer for)."""
    for prompt_key, answer_keys in PAIR_LAYOUTS:
        if prompt_key not in row:
            continue
        prompt = content_text(row[prompt_key], f"row.{prompt_key}")
        extra = next((k for k in PAIR_EXTRAS if prompt_key == "instruction" and row.get(k)), None)
        if extra is not None:
            prompt += "\n\n" + content_text(row[extra], f"row.{extra}")
        turns = [{"role": "system", "content": row["system"]}] if isinstance(row.get("system"), str) and row["system"] else []
        turns.append({"role": "user", "content": prompt})
        answer_key = next((k for k in answer_keys if k in row and row[k] is not None), None)
        if answer_key is not None:
            turns.append({"role": "assistant", "content": row[answer_key]})
        return f"{prompt_key}/{answer_key or answer_keys[0]}", turns
    return None


def normalize_conversation(row: dict, require_assistant: bool = True) -> list[dict]:
    """Normalise one data row into OpenAI-style messages.

    Raises :class:`DataError` when the row has no message list, a turn has an unknown role or
    non-string content, or no assistant turn has non-empty content (nothing to supervise; with
    ``require_assistant=False``, as regeneration reads prompts, a user turn is enough).
    """
    if not isinstance(row, dict):
        raise DataError(
            f"row: expected a JSON object with 'messages' or 'conversations', got {type(row).__name__}",
            kind="row is not an object",
        )
    key = "messages" if "messages" in row else "conversations" if "conversations" in row else None
    if key is None:
        pair = pair_turns(row)
        if pair is None:
            raise DataError(
                f"row: no 'messages' or 'conversations' key (keys: {sorted(row)[:6]}); "
                "use OpenAI messages, ShareGPT conversations, prompt/response or instruction/output columns",
                kind="no messages key",
            )
        key, turns = pair
    else:
        turns = row[key]
    if not isinstance(turns, list):
        raise DataError(
            f"row.{key}: expected a list of turns, got {type(turns).__name__}", kind="messages not a list"
        )

    messages: list[dict] = []
    for i, turn in enumerate(turns):
        where = f"{key}[{i}]"
        if not isinstance(turn, dict):
            raise DataError(f"{where}: expected an object, got {type(turn).__name__}", kind="turn not an object")
        # Either role/content (OpenAI) or from/value (ShareGPT) in both containers.
        if "role" in turn or "content" in turn:
            raw_role, content = turn.get("role"), turn.get("content")
        else:
            raw_role, content = turn.get("from"), turn.get("value")
        role = ROLE_ALIASES.get(raw_role.lower()) if isinstance(raw_role, str) else None
        if role is None:
            raise DataError(
                f"{where}: unknown role {raw_role!r}; expected one of {sorted(ROLE_ALIASES)}",
                kind="unknown role",
            )
        messages.append({"role": role, "content": content_text(content, where)})

    if messages and messages[0]["role"] == "assistant":
        messages = messages[1:]
    if not require_assistant:
        if not any(m["role"] == "user" and m["content"].strip() for m in messages):
            raise DataError(f"row.{key}: no user turn with non-empty content (nothing to answer); filter the row out",
                            kind="no user message")
        return messages
    if not any(m["role"] == "assistant" and m["content"].strip() for m in messages):
        raise DataError(
            f"row.{key}: no assistant turn with non-empty content (nothing to train on); filter the row out",
            kind="no assistant message",
        )
    return messages
