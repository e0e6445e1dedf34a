"""Keep training prompts apart from the evaluation sets, and duplicates out.

A draft scored on MT-Bench, GSM8K or HumanEval prompts it was trained on would report acceptance it
does not have on new text. Every built-in prompt corpus (and ``builtin:mix``) drops a prompt that
shares any word :data:`NGRAM`-gram with a prompt of a shipped evaluation set
(:data:`draftsmith.eval.prompts.PROMPT_SETS`, every turn of every row): 8 words is long enough that
common phrases ("what is the difference between") do not match, and short enough that a copied eval
question with light edits still does (the usual contamination check; GPT-3 used 13-grams). Runs of
numbers alone ("1 2 3 4 5 6 7 8") are not evidence of a copy, so an n-gram needs three words with a
letter in them to count.

MT-Bench's role-play questions are rewordings of awesome-chatgpt-prompts personas ("Act as a math
teacher", "I want you to act as a doctor" -> "Imagine yourself as a doctor"), which ``builtin:ai_personas``
ships almost verbatim; rewording defeats any n-gram. So a prompt that casts the model in the role an
evaluation prompt casts it in (:func:`eval_roles`: "doctor", "english translator", "elon musk", ...)
is dropped too (:func:`same_role`).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Iterable

NGRAM = 8
_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script; punctuation and spacing never matter


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _telling(gram: tuple[str, ...]) -> bool:
    return sum(not w.isdigit() for w in gram) >= 3


def ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    w = words(text)
    return {g for g in (tuple(w[i:i + n]) for i in range(len(w) - n + 1)) if _telling(g)}


@functools.lru_cache(maxsize=1)
def eval_ngrams() -> frozenset:
    """Every :data:`NGRAM`-gram of every turn of every shipped evaluation prompt set."""
    from draftsmith.eval.prompts import PROMPT_SET_DIR, PROMPT_SETS

    grams: set[tuple[str, ...]] = set()
    for name in PROMPT_SETS.values():
        for line in (PROMPT_SET_DIR / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                for turn in json.loads(line).get("turns", []):
                    grams |= ngrams(turn)
    return frozenset(grams)


def contaminated(texts: Iterable[str]) -> bool:
    """True when any of ``texts`` shares an :data:`NGRAM`-gram with an evaluation prompt."""
    bad = eval_ngrams()
    for text in texts:
        w = words(text)
        if any(tuple(w[i:i + NGRAM]) in bad for i in range(len(w) - NGRAM + 1)):
            return True
    return False


# "act as a X", "assume the role of X", "imagine yourself as X", ...: how a prompt hands out a role
_CAST = re.compile(r"\b(?:act as|acting as|pretend (?:yourself )?to be|pretend you are|embrace the role of|"
                   r"imagine yourself as|take on the role of|assume the role of|now you are|embody the persona of|"
                   r"suppose you are|picture yourself as|play the role of)\s+"
                   r"(?:a |an |the |my )?([^\n.,:;!?\"“(]{2,60})", re.I)
_ROLE_END = re.compile(r"\s(?:from|tasked|in|throughout|who|that|and you|and i|and will|for|with)\s.*$", re.I)


def roles(text: str) -> list[tuple[str, ...]]:
    """The roles ``text`` casts the model in, as word tuples ("english", "translator")."""
    out = []
    for m in _CAST.finditer(text[:1200]):
        role = _ROLE_END.sub("", " " + m.group(1) + " ").strip()
        w = tuple(words(role))
        if w:
            out.append(w[:4])
    return out


@functools.lru_cache(maxsize=1)
def eval_roles() -> frozenset:
    """The roles the shipped evaluation prompts cast the model in (MT-Bench role-play: doctor, math teacher, ...)."""
    from draftsmith.eval.prompts import PROMPT_SET_DIR, PROMPT_SETS

    found: set[tuple[str, ...]] = set()
    for name in PROMPT_SETS.values():
        for line in (PROMPT_SET_DIR / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                for turn in json.loads(line).get("turns", [])[:1]:
                    found.update(roles(turn))
    return frozenset(found)


def same_role(texts: Iterable[str]) -> bool:
    """True when a text casts the model in an evaluation prompt's role (its role starts with that role's words)."""
    bad = eval_roles()
    for text in texts:
        for role in roles(text):
            if any(role[:len(b)] == b for b in bad):
                return True
    return False


def dedup_key(texts: Iterable[str]) -> str:
    """Two prompts that differ only in case, spacing or punctuation are the same prompt."""
    return " | ".join(" ".join(words(t)) for t in texts)
