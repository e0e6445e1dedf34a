"""Evaluation prompt sets: files -> :class:`EvalPrompt` -> token ids through the target's chat template.

Accepted rows (``.jsonl``, one per line, or ``.json`` holding a list of rows):

- ``{"id", "category", "turns": [str, ...]}`` (MT-bench style, e.g. ../shared/data): the user turns
  asked in order; only the first is used unless ``multi_turn`` (then each later turn follows the
  target's own answer to the previous one, as MT-bench does);
- OpenAI ``{"messages": [...]}`` or ShareGPT ``{"conversations": [...]}``: everything before the
  LAST user turn is kept as context and that turn is the prompt (later assistant text is dropped).

``id`` defaults to ``<file stem>-<row index>``, ``category`` to ``"default"``.

Four sets ship inside the package (``prompt_sets/``, licenses beside them), named by
:data:`PROMPT_SETS`: ``mt_bench`` (80 MT-Bench questions, 8 categories, two turns each),
``gsm8k`` (the first 200 GSM8K test problems), ``humaneval`` (164 HumanEval functions) and
``mixed`` (60 held-out rows derived only from those three by bench/make_mixed_prompts.py: chat,
math, coding, reasoning, stem, extraction, and long prompts of ~1,000-1,650 SmolLM2 tokens built by
concatenation; rows interleaved so the first N are already a mix).
Wherever a prompt file is taken (``--prompts``), one of these names works too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from draftsmith.data.formats import ROLE_ALIASES, DataError, content_text
from draftsmith.data.sources import read_utf8

__all__ = ["EvalPrompt", "PROMPT_SETS", "describe_prompts", "load_prompts", "parse_prompt_row", "prompt_set_path", "render_prompt"]

# Short name -> file under prompt_sets/ (shipped as package data, so no checkout of ../shared is needed).
PROMPT_SETS = {"mt_bench": "mt_bench.jsonl", "gsm8k": "gsm8k_test_200.jsonl", "humaneval": "humaneval.jsonl",
               "mixed": "mixed.jsonl"}
PROMPT_SET_DIR = Path(__file__).resolve().parent / "prompt_sets"


def prompt_set_path(name_or_path: str | Path) -> Path:
    """A shipped set's short name (``mt_bench``, ``gsm8k``, ``humaneval``, ``mixed``) -> its file; anything else is a path.

    A name that is neither a shipped set nor an existing file is refused with the names that work.
    """
    key = str(name_or_path)
    if key in PROMPT_SETS:
        return PROMPT_SET_DIR / PROMPT_SETS[key]
    path = Path(key)
    if not path.is_file():
        raise DataError(f"--prompts: '{key}' not found (neither a file nor a shipped prompt set); pass one of "
                        f"{', '.join(PROMPT_SETS)} or a .jsonl of {{id, category, turns}} rows or "
                        "OpenAI/ShareGPT conversations")
    return path


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
        messages.append({"role": role, "content": content_text(turn.get("content", turn.get("value")), where)})
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise DataError(f"{default_id}.{key}: no user turn to use as the prompt")
    last = users[-1]
    return EvalPrompt(pid, category, [messages[last]["content"]], context=messages[:last])


def load_prompts(path: str | Path, *, multi_turn: bool = False, limit: Optional[int] = None) -> list[EvalPrompt]:
    """Read a prompt file (``.jsonl`` or ``.json`` list) or a shipped set by name (:data:`PROMPT_SETS`);
    ``limit`` keeps the first N prompts."""
    path = prompt_set_path(path)
    text = read_utf8(path)
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


def describe_prompts(prompts: list[EvalPrompt], source: str | Path) -> str:
    """One line: how many prompts from where, per category, and how many turns are asked."""
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    cats = ", ".join(f"{c} {n}" for c, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    turns = sum(len(p.turns) for p in prompts)
    return f"prompts: {len(prompts)} from {source} ({cats}; {turns} turns asked)"


def render_prompt(tokenizer: Any, messages: list[dict], chat_template_kwargs: Optional[dict] = None) -> list[int]:
    """Messages -> token ids with the tokenizer's chat template and the assistant generation prompt.

    The template writes any BOS itself, so the text is encoded without extra special tokens (what
    vLLM's chat endpoint does too). ``chat_template_kwargs`` go to ``apply_chat_template`` as is
    (e.g. ``{"enable_thinking": False}`` for templates that read it), as vLLM's request field does.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; "
                        "use a chat model as the target (or a tokenizer that ships a template)")
    clash = sorted(set(chat_template_kwargs or {}) & {"conversation", "tokenize", "add_generation_prompt"})
    if clash:  # these are how the prompt is rendered here, not template variables
        raise DataError(f"chat_template_kwargs: {', '.join(clash)} cannot be overridden; pass only template "
                        "variables (e.g. {\"enable_thinking\": false})")
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))
    return list(tokenizer.encode(text, add_special_tokens=False))
