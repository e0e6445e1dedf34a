"""docs/reference/cli.md: every command, subcommand and flag of the real parser
(``draftsmith.cli.build_parser()``), walked recursively through its subparsers."""

from __future__ import annotations

import argparse
from typing import Iterator

from . import md

PAGE = "reference/cli.md"
WIDTH = 10_000  # usage on one line, whatever the terminal (COLUMNS) says


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse._SubParsersAction]:
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, str]]:
    """(command words, parser, its one-line help) for ``parser`` and every subparser below it, depth first
    in the order they were added."""
    yield path, parser, ""
    for action in _subparsers(parser):
        helps = {a.dest: a.help or "" for a in action._choices_actions}
        for name, sub in action.choices.items():
            for words, p, h in walk(sub, path + (name,)):
                yield words, p, (helps.get(name, "") if words == path + (name,) else h)


def usage(parser: argparse.ArgumentParser) -> str:
    fmt = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    return "usage: " + " ".join(fmt.format_help().split())


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help or action.help == argparse.SUPPRESS:
        return ""
    return argparse.HelpFormatter(prog=parser.prog, width=WIDTH)._expand_help(action)


def _value(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """What the argument takes: nothing (a switch), its metavar, or its choices."""
    if action.nargs == 0:
        return ""
    fmt = argparse.HelpFormatter(prog=parser.prog, width=WIDTH)
    default = fmt._get_default_metavar_for_optional(action) if action.option_strings else \
        fmt._get_default_metavar_for_positional(action)
    text = fmt._format_args(action, default)
    if action.nargs == argparse.REMAINDER:
        text = "... (everything after it)"
    return md.code(text)


def _default(action: argparse.Action) -> str:
    if isinstance(action, (argparse._HelpAction, argparse._VersionAction)) or action.default == argparse.SUPPRESS:
        return ""
    if action.nargs == argparse.REMAINDER:
        return ""
    if action.required:
        return "required"
    if isinstance(action, argparse._StoreConstAction) and action.nargs == 0:
        return "off"
    if action.default is None or action.default == []:
        return ""
    return md.code(str(action.default))


def _name(action: argparse.Action) -> str:
    if action.option_strings:
        return ", ".join(md.code(s) for s in action.option_strings)
    return md.code(action.metavar or action.dest)


def arguments(parser: argparse.ArgumentParser) -> list[list[str]]:
    """One table row per argument (the subcommand choice and -h excluded)."""
    rows = []
    for a in parser._actions:
        if isinstance(a, (argparse._SubParsersAction, argparse._HelpAction)) or a.help == argparse.SUPPRESS:
            continue
        rows.append([_name(a), _value(parser, a), _default(a), md.prose(_help(parser, a))])
    return rows


def render() -> str:
    from draftsmith.cli import build_parser

    root = build_parser()
    lines = md.header("CLI", md.prose(
        f"Every command of `{root.prog}`, read from its argparse parser (`draftsmith.cli.build_parser`). Every "
        "command takes `-h`/`--help`. Bad input (config, data, checkpoint, target, engine) ends with one line "
        "`draftsmith: error: ...` on stderr and exit status 2; see the errors reference."))
    commands = list(walk(root))
    lines += ["## Commands", ""]
    lines += md.table(["Command", "What it does"],
                      [[f"[{md.code(' '.join((root.prog,) + w))}](#{md.anchor(' '.join((root.prog,) + w))})",
                        md.prose(h)] for w, p, h in commands if w])
    for words, parser, help_line in commands:
        title = " ".join((root.prog,) + words)
        lines += [f"## {title}" if words else f"## {root.prog}", ""]
        if parser.description or help_line:
            lines += [md.prose(parser.description or help_line), ""]
        lines += md.fenced(usage(parser))
        rows = arguments(parser)
        if rows:
            lines += md.table(["Argument", "Value", "Default", "Meaning"], rows)
        subs = _subparsers(parser)
        if subs:
            lines += ["Subcommands: " + ", ".join(
                f"[{md.code(n)}](#{md.anchor(title + ' ' + n)})" for s in subs for n in s.choices) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
