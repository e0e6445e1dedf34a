"""A docstring (reST-flavoured, as draftsmith writes them) as Markdown: paragraphs, ``::`` literal
blocks as fenced blocks, ``- item`` / ``1. item`` lists as lists, roles and double backticks as code."""

from __future__ import annotations

import re

from . import md
from .source import paragraphs

_ITEM = re.compile(r"^(?:[-*]|\d+\.)\s+")


def to_markdown(doc: str | None, skip: int = 0) -> list[str]:
    """Markdown lines for docstring ``doc`` from its paragraph ``skip`` on."""
    out: list[str] = []
    literal_next = False
    for i, para in enumerate(paragraphs(doc)):
        literal = literal_next
        literal_next = para.rstrip().endswith("::")
        if i < skip:
            continue
        if literal:
            out += md.fenced(para)
            continue
        text = para[:-1] if literal_next else para  # "Layout::" -> "Layout:"
        lines = text.splitlines()
        first = next((j for j, line in enumerate(lines) if _ITEM.match(line)), None)
        if first is None:
            out += [md.prose(text), ""]
            continue
        if first:  # "Behaviour:" then the items
            out += [md.prose(" ".join(lines[:first])), ""]
        out += _items(lines[first:])
    return out


def _items(lines: list[str]) -> list[str]:
    items: list[tuple[str, list[str]]] = []
    for line in lines:
        m = _ITEM.match(line)
        if m:
            marker = "1." if m.group(0).strip()[0].isdigit() else "-"
            items.append((marker, [line[m.end():]]))
        elif items:
            items[-1][1].append(line.strip())
    return [f"{marker} {md.prose(' '.join(words))}" for marker, words in items] + [""]
