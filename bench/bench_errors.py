"""Input errors of the benches: one line on stderr and exit status 2, as draftsmith's own commands give.

A bench raises :class:`BadInput` for a bad flag, file or data dir, anywhere below its ``main``; the
script's entry point runs ``sys.exit(run(main))``, which prints the message and returns 2. A failure
that is not the user's input (a peer's trainer exiting non-zero, a server that would not start) stays
a plain ``SystemExit(message)``: exit status 1. Outside :func:`run` (a test, another bench importing
the function) a BadInput is still a ``SystemExit`` carrying its message, so nothing is lost.
"""

from __future__ import annotations

import sys
from typing import Callable, Optional

USAGE = 2  # the status the CLI gives bad input (draftsmith/cli.py)


class BadInput(SystemExit):
    """``raise BadInput("data_curve: --rows 5000 is more than ...; pass ...")``: the message names the
    flag or file, the value and the fix."""


def run(main: Callable[[], Optional[int]]) -> int:
    """``main()``'s status, or :data:`USAGE` after printing a :class:`BadInput`'s message to stderr."""
    try:
        return main() or 0
    except BadInput as e:
        print(e, file=sys.stderr)
        return USAGE
