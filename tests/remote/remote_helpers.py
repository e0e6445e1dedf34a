"""Real `serve-target` processes on 127.0.0.1 for the remote tests (bounded waits, always killed)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from deadline import HANG_S

SRC = str(Path(__file__).resolve().parents[2] / "src")
AUX = [1, 3, 4]


class ServerProc:
    """`python -m draftsmith.remote.server` on a free (or given) loopback port."""

    def __init__(self, target, port: int = 0, extra=(), wait_s: float = 90.0, wait: bool = True):
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        # The target on the CPU (also on a GPU machine): the parity tests compare against a co-located
        # CPU target bit for bit. ``extra`` may say otherwise (the last --device wins).
        cmd = [sys.executable, "-m", "draftsmith.remote.server", "--target", str(target), "--host", "127.0.0.1",
               "--port", str(port), "--aux-layer-ids", *map(str, AUX), "--device", "cpu", *extra]
        self.target, self.extra, self.wait_s = target, list(extra), wait_s
        self.err = tempfile.TemporaryFile()  # a file, not a pipe: a chatty server can never block on it
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.err, env=env)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> "ServerProc":
        self.port = self._wait_ready(self.wait_s)
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def _wait_ready(self, wait_s: float) -> int:
        deadline, line = time.monotonic() + wait_s, b""
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if r:
                line = self.proc.stdout.readline()
                if line.startswith(b"READY "):
                    return int(line.split(b":")[-1])
            if self.proc.poll() is not None:
                break
        self.err.seek(0)
        err = self.err.read().decode(errors="replace")
        self.kill()
        raise RuntimeError(f"serve-target did not become ready in {wait_s} s: {line!r} {err[-2000:]}")

    def restart(self, wait: bool = True) -> "ServerProc":
        """A fresh process on the same port (after a kill); ``wait=False`` returns before it is ready."""
        self.kill()
        fresh = ServerProc(self.target, self.port, self.extra, self.wait_s, wait=False)
        self.proc, self.err = fresh.proc, fresh.err
        return self.wait_ready() if wait else self

    def get(self, path: str, headers=None) -> dict:
        # urllib would honour ambient proxies; an empty ProxyHandler keeps test probes direct.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(urllib.request.Request(self.url + path, headers=headers or {}), timeout=HANG_S) as r:
            return json.loads(r.read())

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def kill9(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=HANG_S)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc.stdout.close()


def start_servers(target, n: int, extra=()) -> list:
    """Start ``n`` servers in parallel (each loads the target: a few seconds) and wait for all."""
    procs = []
    try:
        procs = [ServerProc(target, extra=extra, wait=False) for _ in range(n)]
        return [p.wait_ready() for p in procs]
    except BaseException:
        for p in procs:
            p.kill()
        raise
