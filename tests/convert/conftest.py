import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Conversions are many small matmuls: one thread (tests/conftest.py's one_thread)."""
    yield
