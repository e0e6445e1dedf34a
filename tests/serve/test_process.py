"""ServerProcess: a child process group started, paused, resumed and always stopped (no engine:
Python's own http.server stands in for the HTTP server, with a SIGTERM handler as vLLM's has)."""

import subprocess
import sys

import pytest

from deadline import hang_guard, wait_until
from draftsmith.serve.process import ServerProcess, ServerStartError, free_port


def state(pid: int) -> str:
    """The process state letter from /proc/<pid>/stat ("T" = stopped)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_pause_stops_the_group_resume_continues_it_and_close_ends_a_paused_one(tmp_path):
    port = free_port()
    # a handled SIGTERM (uvicorn's graceful shutdown) waits while the process is stopped; an
    # unhandled one would kill it even then
    code = ("import http.server, signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(7)); "
            f"http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()")
    argv = [sys.executable, "-c", code]
    srv = ServerProcess(argv, port, tmp_path / "s.log", ready_s=30, health="/", stop_s=20).__enter__()
    pid = srv.proc.pid
    try:
        srv.pause()
        wait_until(lambda: state(pid) == "T", what="the paused group stopping")
        srv.resume()
        wait_until(lambda: state(pid) != "T", what="the resumed group continuing")
        srv.pause()
        wait_until(lambda: state(pid) == "T", what="the paused group stopping")
        with hang_guard(what="closing a paused group"):
            srv.close()
        # SIGTERM alone would wait for a SIGCONT until stop_s and end in SIGKILL (returncode -9)
        assert srv.proc.returncode == 7  # its SIGTERM handler ended it
    finally:
        srv.close()


def test_sigterm_inside_sigterm_exits_runs_the_cleanup(tmp_path):
    """A SIGTERM to a process inside ``sigterm_exits`` unwinds its ``finally`` clauses (where servers
    are stopped) and exits 143; outside it the old handler is back."""
    code = """
import os, signal, time
from draftsmith.serve.process import sigterm_exits
try:
    with sigterm_exits():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:
            print("cleanup ran", flush=True)
finally:
    print("default restored:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 143, res.stderr
    assert res.stdout.splitlines() == ["cleanup ran", "default restored: True"]


def test_a_server_whose_port_was_taken_meanwhile_starts_once_more_on_a_fresh_port(tmp_path):
    """free_port's port bound by someone else before the server binds it: the server exits with
    "Address already in use"; ServerProcess starts it again with a fresh ``--port`` and moves ``base``."""
    import socket
    import urllib.request

    code = ("import http.server, sys; port = int(sys.argv[sys.argv.index('--port') + 1]); "
            "http.server.HTTPServer(('127.0.0.1', port), http.server.SimpleHTTPRequestHandler).serve_forever()")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        argv = [sys.executable, "-c", code, "--port", str(taken)]
        with hang_guard(what="a server started twice"), \
                ServerProcess(argv, taken, tmp_path / "s.log", ready_s=30, health="/", stop_s=20) as srv:
            assert srv.port != taken and srv.argv[-1] == str(srv.port)
            assert srv.base == f"http://127.0.0.1:{srv.port}"
            with urllib.request.urlopen(srv.base + "/", timeout=10) as r:
                assert r.status == 200


def test_a_server_that_fails_for_another_reason_is_not_started_again(tmp_path):
    port = free_port()
    argv = [sys.executable, "-c", "import sys; print('bad flag'); sys.exit(3)", "--port", str(port)]
    srv = ServerProcess(argv, port, tmp_path / "s.log", ready_s=30, health="/", stop_s=20)
    with hang_guard(what="a failing server"), pytest.raises(ServerStartError) as e:
        srv.__enter__()
    assert "exited with 3" in str(e.value) and "bad flag" in str(e.value)
    assert srv.port == port
