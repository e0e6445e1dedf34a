"""What the reference pages read from the source: the comments beside and above dataclass fields and
module constants (``tokenize`` over the real source), and docstrings split into paragraphs."""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
from functools import lru_cache
from pathlib import Path
from types import ModuleType


@lru_cache(maxsize=None)
def _parsed(path: str) -> tuple[ast.Module, dict[int, str], list[str]]:
    """(ast, line -> the comment on it, the lines) of one source file."""
    text = Path(path).read_text()
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    return ast.parse(text), comments, text.splitlines()


def _comment_for(node: ast.stmt, comments: dict[int, str], lines: list[str]) -> str:
    """The comment lines directly above ``node`` (no blank line between) and the comments on its own lines."""
    above, n = [], node.lineno - 1
    while n >= 1 and lines[n - 1].strip().startswith("#"):
        above.insert(0, comments.get(n, ""))
        n -= 1
    own = [comments[i] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1) if i in comments]
    above_text, own_text = " ".join(c for c in above if c), " ".join(c for c in own if c)
    return " — ".join(t for t in (above_text, own_text) if t)


def _assigned(node: ast.stmt) -> list[str]:
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    return []


@lru_cache(maxsize=None)
def class_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment text, for the fields ``cls`` itself declares (not inherited ones)."""
    path = inspect.getsourcefile(cls)
    tree, comments, lines = _parsed(path)
    _, start = inspect.getsourcelines(cls)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__ and (
                node.lineno == start or any(d.lineno == start for d in node.decorator_list)):
            return {name: _comment_for(stmt, comments, lines) for stmt in node.body for name in _assigned(stmt)}
    raise LookupError(f"{cls.__qualname__}: class not found in {path}")


def module_comments(module: ModuleType) -> dict[str, str]:
    """Module-level name -> the comment beside / above its assignment."""
    tree, comments, lines = _parsed(inspect.getsourcefile(module))
    return {name: _comment_for(stmt, comments, lines) for stmt in tree.body for name in _assigned(stmt)}


def paragraphs(doc: str | None) -> list[str]:
    """A docstring's paragraphs (blank-line separated), each dedented; literal blocks kept as they are."""
    if not doc:
        return []
    text = inspect.cleandoc(doc)
    return [textwrap.dedent(p).strip("\n") for p in text.split("\n\n") if p.strip()]


def relpath(module: ModuleType) -> str:
    """``src/draftsmith/...py`` for a draftsmith module (the path a reader finds it under)."""
    path = Path(inspect.getsourcefile(module)).resolve()
    parts = path.parts
    return "/".join(parts[parts.index("src"):]) if "src" in parts else path.name
