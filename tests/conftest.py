import os
import sys
from pathlib import Path

# tests/fixtures.py (tiny tokenizers and targets built in code) is importable as `fixtures`.
sys.path.insert(0, str(Path(__file__).parent))

# vLLM engines started by tests (vllm.LLM in a test's subprocess, the vllm feature engine) run inside
# their process instead of spawning an engine process: an engine start of ~2 s instead of ~20 s, and a
# process that opens several engines imports vLLM once. tests/integration/test_vllm_load.py keeps the
# spawned engine (the default users get) covered; a test that needs it sets the variable to "1".
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


import pytest  # noqa: E402


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs one worker per core, ``--dist loadfile``) each worker does
    its in-process torch work on one thread: N workers x the default N threads on N cores would spin
    against each other (the suite's tiny models run fastest on one thread anyway, see
    tests/integration/conftest.py); subprocesses (torchrun ranks, vLLM servers) keep their own settings."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)


def pytest_collection_modifyitems(session, config, items):
    """Files with engine tests (``vllm``) first, then those with ``slow`` ones, then the rest, each file's
    tests in their own order. pytest-xdist hands out whole files in this order (``--dist loadfile``), so
    the long ones start early and the short ones fill the gaps, instead of one worker finishing a
    six-minute file alone at the end (the longest-first rule of job scheduling). Every worker collects the
    same items and sorts them the same way, as xdist requires. Without xdist the order changes nothing."""
    rank: dict = {}
    for item in items:
        path = str(item.path)
        r = 0 if item.get_closest_marker("vllm") else 1 if item.get_closest_marker("slow") else 2
        rank[path] = min(rank.get(path, 2), r)
    # pytest collects a file's tests together and sort is stable: files keep their order within a rank
    items.sort(key=lambda item: rank[str(item.path)])


@pytest.fixture(scope="session")
def vllm_inproc(tmp_path_factory):
    """The session's one in-process vLLM host (tests/vllm_inproc.py): started on first use, so a run without
    serving tests never imports vLLM; the serving tests run their drafts in it one after the other."""
    from vllm_inproc import InProcessVLLM

    host = InProcessVLLM(tmp_path_factory.getbasetemp() / "vllm_inproc.log")
    yield host
    host.close()


@pytest.fixture(scope="module")
def restore_threads():
    """``train.num_threads: 1`` sets torch's global thread count; give the rest of the session its own
    back when the module ends (use with ``pytestmark = pytest.mark.usefixtures("restore_threads")``)."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(autouse=True)
def auto_device_is_cpu_outside_gpu_tests(request, monkeypatch):
    """``train.device: auto`` (and a command's ``--device auto``) means the CPU in tests not marked ``gpu``,
    so a GPU machine runs the CPU suite as CI does (bitwise resume checks and all); ``gpu`` tests and
    explicit devices are untouched."""
    if request.node.get_closest_marker("gpu") is not None:
        return
    import draftsmith.distributed as d

    real = d.resolve_device
    monkeypatch.setattr(d, "resolve_device", lambda spec, local_rank=0, **kw: real(
        "cpu" if str(spec).strip().lower() == "auto" else spec, local_rank, **kw))


@pytest.fixture
def real_auto(monkeypatch):
    """``auto`` resolved as on a real machine, for the tests that fake CUDA (``torch.cuda.is_available``)
    to check where ``auto`` lands; requested fixtures run after the autouse one above, so this wins."""
    import draftsmith.distributed as d

    monkeypatch.setattr(d, "resolve_device", _REAL_RESOLVE)


def _real_resolve():
    import draftsmith.distributed as d

    return d.resolve_device  # read at conftest import, before any test patched it


_REAL_RESOLVE = _real_resolve()


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two CUDA devices as far as device resolution can tell (placement tests on a CPU machine)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
