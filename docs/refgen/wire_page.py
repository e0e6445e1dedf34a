"""docs/reference/wire.md: the remote protocol between the trainer's `remote` engine and
`draftsmith serve-target`, from the docstrings and constants of draftsmith.remote (server, wire, nccl,
client): a changed constant, route or limit changes the page."""

from __future__ import annotations

import ast
import dataclasses
import http
import inspect
import re
from pathlib import Path

from . import md, rst
from .source import class_comments, module_comments, paragraphs, relpath

PAGE = "reference/wire.md"
_ROUTE = re.compile(r"^(GET|POST)\s+(/\S+)\s+(.*)$")


def documented_routes() -> list[tuple[str, str, str]]:
    """(method, path, what it takes and answers) from the server module docstring's endpoint list."""
    from draftsmith.remote import server

    routes: list[list[str]] = []
    for para in paragraphs(server.__doc__):
        lines = para.splitlines()
        if not _ROUTE.match(lines[0].strip()):
            continue
        for line in lines:
            m = _ROUTE.match(line.strip())
            if m and not line.startswith(" "):
                routes.append([m.group(1), m.group(2), m.group(3)])
            elif routes:
                routes[-1][2] += " " + line.strip()
    return [tuple(r) for r in routes]  # type: ignore[misc]


def _handler_methods() -> dict[str, ast.FunctionDef]:
    from draftsmith.remote import server

    tree = ast.parse(Path(inspect.getsourcefile(server)).read_text())
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name in ("do_GET", "do_POST")}


def routes_in_code() -> list[tuple[str, str]]:
    """(method, path) of every path the request handler compares against (do_GET / do_POST)."""
    out = set()
    for name, fn in _handler_methods().items():
        for node in ast.walk(fn):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"/[a-z-]+", node.value):
                out.add((name[3:], node.value))
    return sorted(out)


def statuses() -> list[tuple[int, list[str]]]:
    """HTTP statuses the server code answers with, and the functions that answer them (AST of server.py
    and wire.py: ``_json(status, ...)``/``_send(status, ...)`` and ``FrameError(message, status)``)."""
    from draftsmith.remote import server, wire

    found: dict[int, set[str]] = {}

    def visit(node: ast.AST, fn: str) -> None:
        if isinstance(node, ast.FunctionDef):
            fn = node.name  # the innermost function answers
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in ("_json", "_send") and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, int):
                found.setdefault(node.args[0].value, set()).add(fn)
            elif name == "FrameError" and fn != "__init__":
                status = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else 400
                found.setdefault(status, set()).add(fn)
        for child in ast.iter_child_nodes(node):
            visit(child, fn)

    for module in (server, wire):
        visit(ast.parse(Path(inspect.getsourcefile(module)).read_text()), "")
    return [(s, sorted(found[s])) for s in sorted(found)]


def _constants(module, names) -> list[list[str]]:
    comments = module_comments(module)
    rows = []
    for name in names:
        value = getattr(module, name)
        shown = value.pattern if isinstance(value, re.Pattern) else value
        shown = sorted(shown) if isinstance(shown, (set, frozenset)) else shown
        rows.append([md.code(name), md.code(repr(shown) if isinstance(shown, bytes) else
                                            (shown if isinstance(shown, str) else repr(shown))),
                     md.prose(comments.get(name, ""))])
    return rows


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return str(n)


