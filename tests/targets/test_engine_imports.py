"""Importing draftsmith (and its trainer and engine modules) never imports vllm or sglang."""

import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).parents[2] / "src"


def run_clean(code: str) -> str:
    """Run ``code`` in a fresh interpreter that sees only draftsmith's sources; return its stdout."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_import_draftsmith_does_not_import_vllm_or_sglang():
    code = (
        "import sys\n"
        "import draftsmith, draftsmith.train, draftsmith.train.loop, draftsmith.config\n"
        "import draftsmith.targets, draftsmith.targets.runner, draftsmith.targets.vllm, draftsmith.targets.sglang\n"
        "import draftsmith.targets.cache, draftsmith.cache.build\n"
        "from draftsmith.targets import ENGINES\n"
        "assert {'hf', 'vllm', 'sglang', 'cache'} <= set(ENGINES)\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'sglang'))\n"
        "print('HEAVY', bad)\n"
    )
    out = run_clean(code)
    assert "HEAVY []" in out, out


def test_cache_store_imports_no_engine():
    code = (
        "import sys\n"
        "import draftsmith.cache.store\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('draftsmith.targets.', 'transformers', 'vllm'))\n"
        "           and m != 'draftsmith.targets.contract')\n"  # pure torch math (draftsmith.supervision)
        "print('ENGINES', bad)\n"
    )
    out = run_clean(code)
    assert "ENGINES []" in out, out
