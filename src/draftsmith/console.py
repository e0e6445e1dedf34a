"""What the user's terminal shows, and where the engines' own output goes instead.

The in-process engines talk a lot: vLLM logs dozens of INFO/WARNING lines through its ``vllm``
logger (a handler vLLM points at ``sys.stdout`` when it is imported, unless
``VLLM_CONFIGURE_LOGGING=0``), its engine-core child processes and the C++/OpenMP runtimes write
straight to file descriptors 1 and 2, transformers logs through its own handler on ``sys.stderr``,
and torch/transformers raise FutureWarnings. Interleaved with a command's own progress that is
unreadable, so the long commands (``demo``, ``regenerate``, ``cache``) run inside
:func:`engine_logs`:

- fds 1 and 2 point at the log file (``os.dup2``), so C/C++ writes and every child process started
  inside (vLLM's engine core) land there; the terminal's own fds are kept as duplicates;
- ``sys.stdout`` / ``sys.stderr`` are text streams on the log file, so Python-level writes and
  handlers created inside (vLLM's, resolved from ``ext://sys.stdout`` at its import) land there too;
- logging handlers created before, on the old ``sys.stdout`` / ``sys.stderr``, are pointed at the
  log for the duration (vLLM or transformers imported earlier in the process);
- ``warnings.showwarning`` writes to the log (FutureWarning and friends).

The command's own lines go through :func:`say` and its bars (:class:`PhaseBar`) to the saved
terminal, so the terminal reads top to bottom: phases, bars, the summary. Outside
:func:`engine_logs` both are plain ``sys.stdout`` / ``sys.stderr``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TextIO

from tqdm import tqdm

ENGINE_LOG = "engine.log"  # the file name under a run dir (or a cache / regenerate --out dir)

_active: Optional[dict] = None  # the open engine_logs: its path and the terminal's streams


def engine_log_name() -> str:
    """``engine.log``, or ``engine.rank<r>.log`` on rank r > 0 of a torchrun job (each rank its own file)."""
    rank = os.environ.get("RANK", "0") if os.environ.get("WORLD_SIZE", "1") != "1" else "0"
    return ENGINE_LOG if rank == "0" else f"engine.rank{rank}.log"


def is_engine_log(name: str) -> bool:
    """True for a name :func:`engine_log_name` gives (``engine.log``, ``engine.rank<r>.log``): the files an
    output dir may hold beside what a command writes there."""
    return name.startswith("engine.") and name.endswith(".log")


def out() -> TextIO:
    """The terminal for the command's own lines (``sys.stdout`` outside :func:`engine_logs`)."""
    return _active["out"] if _active else sys.stdout


def bar_stream() -> TextIO:
    """The terminal for progress bars (``sys.stderr`` outside :func:`engine_logs`)."""
    return _active["err"] if _active else sys.stderr


def say(*parts: Any, sep: str = " ", end: str = "\n") -> None:
    """``print`` to the terminal, past any engine log redirect; flushed, so it orders with the bars."""
    print(*parts, sep=sep, end=end, file=out(), flush=True)


def log_path() -> Optional[Path]:
    """The open engine log, or None."""
    return _active["path"] if _active else None


