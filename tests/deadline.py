"""Hang guards for tests: deadlines of minutes that turn a hang into a failure, never a speed bound.

A test asserts behaviour (the failover happened, the error was raised, the group closed); how fast
is a bench's question (bench/remote_failover.py, bench/advise_agreement.py), since a shared 2-core
machine misses any bound of seconds on a bad day."""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Callable, Iterator, TypeVar

HANG_S = 300.0  # long enough to mean "hangs" on the slowest machine we run on

T = TypeVar("T")


@contextlib.contextmanager
def hang_guard(seconds: float = HANG_S, what: str = "the block") -> Iterator[None]:
    """Raise ``TimeoutError`` in the main thread if the block is still running after ``seconds``
    (SIGALRM, so it also interrupts a blocking socket call)."""

    def fire(signum, frame):
        raise TimeoutError(f"{what} hung: still running after {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def wait_until(pred: Callable[[], T], seconds: float = HANG_S, every: float = 0.01, what: str = "the condition") -> T:
    """Poll ``pred`` until it returns something truthy (returned); fail only when it never does."""
    deadline = time.monotonic() + seconds
    while not (got := pred()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached after {seconds:.0f} s (a hang guard)")
        time.sleep(every)
    return got
