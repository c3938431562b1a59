import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    # Math checks run in float64 where the test asks for it; keep the default at float32.
    torch.set_default_dtype(torch.float32)
