import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The in-process work of these tests (the HF greedy references, training a tiny draft, the offline
    evaluator) on one torch thread: tiny models run fastest so, and on a 2-core machine where a vLLM
    server or another job holds a core, two threads spin against each other (hf_greedy of 4 prompts:
    25 s on two threads beside another job, 0.8 s on one). The servers are subprocesses: untouched."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
