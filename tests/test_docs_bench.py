"""Every ``bench/<name>.py`` command line in README.md and docs/**/*.md parses with that bench's own parser.

The benchmarks page promises each figure's command can be run again on a fresh clone; the most common
way such a line rots is a flag renamed or dropped. Each bench builds its argparse parser inside
``main()``: the check imports the bench, runs ``main()`` with the documented arguments and stops it the
moment ``parse_args`` returns (nothing is trained, served or installed).

What counts as a bench command line: in fenced blocks, a line (``\\`` continuations joined) and, outside
them, an inline code span (one paragraph, so a span may wrap lines) whose words, after ``NAME=value``
prefixes and the wrappers ``taskset -c N``, ``nohup``, ``time``, ``timeout N``, are a python launcher
then ``bench/<name>.py``. A line whose last word is ``...`` is elided and skipped, and so are prose
mentions of the bare path (no launcher). Placeholders pass as test_docs.py's rules say.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest

from test_docs import _FENCE, _LAUNCHER, _SPAN, doc_files, fill_placeholder, words

ROOT = Path(__file__).resolve().parents[1]
_BENCH = re.compile(r"^bench/(\w+)\.py$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_WRAPPERS = {"taskset": 2, "nohup": 0, "time": 0, "timeout": 1}  # program -> words it takes before the command


def bench_argv(text: str) -> Optional[tuple[str, list[str]]]:
    """(bench name, its arguments) when ``text`` is a bench command line, else None."""
    text = text.strip().removeprefix("$ ")
    if "bench/" not in text:
        return None
    try:
        toks = words(text)
    except ValueError:
        return None
    while toks:
        if _ENV.match(toks[0]):
            toks = toks[1:]
        elif toks[0] in _WRAPPERS:
            toks = toks[1 + _WRAPPERS[toks[0]]:]
        else:
            break
    if len(toks) < 2 or not _LAUNCHER.match(toks[0]) or not _BENCH.match(toks[1]):
        return None
    if toks[-1] == "...":
        return None
    return _BENCH.match(toks[1]).group(1), toks[2:]


def bench_commands(text: str) -> Iterator[tuple[int, str, str, list[str]]]:
    """(line number, the command as written, bench name, arguments) for every bench command line of ``text``."""
    lines = text.splitlines()
    fence, para, para_start = None, [], 0

    def spans():
        joined = " ".join(s.strip() for s in para)
        for m in _SPAN.finditer(joined):
            got = bench_argv(m.group(2))
            if got:
                yield para_start, m.group(2).strip(), *got

    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FENCE.match(line)
        if fence is None and m:
            yield from spans()
            para, fence = [], m.group(1)
        elif fence is not None and line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
            fence = None
        elif fence is not None:
            start = i + 1
            while line.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line.rstrip()[:-1] + " " + lines[i].strip()
            got = bench_argv(line)
            if got:
                yield start, line.strip(), *got
        elif not line.strip():
            yield from spans()
            para = []
        else:
            if not para:
                para_start = i + 1
            para.append(line)
        i += 1
    yield from spans()


class _Parsed(Exception):
    pass


def bench_parse_error(name: str, argv: list[str]) -> Optional[str]:
    """argparse's complaint about ``argv`` for bench ``name`` (None when it parses), placeholders filled in."""
    path = ROOT / "bench" / f"{name}.py"
    if not path.is_file():
        return f"no such bench: {path.relative_to(ROOT)}"
    spec = importlib.util.spec_from_file_location(f"_docs_bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    original = argparse.ArgumentParser.parse_args
    argv = list(argv)
    message = "exit 2"
    for _ in range(len(argv) + 1):
        def stop_after_parsing(self, args=None, namespace=None):
            original(self, argv if args is None else args, namespace)
            raise _Parsed

        err = io.StringIO()
        try:
            with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stderr(err), \
                    contextlib.redirect_stdout(io.StringIO()):
                mp.setattr(argparse.ArgumentParser, "parse_args", stop_after_parsing)
                mp.setattr(sys, "argv", [str(path), *argv])
                module.main()
            return "main() returned without parsing its arguments"
        except _Parsed:
            return None
        except SystemExit as e:
            if e.code in (0, None):
                return None
        message = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "exit 2"
        if not fill_placeholder(message, argv):
            return message
    return message


def test_bench_command_lines_in_the_docs_parse():
    found, seen = [], 0
    for p in doc_files():
        for lineno, cmd, name, argv in bench_commands(p.read_text()):
            seen += 1
            err = bench_parse_error(name, argv)
            if err:
                found.append(f"{p.relative_to(ROOT)}:{lineno}: {cmd}\n    -> {err}")
    assert seen >= 20, f"only {seen} bench command lines found: the extractor lost them"
    assert not found, "bench command lines their bench's parser refuses:\n" + "\n".join(found)


def test_the_bench_extractor_and_check_catch_a_broken_line():
    text = "\n".join([
        "- **Command:** `taskset -c 0 .venv/bin/python bench/family_compare.py --arms eagle3 --seconds 60",  # 1
        "  --threads 1` and `python bench/family_compare.py --nosuch`.",
        "",
        "```bash",
        "HF_HUB_OFFLINE=1 .venv/bin/python bench/serve_speedup.py --draft demo=runs/demo \\",  # 5
        "    -k 1 3  # a comment",
        "python bench/serve_speedup.py ...",  # elided
        "```",
        "Prose naming `bench/serve_speedup.py` alone is no command.",
    ])
    found = [(n, name, argv) for n, _, name, argv in bench_commands(text)]
    assert found == [(1, "family_compare", ["--arms", "eagle3", "--seconds", "60", "--threads", "1"]),
                     (1, "family_compare", ["--nosuch"]),
                     (5, "serve_speedup", ["--draft", "demo=runs/demo", "-k", "1", "3"])]
    assert bench_parse_error("family_compare", found[0][2]) is None
    assert "unrecognized arguments: --nosuch" in bench_parse_error("family_compare", ["--nosuch"])
    assert bench_parse_error("nosuch_bench", []) == "no such bench: bench/nosuch_bench.py"
