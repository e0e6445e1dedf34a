"""train/malloc.py: CPU runs fix glibc's mmap threshold unless the user set glibc's own knob."""

import subprocess
import sys

import pytest

from draftsmith.train import malloc


def run(code: str, env: dict) -> str:
    # a fresh process: mallopt changes the whole process's allocator
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_fix_malloc_sets_the_threshold_and_leaves_a_users_choice():
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    code = "from draftsmith.train.malloc import fix_malloc; print(fix_malloc())"
    assert run(code, env) == "True"
    assert run(code, {**env, "MALLOC_MMAP_THRESHOLD_": "65536"}) == "False"
    assert run(code, {**env, "MALLOC_TRIM_THRESHOLD_": "65536"}) == "False"


def test_fix_malloc_without_mallopt_is_false(monkeypatch):
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)

    def no_libc(name):
        raise OSError(f"{name}: not found")

    monkeypatch.setattr(malloc.ctypes, "CDLL", no_libc)
    assert malloc.fix_malloc() is False