def render() -> str:
    from draftsmith.config import TargetConfig
    from draftsmith.remote import client, nccl, server, wire

    lines = md.header("Remote wire protocol", md.prose(
        "How a trainer with `target.engine: remote` talks to `draftsmith serve-target`: an HTTP control plane, "
        "a binary tensor frame (never pickle), and an optional NCCL/gloo data plane for the tensors. Read from "
        f"the docstrings and constants of `{relpath(server)}`, `{relpath(wire)}`, `{relpath(nccl)}` and "
        f"`{relpath(client)}`."))

    lines += ["## Control plane (HTTP)", ""]
    lines += rst.to_markdown("\n\n".join(p for p in paragraphs(server.__doc__)[:2] if not _ROUTE.match(p.strip())))
    lines += md.table(["Method", "Path", "Request and answer"],
                      [[m, md.code(p), md.prose(t)] for m, p, t in documented_routes()])
    rules = [p for p in paragraphs(server.__doc__) if p.startswith("Rules:")]
    lines += rst.to_markdown("\n\n".join(rules))
    lines += ["HTTP statuses in the server code, and the functions that answer them:", ""]
    lines += md.table(["Status", "Phrase", "Answered by"],
                      [[str(s), http.HTTPStatus(s).phrase, ", ".join(md.code(f) for f in fns)] for s, fns in statuses()])
    lines += ["Server limits:", ""]
    lines += md.table(["Constant", "Value", "Meaning"], _constants(server, ["MAX_VOCAB_MAPS", "MAX_CHANNELS", "MAX_PENDING"]))

    lines += ["## Auth", ""]
    auth = [s for p in rules for s in re.split(r"(?<=[.;])\s+", " ".join(p.split())) if re.search(r"token|loopback", s, re.I)]
    lines += [md.prose(" ".join(auth)), ""] if auth else []
    from draftsmith.cli import build_parser

    serve_target = build_parser()._subparsers._group_actions[0].choices["serve-target"]
    flags = [a for a in serve_target._actions if set(a.option_strings) & {"--host", "--auth-token-file", "--insecure"}]
    lines += md.table(["serve-target flag", "Default", "Meaning"],
                      [[", ".join(md.code(o) for o in a.option_strings), md.code(str(a.default)) if a.default else "",
                        md.prose(a.help or "")] for a in flags])
    lines += [md.prose("The trainer reads the token from the file `target.remote_auth_token_file` names (the "
                       "same file serve-target's `--auth-token-file` reads) and sends `Authorization: Bearer <token>` "
                       "with every request."), ""]

    lines += ["## Tensor frame", ""]
    lines += rst.to_markdown(wire.__doc__)
    lines += md.table(["Constant", "Value", "Meaning"], _constants(wire, ["MAGIC", "VERSION", "PREFIX_SIZE"]) + [
        [md.code("_PREFIX.format"), md.code(wire._PREFIX.format), md.prose(module_comments(wire).get("_PREFIX", ""))]])
    lines += ["Dtypes (the whitelist; any other is refused):", ""]
    lines += md.table(["Wire name", "torch dtype", "Bytes per element"],
                      [[md.code(n), md.code(str(dt)), str(size)] for n, (dt, size) in wire.DTYPES.items()])
    lines += [md.prose(f"Limits a decoder enforces before it allocates anything (`{wire.Limits.__name__}`; "
                       "serve-target sets `max_body` from `--max-body-mb`):"), ""]
    comments = class_comments(wire.Limits)
    lines += md.table(["Limit", "Default", "Meaning"],
                      [[md.code(f.name), f"{md.code(str(f.default))} ({_size(f.default)})" if f.default >= 1024 else
                        md.code(str(f.default)), md.prose(comments.get(f.name, ""))] for f in dataclasses.fields(wire.Limits)])
    lines += [md.prose(f"A frame that breaks any rule is a `{wire.FrameError.__name__}`: "
                       + " ".join(paragraphs(wire.FrameError.__doc__))), ""]

    lines += ["## Data plane (NCCL or gloo)", ""]
    lines += rst.to_markdown(nccl.__doc__)
    lines += md.table(["Constant", "Value", "Meaning"], _constants(nccl, ["PLANES", "BYTE_VIEW_DTYPES", "PROBE",
                                                                          "SESSION_RE", "JOINED_KEY"]))

    lines += ["## Client behaviour", ""]
    lines += rst.to_markdown(client.__doc__, skip=1)
    from .config_page import section_keys

    lines += ["The client's settings (the `target` section of the run config):", ""]
    lines += md.table(["Key", "Default", "Meaning"],
                      [[md.code(f"target.{r['key']}"), md.literal(r["default"]), md.prose(r["meaning"])]
                       for r in section_keys("target", TargetConfig) if r["key"].startswith(("remote_", "prefetch"))])
    return "\n".join(lines).rstrip("\n") + "\n"
