"""Write the generated reference pages under docs/reference/ from the code, so they cannot drift.

    .venv/bin/python docs/gen_reference.py            # (re)write every generated page
    .venv/bin/python docs/gen_reference.py --check    # exit 1 naming each page that differs
    .venv/bin/python docs/gen_reference.py cli.md     # only the pages named

Pages (one module each under docs/refgen/): config.md (every run-config key, from the section
dataclasses and each draft family's), cli.md (every command and flag, from the real argparse parser),
layouts.md (checkpoint and export layouts, from a tiny run made here on the CPU: a target built in code,
a few training steps per family, every export), wire.md (the remote protocol, from the docstrings and
constants of draftsmith.remote) errors.md (every error class and its docstring) and targets.md (the supported-target matrix of
draftsmith.targets.support, with the installed vLLM's serving path per row). The output is
deterministic: the same bytes on every run on one machine. reference/python-api.md is hand-written.

tests/test_docs.py imports this file by path and compares :func:`render` with the files on disk.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
if str(DOCS) not in sys.path:  # the refgen package sits beside this file
    sys.path.insert(0, str(DOCS))
if str(ROOT / "src") not in sys.path:  # a checkout without `pip install -e .` still generates
    sys.path.insert(1, str(ROOT / "src"))

from refgen import cli_page, config_page, errors_page, layouts_page, targets_page, wire_page  # noqa: E402

# page (relative to docs/) -> the function that renders it
PAGES: dict[str, Callable[[], str]] = {m.PAGE: m.render for m in (config_page, cli_page, layouts_page, wire_page,
                                                                   errors_page, targets_page)}


def _select(names: Optional[Sequence[str]]) -> list[str]:
    if not names:
        return list(PAGES)
    chosen = []
    for n in names:
        match = [p for p in PAGES if p == n or Path(p).name == n or Path(p).stem == n]
        if not match:
            raise SystemExit(f"gen_reference: no generated page {n!r}; pages: {', '.join(PAGES)}")
        chosen += match
    return chosen


def render(names: Optional[Sequence[str]] = None) -> dict[str, str]:
    """Page (relative to docs/) -> its text as the code makes it now; nothing is written."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network
    return {page: PAGES[page]() for page in _select(names)}


def stale(pages: dict[str, str]) -> list[str]:
    """The pages whose file under docs/ differs from ``pages`` (or is missing)."""
    out = []
    for page, text in pages.items():
        path = DOCS / page
        if not path.is_file() or path.read_text() != text:
            out.append(page)
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="gen_reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("pages", nargs="*", help="only these pages (config.md, cli, ...); default: all")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each page that differs")
    args = p.parse_args(argv)
    pages = render(args.pages)
    changed = stale(pages)
    if args.check:
        for page in changed:
            print(f"docs/{page} differs from what docs/gen_reference.py writes now; run make docs-ref", file=sys.stderr)
        return 1 if changed else 0
    for page in changed:
        (DOCS / page).parent.mkdir(parents=True, exist_ok=True)
        (DOCS / page).write_text(pages[page])
        print(f"wrote docs/{page}")
    print(f"{len(pages) - len(changed)} page(s) already up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
