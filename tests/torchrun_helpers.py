"""Launch ``torchrun -m draftsmith ...`` from tests (CPU, gloo) and compare output dirs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from deadline import HANG_S
from fixtures import artifacts

SRC = str(Path(__file__).resolve().parents[1] / "src")


def env() -> dict:
    # PYTHONFAULTHANDLER: a worker that gets SIGABRT (run_job on a hang) prints every thread's stack
    return {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONFAULTHANDLER": "1"}


def run_job(cmd: list[str], env: dict, timeout: float = HANG_S, merge: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` for a torchrun job (``merge``: stderr into
    stdout), with a hang guard that says where it hung: past ``timeout`` every child of the launcher
    gets SIGABRT, which (under PYTHONFAULTHANDLER=1, as :func:`env` sets) prints each worker's Python
    stacks; the failure carries them."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                            env=env, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        workers = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        for pid in workers:
            try:
                os.kill(int(pid), signal.SIGABRT)
            except ProcessLookupError:
                pass
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"hung: {' '.join(map(str, cmd))} still running after {timeout:.0f} s; its workers "
                             f"{workers} were sent SIGABRT, their stacks:\n{(out or '')[-8000:]}\n{(err or '')[-8000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def launcher(nproc: int) -> list[str]:
    """``torchrun --standalone --nproc-per-node N`` as an argv: ``--standalone`` takes a free rendezvous
    port, so two tests (or two sessions) never collide on 29500; a 0.1 s monitor notices a dead rank fast."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "--monitor-interval=0.1"]


def torchrun(nproc: int, *args) -> list[str]:
    """``torchrun ... -m draftsmith ARGS``."""
    return launcher(nproc) + ["-m", "draftsmith", *map(str, args)]


def one_process(*args) -> list[str]:
    return [sys.executable, "-m", "draftsmith", *map(str, args)]


def worker_pid(launcher_pid: int, rank: int, timeout_s: float = HANG_S) -> int:
    """The pid of torchrun's worker ``rank``: a child of the launcher whose environment has RANK=rank."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit() and _is_worker(proc, launcher_pid, rank):
                return int(proc.name)
        time.sleep(0.05)
    raise AssertionError(f"torchrun pid {launcher_pid} has no worker of rank {rank} after {timeout_s} s")


def _is_worker(proc: Path, launcher_pid: int, rank: int) -> bool:
    try:
        status = (proc / "status").read_text()
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid != launcher_pid:
            return False
        environ = dict(item.split(b"=", 1) for item in (proc / "environ").read_bytes().split(b"\0") if b"=" in item)
    except (OSError, StopIteration, ValueError):  # the process ended while we looked
        return False
    return environ.get(b"RANK") == str(rank).encode()


def files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in artifacts(d)}


def assert_same_dirs(got: Path, want: Path) -> None:
    """Same file names (no temporaries left) and the same bytes, file by file."""
    a, b = files(got), files(want)
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for name in b:
        assert a[name] == b[name], f"{got / name} differs from {want / name}"
