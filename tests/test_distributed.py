"""distributed.shutdown bounds torch's destroy_process_group (which can hang after the last collective,
pytorch#75097), and the CLI then ends the process with the command's exit code. Each case runs in a
subprocess: a process group joined inside a pytest worker would outlive the test."""

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")

JOIN = """
import sys, threading
import torch.distributed as dist
from draftsmith import distributed
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
"""


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})


def test_a_stuck_destroy_is_left_after_the_wait_with_one_line(tmp_path):
    out = python(JOIN + """
stuck = threading.Event()
dist.destroy_process_group = lambda: stuck.wait()  # torch's hang, made certain
distributed.shutdown(wait_s=0.5)
print("left_hanging", distributed.left_hanging())
""", str(tmp_path / "store"))
    assert out.returncode == 0, out.stderr
    assert "left_hanging True" in out.stdout
    assert ("draftsmith: rank 0: leaving the process group did not finish in 0.5 s (torch's destroy_process_group "
            "hang, pytorch#75097)") in out.stderr


def test_a_destroy_that_returns_leaves_the_group(tmp_path):
    out = python(JOIN + """
distributed.shutdown(wait_s=60)
print("left_hanging", distributed.left_hanging(), "initialized", dist.is_initialized())
distributed.shutdown()  # a second call: nothing to leave
""", str(tmp_path / "store"))
    assert out.returncode == 0, out.stderr
    assert "left_hanging False initialized False" in out.stdout
    assert "did not finish" not in out.stderr


def test_cli_ends_at_once_with_the_command_code_only_when_the_group_was_left_hanging():
    script = """
import atexit, sys
atexit.register(lambda: print("atexit ran", flush=True))
from draftsmith import distributed
distributed._left_hanging = sys.argv[1] == "stuck"
from draftsmith.cli import main
code = main(["train", "--nproc", "0"])  # a command that returns 2
print("main returned", code, flush=True)
"""
    stuck = python(script, "stuck")
    assert stuck.returncode == 2 and "--nproc 0: expected >= 1" in stuck.stderr
    assert "main returned" not in stuck.stdout and "atexit ran" not in stuck.stdout  # os._exit: no teardown
    fine = python(script, "fine")
    assert fine.returncode == 0 and "main returned 2" in fine.stdout and "atexit ran" in fine.stdout
