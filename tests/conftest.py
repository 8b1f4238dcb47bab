import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use one torch thread: quicker on a shared 2-core machine, and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
