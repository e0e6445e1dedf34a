"""An HTTP server command run as a child process group: wait (bounded) for its health URL, always
stop the whole group. Used by the integration tests and the serving/evaluation benchmarks, which
start real vLLM servers; the group matters because vLLM's engine core runs in child processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional, Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def sigterm_exits() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit(143) instead of ending Python on the spot, so the
    ``with`` blocks and ``finally`` clauses around it stop (and continue, if paused) the servers this
    process started; without it a ``timeout`` or a job scheduler's SIGTERM leaves them running, or
    stopped for good. Outside the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def exit_(signum, _frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, exit_)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


class ServerStartError(RuntimeError):
    """A vLLM / SGLang server that ``check`` or ``advise`` started exited, or did not answer its health URL
    in time; the message ends with the tail of its log. Fix: read that log (a missing engine, too little
    memory, a bad flag), or allow more time (``--ready-timeout``)."""


class ServerProcess:
    """``with ServerProcess(argv, port, log) as s:`` starts ``argv``, waits for ``s.base + health``.

    On exit (or a failed start) the process group gets SIGTERM, then SIGKILL after ``stop_s``.
    """

    def __init__(self, argv: Sequence[str], port: int, log: Path, *, env: Optional[dict] = None,
                 ready_s: float = 300.0, health: str = "/health", stop_s: float = 30.0):
        self.argv, self.port, self.log = list(argv), port, Path(log)
        self.env = {**os.environ, **(env or {})}
        self.ready_s, self.health, self.stop_s = ready_s, health, stop_s
        self.base = f"http://127.0.0.1:{port}"
        self.proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "ServerProcess":
        """Start and wait for health. ``free_port`` only says a port was free when it asked: another
        process (a second server starting beside this one picks its internal ports the same way) can
        bind it before this server does. A server that exits saying so is started once more on a fresh
        port (``--port`` in argv and :attr:`base` follow), so callers read :attr:`base` after entering."""
        try:
            return self._start()
        except ServerStartError as e:
            if not (self._port_taken(str(e)) and "--port" in self.argv[:-1]):
                raise
        fresh = free_port()
        i = self.argv.index("--port")
        self.argv[i + 1], self.port, self.base = str(fresh), fresh, f"http://127.0.0.1:{fresh}"
        return self._start()

    @staticmethod
    def _port_taken(message: str) -> bool:
        return "exited with" in message and ("Address already in use" in message or "Errno 98" in message)

    def _start(self) -> "ServerProcess":
        with open(self.log, "w") as fh:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                         start_new_session=True)
        deadline = time.monotonic() + self.ready_s
        while True:
            if self.proc.poll() is not None:
                self.close()
                raise ServerStartError(f"{self.argv[:3]} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base + self.health, timeout=5) as r:
                    if r.status == 200:
                        return self
            except (OSError, urllib.error.HTTPError):
                pass
            if time.monotonic() > deadline:
                self.close()
                raise ServerStartError(f"{self.argv[:3]} not healthy within {self.ready_s:.0f} s:\n{self.log_tail()}")
            time.sleep(1.0)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def pause(self) -> None:
        """Stop the whole group (SIGSTOP): it takes no CPU until :meth:`resume`."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a group :meth:`pause` stopped (SIGCONT; harmless on a running one)."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:  # exited between the poll and the signal
                pass

    def close(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:  # a paused group acts on SIGTERM only once continued
                os.killpg(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=self.stop_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=self.stop_s)
        try:  # engine-core children share the group and may outlive the parent
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __exit__(self, *exc) -> None:
        self.close()
