"""docs/reference/errors.md: every public exception class of draftsmith (found in the source with
``ast``), its module and base, whether the CLI prints it as one line with exit 2
(``draftsmith.cli._user_errors``), where it is raised, and its docstring: the cause, then ``Fix:``."""

from __future__ import annotations

import ast
import builtins
import importlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from . import md
from .source import paragraphs

PAGE = "reference/errors.md"
SRC = Path(__file__).resolve().parents[2] / "src"
_BUILTIN_ERRORS = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}


@dataclass
class ErrorClass:
    name: str
    module: str
    bases: list[str]
    raised_in: list[str]
    cls: type

    @property
    def doc(self) -> str:
        return self.cls.__dict__.get("__doc__") or ""


@lru_cache(maxsize=None)
def _modules() -> dict[str, ast.Module]:
    out = {}
    for path in sorted((SRC / "draftsmith").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text())
    return out


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def error_classes() -> list[ErrorClass]:
    """Every public exception class defined in src/draftsmith, sorted by name (a class is an exception
    when one of its bases is a builtin exception or such a class, by name)."""
    trees = _modules()
    defs = {}  # name -> (module, base names)
    for mod, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                defs.setdefault(node.name, (mod, [_base_name(b) for b in node.bases]))
    errors: set[str] = set()
    changed = True
    while changed:  # a fixpoint over "derives from an exception"
        changed = False
        for name, (_, bases) in defs.items():
            if name not in errors and any(b in _BUILTIN_ERRORS or b in errors for b in bases):
                errors.add(name)
                changed = True
    raised: dict[str, set[str]] = {}
    for mod, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                raised.setdefault(_base_name(node.exc.func), set()).add(mod)
    out = []
    for name in sorted(n for n in errors if not n.startswith("_")):
        mod, bases = defs[name]
        cls = getattr(importlib.import_module(mod), name)
        out.append(ErrorClass(name, mod, bases, sorted(raised.get(name, ())), cls))
    return out


def cause_and_fix(doc: str) -> tuple[str, str, list[str]]:
    """(cause, fix, further paragraphs) of an error docstring: its first paragraph reads
    "<cause> Fix: <fix>"."""
    paras = paragraphs(doc)
    if not paras:
        return "", "", []
    first = " ".join(paras[0].split())
    cause, sep, fix = first.partition("Fix:")
    return cause.strip(), fix.strip() if sep else "", paras[1:]


def problems() -> list[str]:
    """One line per error class whose docstring lacks a cause or a ``Fix:`` (the docs test fails on any)."""
    out = []
    for e in error_classes():
        cause, fix, _ = cause_and_fix(e.doc)
        if not cause or not fix:
            out.append(f"{e.module}.{e.name}: the docstring needs a cause and 'Fix: ...' "
                       f"({'no docstring' if not e.doc else 'no Fix:' if cause else 'no cause'})")
    return out


def render() -> str:
    from draftsmith.cli import _user_errors

    user = _user_errors()
    errors = error_classes()
    lines = md.header("Errors", md.prose(
        "Every error class of draftsmith, read from the source. The command line turns the errors marked "
        "*one line* (the classes `draftsmith.cli._user_errors` lists, and their subclasses) into one line "
        "`draftsmith: error: <message>` on stderr and exit status 2; the message names the file, key or flag "
        "and the fix. The others (*not caught*) are caught inside draftsmith and raised again as one of those, "
        "or reach the terminal with a traceback."))
    lines += md.prose("The classes the CLI catches: " + ", ".join(f"`{c.__name__}`" for c in user) + "."), ""
    lines += md.table(["Error", "Base", "Module", "CLI"], [
        [f"[{md.code(e.name)}](#{md.anchor(e.name)})", md.code(", ".join(e.bases)), md.code(e.module),
         "one line, exit 2" if issubclass(e.cls, user) else "not caught"] for e in errors])
    for e in errors:
        cause, fix, more = cause_and_fix(e.doc)
        lines += [f"## {e.name}", ""]
        lines += [f"`{e.module}.{e.name}`, a `{'`, `'.join(e.bases)}`"
                  + ("; the CLI prints it as one line and exits 2." if issubclass(e.cls, user) else "."), ""]
        lines += [f"**Cause.** {md.prose(cause)}", "", f"**Fix.** {md.prose(fix[:1].upper() + fix[1:])}", ""]
        for para in more:
            lines += [md.prose(para), ""]
        if e.raised_in:
            lines += ["Raised in: " + ", ".join(md.code(m) for m in e.raised_in) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
