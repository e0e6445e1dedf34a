import sys
from pathlib import Path

# tests/fixtures.py (tiny tokenizers and targets built in code) is importable as `fixtures`.
sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def restore_threads():
    """``train.num_threads: 1`` sets torch's global thread count; give the rest of the session its own
    back when the module ends (use with ``pytestmark = pytest.mark.usefixtures("restore_threads")``)."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)
