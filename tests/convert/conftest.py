import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Conversions are many small matmuls: one thread is faster than two on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