@contextmanager
def engine_logs(path: str | os.PathLike) -> Iterator[Path]:
    """Send everything the engines print (see the module doc) to ``path`` (appended) while inside;
    :func:`say` and :class:`PhaseBar` still reach the terminal. Nested calls reuse the open log."""
    global _active
    if _active is not None:
        yield _active["path"]
        return
    path = Path(path)
    made = [d for d in [path.parent, *path.parent.parents] if not d.exists()]  # removed again if nothing is said
    path.parent.mkdir(parents=True, exist_ok=True)
    existed = path.exists()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    term_out = os.fdopen(saved[1], "w", buffering=1, encoding="utf-8", errors="replace")
    term_err = os.fdopen(saved[2], "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    log = open(path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115 (closed below)
    old_out, old_err, old_show = sys.stdout, sys.stderr, warnings.showwarning
    moved = _point_handlers({id(old_out), id(old_err), id(sys.__stdout__), id(sys.__stderr__)}, log)

    def show(message, category, filename, lineno, file=None, line=None):
        log.write(warnings.formatwarning(message, category, filename, lineno, line))

    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout = sys.stderr = log
    warnings.showwarning = show
    _active = {"path": path, "out": term_out, "err": term_err}
    failed = False
    try:
        yield path
    except BaseException:
        failed = True
        raise
    finally:
        _active = None
        log.flush()
        sys.stdout, sys.stderr, warnings.showwarning = old_out, old_err, old_show
        for handler, stream in moved:
            _set_stream(handler, stream)
        for stream in (term_out, term_err):
            stream.flush()
        os.dup2(term_out.fileno(), 1)
        os.dup2(term_err.fileno(), 2)
        term_out.close()
        term_err.close()
        # A handler made inside (vLLM imported during the phase) keeps the log: what it says later,
        # at shutdown too, stays out of the terminal. Otherwise the stream is done.
        if not any(getattr(h, "stream", None) is log for h in _handlers()):
            log.close()
            # a command refused before any engine started (bad input) leaves nothing behind
            if failed and not existed and path.stat().st_size == 0:
                path.unlink()
                for d in made:  # innermost first
                    if not any(d.iterdir()):
                        d.rmdir()


ENGINE_LOGGERS = ("vllm", "transformers")  # their handlers go to the log whatever stream they hold


def _handlers(names: tuple[str, ...] = ()) -> list[logging.Handler]:
    """Every logger's handlers, or with ``names`` those of the loggers named so or below them."""
    loggers = [("", logging.getLogger())] + [(n, lg) for n, lg in logging.Logger.manager.loggerDict.items()
                                             if isinstance(lg, logging.Logger)]
    return [h for n, lg in loggers if not names or any(n == m or n.startswith(m + ".") for m in names)
            for h in lg.handlers]


def _point_handlers(stream_ids: set[int], to: TextIO) -> list[tuple[logging.StreamHandler, Any]]:
    """Point every stream handler writing to one of ``stream_ids`` at ``to``, and every stream handler of
    the engines' loggers whatever its stream (a library keeps the sys.stderr of the moment it first logged,
    which may be an earlier wrapper's); [(handler, old stream)]."""
    moved, seen = [], set()
    engine = {id(h) for h in _handlers(ENGINE_LOGGERS)}
    for h in _handlers():
        if (id(h) in seen or not isinstance(h, logging.StreamHandler) or isinstance(h, logging.FileHandler)
                or not (id(getattr(h, "stream", None)) in stream_ids or id(h) in engine)):
            continue
        seen.add(id(h))
        try:
            moved.append((h, _set_stream(h, to)))
        except AttributeError:  # a handler whose stream is a property (logging's _StderrHandler): sys.stderr
            pass  # at each write, which is the log already
    return moved


def _set_stream(h: logging.StreamHandler, to: Any) -> Any:
    """``h.setStream(to)`` (the old stream), also for a handler whose stream is closed (a test's captured
    stdout, kept by a library imported under it), which cannot be flushed first. transformers binds its
    handler's flush to the sys.stderr of the moment it set logging up (``_default_handler.flush =
    sys.stderr.flush``); once that stream is closed every record fails to flush, so the handler is given
    back its own flush (of the stream it writes to)."""
    bound = h.__dict__.get("flush")
    if bound is not None and getattr(getattr(bound, "__self__", None), "closed", False):
        del h.flush
    try:
        return h.setStream(to)
    except ValueError:
        old, h.stream = h.stream, to
        return old


class PhaseBar(tqdm):
    """One phase's bar on the terminal (:func:`bar_stream`): a total fixed when the phase starts
    (the work it plans: conversations to answer, rows to cache, servers to start), the whole
    phase's average rate (smoothing 0: an ETA that does not swing with the last few items) and the
    ETA spelled out. ``clock`` replaces tqdm's ``time.time`` (tests)."""

    work_t: Optional[float] = None  # when the work itself began (work_started); class-level: tqdm's
    work_n = 0  # __init__ already draws the bar

    FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} {unit} [{elapsed} elapsed, ETA {eta}{postfix}]"

    def __init__(self, total: Optional[int] = None, *, clock: Optional[Callable[[], float]] = None, **kwargs):
        kwargs.setdefault("file", bar_stream())
        kwargs.setdefault("bar_format", self.FORMAT)
        kwargs.setdefault("smoothing", 0)
        super().__init__(total=total, **kwargs)
        if clock is not None:
            self._time = clock
            self.start_t = self.last_print_t = clock()

    @contextmanager
    def ticking(self, every: Optional[float] = None) -> Iterator[None]:
        """Redraw every ``every`` seconds while inside (default 1 s on a terminal, 10 s into a file or
        pipe): an engine that takes minutes to start shows a clock that moves, not a frozen bar."""
        if self.disable:
            yield
            return
        if every is None:
            every = 1.0 if getattr(self.fp, "isatty", lambda: False)() else 10.0
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(every):
                self.refresh()

        thread = threading.Thread(target=tick, name="PhaseBar.ticking", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def work_started(self) -> None:
        """The phase's set-up (an engine starting) is over: the ETA's rate counts from here, while
        the elapsed time shown stays the whole phase's."""
        if not self.disable:
            self.work_t, self.work_n = self._time(), self.n

    @property
    def format_dict(self):
        d = super().format_dict
        d["eta"] = self.eta_text(d)
        return d

    def eta_text(self, d: dict) -> str:
        """Seconds left at the phase's average rate, as tqdm formats intervals; ``?`` before any
        progress, ``00:00`` once done."""
        n, total = d["n"], d["total"]
        if self.work_t is None:
            elapsed, first = d["elapsed"], self.initial
        else:
            elapsed, first = self._time() - self.work_t, self.work_n
        if total is not None and n >= total:
            return "00:00"
        if total is None or n <= first or elapsed <= 0:
            return "?"
        return self.format_interval(max(0.0, (total - n) * elapsed / (n - first)))



class _Nowhere:
    """A text stream that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class Forwarding(tqdm):
    """A tqdm that draws nowhere and passes each ``update(n)`` to ``on_update``: what a library that
    takes a tqdm factory drives, counted on our own bar. ``vllm.LLM.generate(use_tqdm=factory)``
    reads its ``n``, ``format_dict`` and ``postfix`` (so a real tqdm) and also wraps its prompt
    rendering in the factory (an iterable: no update calls)."""

    def __init__(self, *args, on_update: Callable[[int], None], **kwargs):
        self.on_update = on_update
        super().__init__(*args, **{**kwargs, "file": _Nowhere()})

    def update(self, n=1):
        self.on_update(n)
        return super().update(n)
